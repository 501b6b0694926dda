// easd-local chat page: talks to this server's OpenAI endpoints and colours every token by
// who chose it, from the stream's `easd_tokens` extension (one record per token part:
// i, text, origin, h_draft, h_target, overlap). No framework, no build step, nothing loaded
// from elsewhere.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const ORIGIN_TEXT = {
    "draft": ["draft-accepted", "the draft proposed it, the target's check accepted it"],
    "target": ["target", "(no mark) the target chose it itself: the draft was not asked, or the gate stayed shut"],
    "resampled": ["resampled", "the target overruled the draft (SD rejection) and picked again"],
    "easd": ["gate fire", "both models unsure and agreeing: the EASD gate fired, the target picked again without the draft's token"],
    "bonus": ["bonus", "all drafted tokens kept: the target's next token came free"],
    "draft-only": ["draft alone", "draft mode: the draft chose it, nothing checked it"],
    "lookup": ["prompt lookup", "drafted by looking up earlier text (the prompt, the reply so far; no draft model), accepted by the target's check"],
  };
  // which `timings` field counts each origin (draft-only has none: it is every token in draft mode)
  const COUNT_FIELD = { draft: "draft_n_accepted", target: "target_tokens", resampled: "sd_rejections",
                        easd: "gate_fires", bonus: "bonus" };
  const SETTINGS = ["temperature", "max_tokens", "gamma", "tau_draft", "tau_target", "top_n", "overlap", "penalty"];
  const THRESHOLDS = ["tau_draft", "tau_target", "top_n", "overlap", "penalty"];

  // views: the chat's finished replies, drawn as Markdown and maths or as plain tokens (the switch)
  const state = { key: sessionStorage.getItem("easd-local-key"), props: null, history: [], running: null, views: [] };

  // ---------------------------------------------------------------- the server
  function headers() {
    const h = { "Content-Type": "application/json" };
    if (state.key) h.Authorization = "Bearer " + state.key;
    return h;
  }

  async function errorText(r) {
    try {
      const body = await r.json();
      if (body && body.error && body.error.message) return body.error.message;
    } catch (_) { /* not JSON */ }
    return `HTTP ${r.status}`;
  }

  // fetch with the key; a 401 asks for the key and tries again (at once where another request's
  // prompt got a new key while this one was on its way)
  async function call(path, init = {}) {
    for (;;) {
      const sent = state.key;
      const r = await fetch(path, { ...init, headers: headers() });
      if (r.status !== 401) return r;
      if (state.key !== sent) continue;
      await askKey(state.key ? "That key was refused: " + (await errorText(r)) : "");
    }
  }

  // Esc closes the dialog without a key: the request fails with NO_KEY (else it would wait forever)
  const NO_KEY = "this server needs its API key (it was started with --api-key), and none was given";

  // requests refused together (side by side's two) wait for one prompt: a second prompt took
  // over the dialog's handlers, and the first request waited forever
  let asking = null;
  function askKey(message) {
    if (!asking) asking = promptKey(message).finally(() => { asking = null; });
    return asking;
  }

  function promptKey(message) {
    const dlg = $("key-dialog");
    $("key-error").textContent = message;
    $("key-input").value = "";
    return new Promise((resolve, reject) => {
      let given = false;
      $("key-form").onsubmit = (ev) => {
        ev.preventDefault();
        const key = $("key-input").value.trim();
        if (!key) return;
        state.key = key;
        sessionStorage.setItem("easd-local-key", key);
        given = true;
        dlg.close();
        resolve();
      };
      dlg.onclose = () => { if (!given) reject(Object.assign(new Error(NO_KEY), { noKey: true })); };
      if (!dlg.open) dlg.showModal();
      $("key-input").focus();
    });
  }

  async function loadProps() {
    for (;;) {
      let wait = 1000;
      try {
        const r = await call("/props");
        if (r.ok) return await r.json();
        const msg = await errorText(r);
        $("server-line").textContent = r.status === 503 && /loading/.test(msg) ? "models loading…" : msg;
        if (r.status !== 503) wait = 3000;
      } catch (e) {
        $("server-line").textContent = e.noKey ? e.message : "cannot reach the server: " + e.message;
        wait = 3000;
      }
      await new Promise((res) => setTimeout(res, wait));
    }
  }

  // POST a streamed chat completion and feed its chunks to `view`; the final timings
  // (a browser's own words for a lost connection, "Failed to fetch" or "network error", say
  // neither what failed nor when: a TypeError is one of those)
  async function stream(body, view, signal) {
    const lost = (what) => (e) => { throw e instanceof TypeError && !signal.aborted ? new Error(`${what} (${e.message})`) : e; };
    const r = await call("/v1/chat/completions",
                         { method: "POST", body: JSON.stringify({ ...body, stream: true }), signal })
      .catch(lost("cannot reach the server"));
    if (!r.ok) throw new Error(await errorText(r));
    const reader = r.body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read().catch(lost("the connection to the server was lost before the reply ended"));
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let nl;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl).replace(/\r$/, "");
        buf = buf.slice(nl + 1);
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return view.timings;
        const obj = JSON.parse(data);
        if (obj.error) throw new Error(obj.error.message);
        onChunk(obj, view);
      }
      keepInView();
    }
    if (!view.timings) throw new Error("the stream ended early");
    return view.timings;
  }

  function onChunk(obj, view) {
    if (obj.easd_tokens) {
      for (const rec of obj.easd_tokens) addToken(view, rec);
    } else if (obj.choices && obj.choices[0] && obj.choices[0].delta && obj.choices[0].delta.content) {
      view.body.append(obj.choices[0].delta.content); // a server without the extension
    }
    if (obj.timings) view.timings = obj.timings;
  }

  // ---------------------------------------------------------------- following a reply
  // as llama-server's and LM Studio's pages do: while the reader is at the end of the view, the
  // newest text stays in view; scrolling up stops that, coming back down to the end starts it again
  const follow = { on: true, lastY: window.scrollY };
  const NEAR = 40; // px: a reader this close to the end is at it

  // how far the end of the view shown (the chat and its message box, or side by side's replies)
  // is below the window's bottom: the legend and settings may come after it on a phone
  function belowView() {
    const view = $("view-chat").hidden ? $("view-compare") : $("view-chat");
    return view.getBoundingClientRect().bottom - window.innerHeight;
  }

  function onScroll() {
    const y = window.scrollY;
    if (belowView() <= NEAR) follow.on = true;
    else if (y < follow.lastY) follow.on = false;
    follow.lastY = y;
  }

  function keepInView() {
    const d = belowView();
    if (follow.on && d > 0) window.scrollBy({ top: d, behavior: "instant" });
  }

  function startFollowing() {
    follow.on = true;
    keepInView();
  }

  // ---------------------------------------------------------------- replies
  function newView(container) {
    const body = document.createElement("div");
    body.className = "reply";
    body.tabIndex = 0;
    body.setAttribute("role", "group");
    body.setAttribute("aria-label", "reply; arrow keys move between its tokens");
    const stats = document.createElement("p");
    stats.className = "stats";
    container.append(body, stats);
    return { container, body, stats, spans: [], timings: null };
  }

  function addToken(view, rec) {
    let span = view.spans[rec.i];
    if (!span) {
      span = document.createElement("span");
      span.className = "tok o-" + rec.origin;
      span.dataset.i = rec.i;
      span.dataset.origin = rec.origin;
      for (const k of ["h_draft", "h_target", "overlap"]) if (rec[k] !== null && rec[k] !== undefined) span.dataset[k] = rec[k];
      span.title = ORIGIN_TEXT[rec.origin] ? ORIGIN_TEXT[rec.origin][0] : rec.origin;
      view.spans[rec.i] = span;
      view.body.append(span);
    }
    if (rec.text) span.append(rec.text);
  }

  const fmt = (x, d) => (x === null || x === undefined || Number.isNaN(x) ? "—" : Number(x).toFixed(d));

  function modeRow(name) {
    return (state.props.modes.find((m) => m.name === name)) || { name, gated: false, speculative: false };
  }

  function statsLine(t) {
    const m = modeRow(t.mode);
    const parts = [`${t.predicted_n} tokens`, `${fmt(t.predicted_per_second, 1)} tok/s`];
    if (m.speculative || t.draft_n) {
      parts.push(`n_drafted ${t.draft_n}`, `n_accept ${t.draft_n_accepted}`,
                 `acceptance ${fmt(100 * t.acceptance_rate, 0)} %`, `tok/verify ${fmt(t.mean_accepted_len, 2)}`);
    }
    if (m.gated) parts.push(`gate fires ${t.gate_fires}`);
    if (m.gated && !m.speculative && t.draft_consults !== null) parts.push(`draft consults ${t.draft_consults}`);
    parts.push(`TTFT ${fmt(t.ttft_ms == null ? null : t.ttft_ms / 1000, 2)} s`, `${t.mode}: ${t.lossless ? "lossless" : "not lossless"}`);
    return parts.join(" · ");
  }

  function finishView(view, timings, how) {
    view.container.dataset.state = how;
    if (timings) {
      view.container.dataset.timings = JSON.stringify(timings);
      view.stats.textContent = statsLine(timings);
      showCounts(view);
    } else {
      view.stats.textContent = how === "stopped" ? "stopped" : "";
    }
  }

  function failView(view, message) {
    view.container.dataset.state = "error";
    const p = document.createElement("p");
    p.className = "error";
    p.setAttribute("role", "alert");
    p.textContent = message;
    view.container.append(p);
  }

  function viewText(view) {
    return view.spans.map((s) => (s ? s.textContent : "")).join("");
  }

  // the legend's counts: how many tokens of each origin the last reply had
  function showCounts(view) {
    const counts = {};
    for (const s of view.spans) if (s) counts[s.dataset.origin] = (counts[s.dataset.origin] || 0) + 1;
    for (const li of $("legend-list").children) {
      li.querySelector(".count").textContent = `${counts[li.dataset.origin] || 0} in the last reply`;
    }
  }

  // ---------------------------------------------------------------- token details
  function showInfo(span) {
    const o = span.dataset.origin;
    const [name, what] = ORIGIN_TEXT[o] || [o, ""];
    const box = $("token-info");
    box.textContent = "";
    const head = document.createElement("p");
    const sample = document.createElement("span");
    sample.className = "tok o-" + o;
    sample.textContent = JSON.stringify(span.dataset.text ?? span.textContent); // a formula's token has its text there
    head.append(sample, ` token ${Number(span.dataset.i) + 1}: ${name}`);
    const dl = document.createElement("dl");
    const row = (k, v) => { const dt = document.createElement("dt"); dt.textContent = k; const dd = document.createElement("dd"); dd.textContent = v; dl.append(dt, dd); };
    row("why", what);
    const computed = ["h_draft", "h_target", "overlap"].some((k) => k in span.dataset);
    if (computed) {
      row("H_draft", "h_draft" in span.dataset ? `${fmt(span.dataset.h_draft, 3)} nats` : "not computed");
      row("H_target", "h_target" in span.dataset ? `${fmt(span.dataset.h_target, 3)} nats` : "not computed");
      row("overlap", "overlap" in span.dataset ? fmt(span.dataset.overlap, 2) : "not computed");
    } else {
      row("gate", "not evaluated at this token");
    }
    box.append(head, dl);
  }

  function activate(span) {
    for (const a of document.querySelectorAll(".tok.active")) a.classList.remove("active");
    span.classList.add("active");
    showInfo(span);
  }

  document.addEventListener("mouseover", (ev) => {
    const t = ev.target.closest && ev.target.closest(".tok");
    if (t && !t.closest("#legend")) showInfo(t);
  });
  document.addEventListener("click", (ev) => {
    const t = ev.target.closest && ev.target.closest(".tok");
    if (t && !t.closest("#legend")) activate(t);
  });
  document.addEventListener("keydown", (ev) => {
    const box = ev.target.closest && ev.target.closest(".reply, .cell");
    if (!box || !["ArrowRight", "ArrowLeft", "Home", "End"].includes(ev.key)) return;
    const toks = [...box.querySelectorAll(".tok")];
    if (!toks.length) return;
    const cur = toks.indexOf(box.querySelector(".tok.active"));
    let next = { ArrowRight: cur + 1, ArrowLeft: cur - 1, Home: 0, End: toks.length - 1 }[ev.key];
    next = Math.max(0, Math.min(toks.length - 1, cur < 0 ? 0 : next));
    activate(toks[next]);
    toks[next].scrollIntoView({ block: "nearest" });
    ev.preventDefault();
  });

  // ---------------------------------------------------------------- settings
  function defaultsText(k) {
    const v = state.props.defaults[k];
    return v === null || v === undefined ? "" : String(v);
  }

  function readValue(k) {
    const raw = $("set-" + k).value.trim();
    if (raw === "inf" || raw === "-inf") return raw;
    const x = Number(raw);
    return raw === "" || Number.isNaN(x) ? raw : x; // the server names what is wrong with it
  }

  // the request's settings: mode, temperature and max tokens always; the rest where changed
  function settingsBody() {
    const body = { mode: $("set-mode").value };
    for (const k of SETTINGS) {
      if (k === "temperature" || k === "max_tokens" || $("set-" + k).value.trim() !== defaultsText(k)) body[k] = readValue(k);
    }
    return body;
  }

  // the header names the mode the next request will use, as the settings now say
  function showServerLine() {
    const mode = $("set-mode").value || state.props.defaults.mode;
    const m = modeRow(mode);
    const lossless = m.lossless ?? state.props.defaults.lossless;
    const dflt = mode === state.props.defaults.mode ? "" : ` (server default ${state.props.defaults.mode})`;
    // sd drafts with the server's --spec-type (a prompt lookup needs no draft model); EASD with the draft model
    const drafts = m.speculative && !m.gated && state.props.defaults.spec_type ? ` · drafts: ${state.props.defaults.spec_type}` : "";
    $("server-line").textContent = `${state.props.model} · mode ${mode} (${lossless ? "lossless" : "not lossless"})${drafts}${dflt}` +
      ` · thresholds: ${state.props.defaults.thresholds_source}`;
  }

  function showNotes() {
    showServerLine();
    const m = modeRow($("set-mode").value);
    const gateOff = ["tau_draft", "tau_target"].some((k) => $("set-" + k).value.trim() === "inf")
      || Number($("set-overlap").value) > 1;
    const note = $("mode-note");
    let text = m.note || "";
    if (m.gated && gateOff) text = "the gate is off (a threshold is inf, or τ_overlap > 1): the output is sd's, lossless";
    note.textContent = text;
    note.classList.toggle("lossy", !m.lossless && !(m.gated && gateOff));
    const changed = THRESHOLDS.some((k) => $("set-" + k).value.trim() !== defaultsText(k));
    const src = state.props.defaults.thresholds_source;
    $("source-note").textContent = changed ? `thresholds: set here for this request (the server's come from: ${src})`
                                           : `thresholds: the server's, from: ${src}`;
  }

  // side by side: what the two modes picked are not (the chat's mode note, for each side)
  function showCompareNote() {
    const notes = [$("mode-a").value, $("mode-b").value].map(modeRow).filter((m) => !m.lossless && m.note);
    $("compare-note").textContent = [...new Set(notes.map((m) => m.note))].join(". ");
  }

  function fillSettings() {
    for (const k of SETTINGS) $("set-" + k).value = defaultsText(k);
    $("set-mode").value = state.props.defaults.mode;
    showNotes();
  }

  function fillModes(select, value) {
    select.textContent = "";
    for (const m of state.props.modes) {
      const opt = document.createElement("option");
      opt.value = m.name;
      opt.textContent = `${m.name} (${m.lossless ? "lossless" : "not lossless"})`;
      select.append(opt);
    }
    if (state.props.modes.some((m) => m.name === value)) select.value = value;
  }

  function fillLegend() {
    const list = $("legend-list");
    list.textContent = "";
    for (const o of state.props.origins) {
      const [name, what] = ORIGIN_TEXT[o] || [o, ""];
      const li = document.createElement("li");
      li.dataset.origin = o;
      const sample = document.createElement("span");
      sample.className = "tok o-" + o;
      sample.textContent = name;
      const text = document.createElement("span");
      text.textContent = what;
      const count = document.createElement("span");
      count.className = "count";
      text.append(" ", count);
      li.append(sample, text);
      list.append(li);
    }
  }

  // ---------------------------------------------------------------- chat
  function setBusy(on) {
    $("send").disabled = on;
    $("stop").disabled = !on;
    $("compare").disabled = on;
    $("compare-stop").disabled = !on;
  }

  async function send() {
    const text = $("input").value;
    if (!text.trim() || state.running || !state.props) return;
    $("input").value = "";
    $("input").focus(); // Send is disabled while the reply streams: the keyboard stays in the box
    state.history.push({ role: "user", content: text });
    const u = document.createElement("li");
    u.className = "msg user";
    u.textContent = text;
    const a = document.createElement("li");
    a.className = "msg assistant";
    a.dataset.state = "streaming";
    const who = document.createElement("span");
    who.className = "who";
    const body = settingsBody();
    who.textContent = `${state.props.model} · ${body.mode}`;
    a.append(who);
    $("messages").append(u, a);
    const view = newView(a);
    const ctl = new AbortController();
    state.running = ctl;
    setBusy(true);
    startFollowing();
    try {
      const t = await stream({ ...body, messages: state.history }, view, ctl.signal);
      state.history.push({ role: "assistant", content: viewText(view) });
      finishView(view, t, "done");
      keepView(view);
    } catch (e) {
      if (ctl.signal.aborted) {
        state.history.push({ role: "assistant", content: viewText(view) });
        finishView(view, null, "stopped");
        keepView(view);
      } else {
        state.history.pop(); // the question goes unanswered: ask again without it
        failView(view, e.message);
        if (!$("input").value) $("input").value = text; // ... and it is back in the box, to send again
      }
    } finally {
      state.running = null;
      setBusy(false);
      keepInView(); // drawn as Markdown, or an error under it: the reply's height changed
    }
  }

  // a finished reply: Markdown and maths drawn over its tokens, or its tokens as they came
  function drawView(view) {
    if ($("render-md").checked && window.easdMarkdown) {
      window.easdMarkdown.render(view.spans, view.body);
      view.container.dataset.rendered = "1";
    } else {
      view.body.textContent = "";
      for (const s of view.spans) if (s) view.body.append(s);
      delete view.container.dataset.rendered;
    }
  }

  function keepView(view) {
    state.views.push(view);
    drawView(view);
  }

  function stop() {
    if (state.running) state.running.abort();
  }

  function newChat() {
    stop();
    state.history = [];
    state.views = [];
    $("messages").textContent = "";
    $("input").focus();
  }

  // ---------------------------------------------------------------- side by side
  // tokens of `a` and `b` (by text) in runs that both share and runs where they part:
  // a longest common subsequence, so that the replies line up again after they part
  function hunks(a, b) {
    const n = a.length, m = b.length;
    const out = [];
    const push = (same, as, bs) => {
      const last = out[out.length - 1];
      if (last && last.same === same) { last.a.push(...as); last.b.push(...bs); } else out.push({ same, a: as, b: bs });
    };
    if (n * m > 16e6) { // too long to align: the shared start, then the rest of each
      let k = 0;
      while (k < n && k < m && a[k] === b[k]) k++;
      if (k) push(true, [...Array(k).keys()], [...Array(k).keys()]);
      if (k < n || k < m) push(false, [...Array(n - k).keys()].map((x) => x + k), [...Array(m - k).keys()].map((x) => x + k));
      return out;
    }
    const w = m + 1;
    const L = new Uint16Array((n + 1) * w); // L[i][j]: LCS length of a[i:], b[j:]
    for (let i = n - 1; i >= 0; i--) {
      for (let j = m - 1; j >= 0; j--) {
        L[i * w + j] = a[i] === b[j] ? L[(i + 1) * w + j + 1] + 1 : Math.max(L[(i + 1) * w + j], L[i * w + j + 1]);
      }
    }
    let i = 0, j = 0;
    while (i < n || j < m) {
      if (i < n && j < m && a[i] === b[j]) { push(true, [i], [j]); i++; j++; }
      else if (j >= m || (i < n && L[(i + 1) * w + j] >= L[i * w + j + 1])) { push(false, [i], []); i++; }
      else { push(false, [], [j]); j++; }
    }
    return out;
  }

  function cell(side, mode, cls) {
    const c = document.createElement("div");
    c.className = "cell " + cls;
    c.dataset.side = side === "a" ? "left " + mode : "right " + mode;
    return c;
  }

  function align(views, modes) {
    const [va, vb] = views;
    const ta = va.spans.map((s) => s.textContent), tb = vb.spans.map((s) => s.textContent);
    const out = $("compare-out");
    const foot = [va.stats, vb.stats];
    for (const v of views) v.body.remove();
    for (const el of out.querySelectorAll(".stream")) el.remove();
    const hs = hunks(ta, tb);
    let parts = 0;
    for (const h of hs) {
      for (const [side, idx, view] of [["a", h.a, va], ["b", h.b, vb]]) {
        const c = cell(side, modes[side === "a" ? 0 : 1], h.same ? "same" : "differ");
        c.tabIndex = 0;
        if (!h.same) {
          const mark = document.createElement("span");
          mark.className = "parts-here";
          mark.setAttribute("aria-label", "the replies part here");
          c.append(mark);
        }
        for (const k of idx) c.append(view.spans[k]);
        out.append(c);
      }
      if (!h.same) parts++;
    }
    for (const [k, st] of foot.entries()) {
      const c = cell(k ? "b" : "a", modes[k], "foot");
      c.append(st);
      out.append(c);
    }
    let first = 0;
    const sa = ta.join(""), sb = tb.join("");
    while (first < sa.length && first < sb.length && sa[first] === sb[first]) first++;
    out.dataset.parts = parts;
    out.dataset.firstPart = sa === sb ? -1 : first;
    $("compare-summary").textContent = sa === sb
      ? `${modes[0]} and ${modes[1]} gave the same text (${ta.length} and ${tb.length} tokens).`
      : `${modes[0]} and ${modes[1]} part at character ${first} and in ${parts} place${parts === 1 ? "" : "s"} in all ` +
        `(hatched, marked "parts here"); ${ta.length} and ${tb.length} tokens.`;
  }

  async function compare() {
    const prompt = $("compare-input").value;
    if (!prompt.trim() || state.running || !state.props) return;
    $("compare-input").focus(); // Compare is disabled while the replies stream: the keyboard stays in the box
    const modes = [$("mode-a").value, $("mode-b").value];
    const body = settingsBody();
    delete body.mode;
    if (Number(body.temperature) > 0) body.seed = Math.floor(Math.random() * 2 ** 31); // one seed for both
    const out = $("compare-out");
    out.textContent = "";
    delete out.dataset.state; // the last comparison's: these replies are streaming
    delete out.dataset.parts;
    delete out.dataset.firstPart;
    $("compare-summary").textContent = "";
    const views = modes.map((mode, k) => {
      const head = cell(k ? "b" : "a", mode, "head");
      head.classList.remove("cell");
      head.textContent = `${k ? "right" : "left"}: ${mode} (${modeRow(mode).lossless ? "lossless" : "not lossless"})`;
      out.append(head);
      return mode;
    }).map((mode, k) => {
      const col = document.createElement("div");
      col.className = "stream";
      col.dataset.side = k ? "right" : "left";
      col.dataset.mode = mode;
      col.dataset.state = "streaming";
      out.append(col);
      return newView(col);
    });
    const ctl = new AbortController();
    state.running = ctl;
    setBusy(true);
    startFollowing();
    const messages = [{ role: "user", content: prompt }];
    const results = await Promise.allSettled(views.map((v, k) => stream({ ...body, mode: modes[k], messages }, v, ctl.signal)));
    state.running = null;
    setBusy(false);
    results.forEach((r, k) => {
      if (r.status === "fulfilled") finishView(views[k], r.value, "done");
      else if (ctl.signal.aborted) finishView(views[k], null, "stopped");
      else failView(views[k], r.reason.message);
    });
    const ok = results.every((r) => r.status === "fulfilled");
    if (ok) {
      views.forEach((v, k) => { out.dataset["timings" + k] = v.container.dataset.timings; });
      align(views, modes);
    }
    out.dataset.state = ok ? "done" : "incomplete";
    keepInView(); // lined up (or an error under a reply), the replies' height changed
  }

  // ---------------------------------------------------------------- wiring
  function showView(which) {
    const chat = which === "chat";
    $("view-chat").hidden = !chat;
    $("view-compare").hidden = chat;
    $("tab-chat").setAttribute("aria-pressed", String(chat));
    $("tab-compare").setAttribute("aria-pressed", String(!chat));
    (chat ? $("input") : $("compare-input")).focus();
  }

  async function main() {
    $("composer").addEventListener("submit", (ev) => { ev.preventDefault(); send(); });
    $("input").addEventListener("keydown", (ev) => {
      if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); send(); }
    });
    // Esc in the key dialog answers the dialog (no key: the waiting requests say so), not the stop button
    document.addEventListener("keydown", (ev) => {
      if (ev.key === "Escape" && state.running && !$("key-dialog").open) stop();
    });
    window.addEventListener("scroll", onScroll, { passive: true });
    // a wheel turned up stops following at once: a chunk's scroll could undo it before its scroll event
    window.addEventListener("wheel", (ev) => {
      if (ev.deltaY < 0 && window.scrollY > 0 && !ev.target.closest?.("textarea")) follow.on = false;
    }, { passive: true });
    $("stop").addEventListener("click", stop);
    $("compare-stop").addEventListener("click", stop);
    $("new-chat").addEventListener("click", newChat);
    $("tab-chat").addEventListener("click", () => showView("chat"));
    $("tab-compare").addEventListener("click", () => showView("compare"));
    $("compare-form").addEventListener("submit", (ev) => { ev.preventDefault(); compare(); });
    $("reset-settings").addEventListener("click", fillSettings);
    $("render-md").addEventListener("change", () => { for (const v of state.views) drawView(v); });
    for (const id of ["set-mode", ...SETTINGS.map((k) => "set-" + k)]) $(id).addEventListener("input", showNotes);
    $("set-mode").addEventListener("change", showNotes); // a select may fire only "change"
    for (const id of ["mode-a", "mode-b"]) $(id).addEventListener("change", showCompareNote);
    setBusy(true);
    state.props = await loadProps();
    const d = state.props.defaults;
    fillModes($("set-mode"), d.mode);
    const names = state.props.modes.map((m) => m.name);
    const gated = state.props.modes.find((m) => m.gated);
    fillModes($("mode-a"), names.includes("sd") ? "sd" : names[0]);
    fillModes($("mode-b"), modeRow(d.mode).gated ? d.mode : (gated ? gated.name : names[names.length - 1]));
    showCompareNote();
    fillLegend();
    fillSettings();
    setBusy(false);
    document.body.dataset.ready = "1";
  }

  main();
})();
