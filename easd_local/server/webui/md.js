// Markdown and maths for a finished reply, drawn over its token spans so that every piece of
// text keeps the origin colour and details of the token it came from.
//
// Why our own small renderer and not a library's HTML: a library hands back a string of HTML
// whose characters no longer map to tokens, and setting it as HTML would let the model's text
// inject markup. Here the reply is parsed into blocks and inline runs that remember where in
// the text they came from; every run is written with textContent, split at token boundaries,
// each piece a clone of its token's span. Formulas go to KaTeX (vendored from npm, its DOM
// output: no inline HTML, so the page's CSP holds) and their tokens follow as a strip of empty
// spans under the formula. The subset is what chat models write: headings, paragraphs, lists, tables,
// fenced code, rules, **strong**, *em*, `code`, \( \), \[ \], $ $ and $$ $$.
"use strict";
window.easdMarkdown = (() => {
  // ------------------------------------------------------------ parsing (offsets into src)
  // a node: {tag, kids} | {text: [a, b]} | {math: tex, display, range: [a, b]}
  function blocks(src) {
    const lines = [];
    for (let at = 0; at <= src.length;) {
      const nl = src.indexOf("\n", at);
      const end = nl < 0 ? src.length : nl;
      lines.push({ a: at, b: end, s: src.slice(at, end) });
      if (nl < 0) break;
      at = nl + 1;
    }
    const out = [];
    let i = 0;
    const isBreak = (s) => /^\s*$/.test(s) || /^\s*\|/.test(s) || /^\s*(```|~~~|#{1,6}\s|([-*+]|\d{1,3}[.)])\s|\\\[|\$\$)/.test(s)
      || /^\s*([-*_])(\s*\1){2,}\s*$/.test(s);
    while (i < lines.length) {
      const L = lines[i];
      const s = L.s;
      let m;
      if (/^\s*$/.test(s)) { i++; continue; }
      if ((m = /^\s*(```|~~~)/.exec(s))) {
        let j = i + 1;
        while (j < lines.length && !lines[j].s.trimStart().startsWith(m[1])) j++;
        const body = j > i + 1 ? [lines[i + 1].a, lines[j - 1].b] : [L.b, L.b];
        out.push({ tag: "pre", kids: [{ tag: "code", kids: [{ text: body }] }] });
        i = j + 1;
        continue;
      }
      if ((m = /^\s*(\\\[|\$\$)/.exec(s))) {
        const close = m[1] === "$$" ? "$$" : "\\]";
        const open = L.a + m.index + m[0].length;
        const end = src.indexOf(close, open);
        if (end >= 0) {
          const stop = end + close.length;
          out.push({ math: src.slice(open, end), display: true, range: [L.a, stop] });
          const rest = src.slice(stop, src.indexOf("\n", stop) < 0 ? src.length : src.indexOf("\n", stop));
          while (i < lines.length && lines[i].b < stop) i++;
          if (rest.trim()) out.push({ tag: "p", kids: inline(src, stop, lines[i].b) });
          i++;
          continue;
        }
      }
      if ((m = /^(#{1,6})\s+/.exec(s))) {
        out.push({ tag: "h" + Math.min(m[1].length + 2, 6), kids: inline(src, L.a + m[0].length, L.b) });
        i++;
        continue;
      }
      if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(s)) { out.push({ tag: "hr", kids: [] }); i++; continue; }
      if (/^\s*\|/.test(s) && i + 1 < lines.length && /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/.test(lines[i + 1].s)) {
        // a table: a header row, the |---| line, then rows while lines start with |
        const table = { tag: "table", kids: [{ tag: "thead", kids: [row(src, L, "th")] }, { tag: "tbody", kids: [] }] };
        i += 2;
        while (i < lines.length && /^\s*\|/.test(lines[i].s)) table.kids[1].kids.push(row(src, lines[i++], "td"));
        out.push(table);
        continue;
      }
      if ((m = /^\s*([-*+]|\d{1,3}[.)])\s+/.exec(s))) {
        const ordered = /\d/.test(m[1]);
        const list = { tag: ordered ? "ol" : "ul", kids: [] };
        while (i < lines.length && (m = /^\s*([-*+]|\d{1,3}[.)])\s+/.exec(lines[i].s)) && /\d/.test(m[1]) === ordered) {
          const start = lines[i].a + m[0].length;
          let b = lines[i].b;
          // lines indented under an item, up to a blank line, continue it
          while (i + 1 < lines.length && /^\s{2,}\S/.test(lines[i + 1].s) && !isBreak(lines[i + 1].s)) b = lines[++i].b;
          list.kids.push({ tag: "li", kids: inline(src, start, b) });
          i++;
        }
        out.push(list);
        continue;
      }
      let j = i;
      while (j + 1 < lines.length && !isBreak(lines[j + 1].s)) j++;
      out.push({ tag: "p", kids: inline(src, L.a, lines[j].b) });
      i = j + 1;
    }
    return out;
  }

  // one table row: its cells between unescaped pipes (a leading and a trailing pipe only
  // open and close the row)
  function row(src, L, cell) {
    let a = L.a, b = L.b;
    while (a < b && /\s/.test(src[a])) a++;
    while (b > a && /\s/.test(src[b - 1])) b--;
    if (src[a] === "|") a++;
    if (b > a && src[b - 1] === "|" && src[b - 2] !== "\\") b--;
    const cells = [];
    let from = a;
    for (let k = a; k <= b; k++) {
      if (k < b && src[k] === "\\") { k++; continue; }
      if (k === b || src[k] === "|") { cells.push({ tag: cell, kids: inline(src, from, k) }); from = k + 1; }
    }
    return { tag: "tr", kids: cells };
  }

  const MATH_PAIRS = [["\\(", "\\)", false], ["\\[", "\\]", true], ["$$", "$$", true]];

  function inline(src, a, b) {
    const out = [];
    let run = a;
    const flush = (to) => { if (to > run) out.push({ text: [run, to] }); };
    let i = a;
    while (i < b) {
      const c = src[i];
      let done = false;
      for (const [open, close, display] of MATH_PAIRS) {
        if (src.startsWith(open, i)) {
          const end = src.indexOf(close, i + open.length);
          if (end >= 0 && end + close.length <= b && end > i + open.length) {
            flush(i);
            out.push({ math: src.slice(i + open.length, end), display, range: [i, end + close.length] });
            i = run = end + close.length;
            done = true;
          }
          break;
        }
      }
      if (done) continue;
      if (c === "$" && src[i + 1] !== "$" && /\S/.test(src[i + 1] || " ")) {
        // $x$ as pandoc reads it: no space inside the dollars, no digit right after the closing one
        const end = src.indexOf("$", i + 1);
        if (end > 0 && end < b && /\S/.test(src[end - 1]) && !/\d/.test(src[end + 1] || "") && !src.slice(i, end).includes("\n")) {
          flush(i);
          out.push({ math: src.slice(i + 1, end), display: false, range: [i, end + 1] });
          i = run = end + 1;
          continue;
        }
      }
      if (c === "\\" && i + 1 < b && /[\\`*_{}\[\]()#+\-.!$|<>~]/.test(src[i + 1])) {
        flush(i);
        out.push({ text: [i + 1, i + 2] });
        i = run = i + 2;
        continue;
      }
      if (c === "`") {
        const end = src.indexOf("`", i + 1);
        if (end > i + 1 && end < b) {
          flush(i);
          out.push({ tag: "code", kids: [{ text: [i + 1, end] }] });
          i = run = end + 1;
          continue;
        }
      }
      if ((c === "*" || c === "_") && /\S/.test(src[i + (src[i + 1] === c ? 2 : 1)] || " ")) {
        const mark = src[i + 1] === c ? c + c : c;
        const end = closing(src, mark, i + mark.length, b);
        if (end > 0 && (c === "*" || !/\w/.test(src[i - 1] || ""))) {
          flush(i);
          out.push({ tag: mark.length === 2 ? "strong" : "em", kids: inline(src, i + mark.length, end) });
          i = run = end + mark.length;
          continue;
        }
      }
      i++;
    }
    flush(b);
    return out;
  }

  // where ``mark`` closes an emphasis opened before ``from``: not after a space, not inside a
  // longer run of the same character
  function closing(src, mark, from, b) {
    for (let k = src.indexOf(mark, from); k >= 0 && k + mark.length <= b; k = src.indexOf(mark, k + 1)) {
      if (k > from && /\S/.test(src[k - 1]) && src[k + mark.length] !== mark[0] && src[k - 1] !== mark[0]) return k;
    }
    return -1;
  }

  // ------------------------------------------------------------ drawing over the tokens
  function drawer(spans) {
    const starts = [];
    let n = 0;
    for (const s of spans) { starts.push(n); n += s ? s.textContent.length : 0; }
    const first = (at) => { // the last token starting at or before ``at``
      let lo = 0, hi = starts.length - 1;
      while (lo < hi) { const mid = (lo + hi + 1) >> 1; if (starts[mid] <= at) lo = mid; else hi = mid - 1; }
      return lo;
    };
    const piece = (k, text) => {
      const s = spans[k].cloneNode(false);
      s.classList.remove("active");
      s.textContent = text;
      return s;
    };
    // the tokens over [a, b), each as a piece of its own text
    function text(src, a, b, into) {
      for (let k = first(a); k < spans.length && starts[k] < b; k++) {
        if (!spans[k]) continue;
        const from = Math.max(a, starts[k]), to = Math.min(b, starts[k] + spans[k].textContent.length);
        if (to > from) into.append(piece(k, src.slice(from, to)));
      }
    }
    // one empty piece per token of [a, b): the formula's tokens, under it
    function strip(src, a, b) {
      const row = document.createElement("span");
      row.className = "math-tokens";
      for (let k = first(a); k < spans.length && starts[k] < b; k++) {
        if (!spans[k] || !spans[k].textContent) continue;
        const p = piece(k, "");
        p.dataset.text = spans[k].textContent;
        p.setAttribute("aria-label", `${p.title}: ${spans[k].textContent}`);
        row.append(p);
      }
      return row;
    }
    return { text, strip };
  }

  function draw(nodes, src, d, into) {
    for (const node of nodes) {
      if (node.text) {
        d.text(src, node.text[0], node.text[1], into);
      } else if (node.math !== undefined) {
        const box = document.createElement("span");
        box.className = node.display ? "math math-display" : "math";
        const f = document.createElement("span");
        try {
          // maxSize (em): a \rule or \kern the model sized at 9999em stays within a screen;
          // strict "ignore": what is not plain LaTeX (Unicode in maths, say) draws without a console warning;
          // throwOnError: KaTeX's own error element sets a style attribute, which the CSP refuses
          window.katex.render(node.math, f, { displayMode: node.display, throwOnError: true, output: "htmlAndMathml",
                                              maxSize: 20, strict: "ignore" });
        } catch (e) { // no KaTeX, or a formula it cannot take: the source, as written
          f.textContent = src.slice(node.range[0], node.range[1]);
          if (window.katex && e instanceof window.katex.ParseError) {
            f.className = "math-error";
            f.title = e.message;
          }
        }
        box.append(f, d.strip(src, node.range[0], node.range[1]));
        into.append(box);
      } else {
        const el = document.createElement(node.tag);
        draw(node.kids, src, d, el);
        into.append(el);
      }
    }
  }

  // render ``spans`` (a reply's token spans, in order) into ``into``, replacing its content
  function render(spans, into) {
    const src = spans.map((s) => (s ? s.textContent : "")).join("");
    const out = document.createElement("div");
    out.className = "md";
    draw(blocks(src), src, drawer(spans), out);
    into.textContent = "";
    into.append(out);
  }

  return { render, blocks };
})();
