"""Answer extraction and grading for reasoning benchmarks.

Two graders:

``numeric`` (GSM8K, AIME, AMC)
    The model's answer is the content of its last ``\\boxed{}`` when it has one, else the
    number after its last ``####``, else the last number in the text. Both sides are read
    as numbers (commas, ``$``, ``%``, units and words dropped; ``-3``, ``1/2`` and
    ``\\frac{1}{2}`` understood) and compared with a relative tolerance of 1e-6 (two whole
    numbers must be exactly equal).

``math`` (MATH-500, OlympiadBench)
    The model's answer is its last ``\\boxed{...}`` (or ``\\boxed 5``, ``\\fbox{}``). Both
    sides are normalised (``\\left``/``\\right``, ``\\dfrac``→``\\frac``, ``\\text{}``
    unwrapped, degrees, ``\\%``, ``$``, spacing commands, trailing ``.``, ...) and compared
    as strings; failing that, as numbers when both are constants (fractions, ``\\sqrt``,
    ``\\pi`` and + - * / ^ are evaluated), or, for expressions in one-letter variables, as
    rearrangements: the same numbers and variables in another order that agree at several fixed
    points (``(b+2)(a+5)`` for ``(a+5)(b+2)``, but not ``x^2-1`` for ``(x+1)(x-1)``); tuples, intervals, sets,
    unions, comma lists and ``pmatrix`` vectors are compared element by element.

Public API: :func:`extract_answer`, :func:`is_correct`, :func:`answers_match`,
:func:`normalize_math`, :func:`last_boxed`.
"""

from __future__ import annotations

import ast
import math
import re
from collections import Counter
from fractions import Fraction

GRADERS = ("numeric", "math")
REL_TOL = 1e-6
ABS_TOL = 1e-9

# --------------------------------------------------------------------------- boxed


def _match_brace(text: str, start: int) -> int | None:
    """Index just past the brace group opening at ``text[start] == "{"``; None if unclosed.

    Escaped characters (``\\{``, ``\\}``, ``\\\\``) are skipped so LaTeX set braces inside a
    box do not end it.
    """
    depth = 0
    i = start
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


def last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\boxed 5``."""
    if not text:
        return None
    for m in reversed(list(_BOX_RE.finditer(text))):
        i = m.end()
        while i < len(text) and text[i] in " \t":
            i += 1
        if i < len(text) and text[i] == "{":
            end = _match_brace(text, i)
            if end is None:  # truncated box (generation cut off): try an earlier one
                continue
            return text[i + 1 : end - 1].strip()
        if i > m.end():  # "\boxed 5": the token up to whitespace or "$"
            tok = re.match(r"[^\s$]+", text[i:])
            if tok:
                return tok.group(0).rstrip(".,;").strip() or None
    return None


# ----------------------------------------------------------------- normalisation

_TEXT_CMDS = r"(?:text|textbf|textit|textrm|textnormal|mathrm|mathbf|mathit|mathsf|mbox|hbox|operatorname|boldsymbol|bf|rm)"
_TEXT_RE = re.compile(r"\\" + _TEXT_CMDS + r"\s*\{([^{}]*)\}")
_UNIT_WORDS_RE = re.compile(
    r"^(?P<head>.*?[\d}.)])\s*(?P<unit>(?:[A-Za-z]{2,}(?![A-Za-z])\.?\s*)+)(?:\^\s*\{?\s*[23]\s*\}?)?$"
)
_VAR_PREFIX_RE = re.compile(r"^(?:[A-Za-z](?:_\{?\w+\}?)?(?:\([A-Za-z]\))?|\\[A-Za-z]+)=(?!=)")


def unwrap_gold_list(text: str) -> str:
    """``"['2']"`` -> ``"2"``; ``"['a', 'b']"`` -> ``"a, b"``; other text unchanged."""
    s = text.strip()
    if len(s) >= 2 and s[0] == "[" and s[-1] == "]" and ("'" in s or '"' in s):
        try:
            parsed = ast.literal_eval(s)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return text
        if isinstance(parsed, (list, tuple)) and parsed and all(isinstance(v, str) for v in parsed):
            return ", ".join(str(v) for v in parsed)
    return text


def _fix_fracs(s: str) -> str:
    # \frac ab, \frac43, \frac{270}7, \frac9{19}: give both arguments braces
    s = re.sub(r"\\frac\s*([0-9A-Za-z])\s*([0-9A-Za-z])", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac\s*([0-9A-Za-z])\s*\{", r"\\frac{\1}{", s)
    s = re.sub(r"\\frac\s*(\{(?:[^{}]|\{[^{}]*\})*\})\s*([0-9A-Za-z])", r"\\frac\1{\2}", s)
    s = re.sub(r"\\sqrt\s*([0-9A-Za-z])", r"\\sqrt{\1}", s)
    return s


def _strip_units(s: str) -> str:
    """Drop trailing unit words after a number: ``5.4 cents``, ``864 inches^2`` -> number."""
    if len(s) > 200:
        return s
    m = _UNIT_WORDS_RE.match(s)
    if not m:
        return s
    head = m.group("head").strip()
    if _const_value(_squash(head)) is None:
        return s
    return head


def _squash(s: str) -> str:
    return re.sub(r"\s+", "", s)


def normalize_math(text: str | None) -> str:
    """Canonical string form of a LaTeX answer (see module doc)."""
    if text is None:
        return ""
    s = unwrap_gold_list(str(text)).strip()
    inner = last_boxed(s) if s.startswith(("\\boxed", "\\fbox")) else None
    if inner is not None:
        s = inner
    s = s.replace("\n", " ")
    # math delimiters and dollar signs
    s = s.replace("\\$", "").replace("$", "")
    s = re.sub(r"^\\[\[(]|\\[\])]$", "", s.strip())
    s = re.sub(r"\\(?:displaystyle|textstyle|scriptstyle)(?![A-Za-z])", "", s)
    s = re.sub(r"\\right\.", "", s)
    s = re.sub(r"\\left\.", "", s)
    s = re.sub(r"\\(?:left|right|bigl|bigr|Bigl|Bigr|big|Big)(?![A-Za-z])", "", s)
    s = re.sub(r"\\[dt]frac(?![A-Za-z])", r"\\frac", s)
    s = re.sub(
        r"\\\\|\\(?:[,;:! ]|quad(?![A-Za-z])|qquad(?![A-Za-z]))",
        lambda m: m.group(0) if m.group(0) == "\\\\" else " ",
        s,
    )
    s = s.replace("~", " ").replace("{,}", ",")
    # degrees and percent
    s = re.sub(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ(?![A-Za-z])|\\circ(?![A-Za-z])|°", "", s)
    s = re.sub(r"\\?%", "", s)
    # \text{...} and friends: unwrap (repeat for nesting)
    for _ in range(5):
        new = _TEXT_RE.sub(lambda m: " " + m.group(1) + " ", s)
        if new == s:
            break
        s = new
    s = re.sub(r"\b(?:degrees?|deg)\b\.?", "", s) if re.search(r"\d", s) else s
    s = _fix_fracs(s)
    s = s.strip()
    s = _strip_units(s)
    # relations and symbols with several spellings
    s = re.sub(r"\\(?:leqslant|leq)(?![A-Za-z])", r"\\le", s)
    s = re.sub(r"\\(?:geqslant|geq)(?![A-Za-z])", r"\\ge", s)
    s = re.sub(r"\\neq(?![A-Za-z])", r"\\ne", s)
    s = s.replace("≤", "\\le").replace("≥", "\\ge").replace("∞", "\\infty").replace("π", "\\pi")
    s = re.sub(r"\\infinity(?![A-Za-z])", r"\\infty", s)
    s = re.sub(r"\\cdot(?![A-Za-z])", "*", s)
    s = re.sub(r"\\times(?![A-Za-z])", "*", s)
    s = _squash(s)
    # cosmetic braces: x^{2} -> x^2, 4210_{5} -> 4210_5
    s = re.sub(r"([\^_])\{(\w)\}", r"\1\2", s)
    # multiple choice "(C)" / "C)" -> "C"
    mc = re.fullmatch(r"\(?([A-E])\)", s)
    if mc:
        s = mc.group(1)
    s = s.rstrip(".")
    if re.fullmatch(r"[A-Za-z]+", s):  # words: "\\text{East}" == "east"
        s = s.lower()
    s = re.sub(r"(?<![\d\w}])\.(\d)", r"0.\1", s)  # .35 -> 0.35
    if re.fullmatch(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?", s):  # thousands separators
        s = s.replace(",", "")
    # "x=5", "k=1", "f(x)=2x", "x\in[-2,7]": keep the right-hand side
    s = re.sub(r"^[A-Za-z]\\in(?![A-Za-z])", "", s)
    if s.count("=") == 1 and "," not in s:
        s = _VAR_PREFIX_RE.sub("", s)
    return s


# ------------------------------------------------------ constant expression values


class _EvalError(Exception):
    pass


_TOKEN_RE = re.compile(r"\d+(?:\.\d*)?|\.\d+|\\[A-Za-z]+|[A-Za-z]|[-+*/^(){}\[\]]")


class _Evaluator:
    """Tiny recursive-descent evaluator for LaTeX arithmetic: constants, and one-letter
    variables where ``values`` gives them."""

    def __init__(self, s: str, values: dict[str, float] | None = None) -> None:
        self.values = values or {}
        pos = 0
        toks: list[str] = []
        for m in _TOKEN_RE.finditer(s):
            if m.start() != pos:
                raise _EvalError(s[pos : m.start()])
            toks.append(m.group(0))
            pos = m.end()
        if pos != len(s) or not toks:
            raise _EvalError(s[pos:])
        self.toks = toks
        self.i = 0

    def peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, expected: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (expected is not None and tok != expected):
            raise _EvalError(f"expected {expected}")
        self.i += 1
        return tok

    def parse(self) -> float:
        value = self.expr()
        if self.peek() is not None:
            raise _EvalError("trailing")
        return value

    def expr(self) -> float:
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            rhs = self.term()
            value = value + rhs if op == "+" else value - rhs
        return value

    def _starts_atom(self, tok: str | None) -> bool:
        if tok is None:
            return False
        return tok[0].isdigit() or tok[0] == "." or tok in ("(", "{", "\\frac", "\\sqrt", "\\pi") or tok in self.values

    def term(self) -> float:
        value = self.unary()
        while True:
            tok = self.peek()
            if tok in ("*", "/"):
                self.take()
                rhs = self.unary()
                if tok == "*":
                    value *= rhs
                else:
                    if rhs == 0:
                        raise _EvalError("division by zero")
                    value /= rhs
            elif self._starts_atom(tok):  # implicit multiplication: 3\sqrt{2}, 2\pi
                value *= self.power()
            else:
                return value

    def unary(self) -> float:
        if self.peek() in ("-", "+"):
            op = self.take()
            v = self.unary()
            return -v if op == "-" else v
        return self.power()

    def power(self) -> float:
        base = self.atom()
        if self.peek() == "^":
            self.take()
            if self.peek() in ("-", "+"):
                exp = self.unary()
            else:
                tok = self.peek()
                if tok is not None and tok[0].isdigit() and tok.isdigit() and len(tok) > 1:
                    # x^23 in LaTeX means x^2 3; consume only the first digit
                    self.toks[self.i] = tok[1:]
                    exp = float(tok[0])
                else:
                    exp = self.atom()
            if abs(exp) > 10000:
                raise _EvalError("exponent too large")
            try:
                result = base ** exp
            except (OverflowError, ZeroDivisionError):
                raise _EvalError("overflow") from None
            if isinstance(result, complex):
                raise _EvalError("complex")
            return result
        return base

    def group(self) -> float:
        tok = self.peek()
        if tok == "{":
            self.take()
            v = self.expr()
            self.take("}")
            return v
        if tok is not None and tok.isdigit():  # \frac12 style single digits
            self.take()
            if len(tok) > 1:
                self.toks.insert(self.i, tok[1:])
            return float(tok[0])
        raise _EvalError("group")

    def atom(self) -> float:
        tok = self.peek()
        if tok is None:
            raise _EvalError("end")
        if tok[0].isdigit() or tok[0] == ".":
            self.take()
            return float(tok)
        if tok in ("(", "{", "["):
            close = {"(": ")", "{": "}", "[": "]"}[tok]
            self.take()
            v = self.expr()
            self.take(close)
            return v
        if tok == "\\frac":
            self.take()
            num = self.group()
            den = self.group()
            if den == 0:
                raise _EvalError("division by zero")
            return num / den
        if tok == "\\sqrt":
            self.take()
            index = 2.0
            if self.peek() == "[":
                self.take()
                index = self.expr()
                self.take("]")
            radicand = self.group()
            if radicand < 0 or index == 0:
                raise _EvalError("domain")
            return radicand ** (1.0 / index)
        if tok == "\\pi":
            self.take()
            return math.pi
        if tok in self.values:
            self.take()
            return self.values[tok]
        raise _EvalError(tok)


_MIXED_RE = re.compile(r"(-?)(\d+)\\frac\{(\d+)\}\{(\d+)\}")
_PLAIN_NUM_RE = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)")


def _const_value(s: str) -> float | None:
    """Numeric value of a normalised constant expression, or None."""
    if not s or len(s) > 200:
        return None
    if _PLAIN_NUM_RE.fullmatch(s):
        return float(s)
    mixed = _MIXED_RE.fullmatch(s)  # 1\frac{4}{5} is the mixed number 9/5
    if mixed:
        sign, whole, num, den = mixed.groups()
        if int(den) == 0:
            return None
        v = int(whole) + int(num) / int(den)
        return -v if sign else v
    if re.search(r"[A-Za-z]", re.sub(r"\\(?:frac|sqrt|pi)(?![A-Za-z])", "", s)):
        return None  # a variable or an unsupported command
    try:
        v = _Evaluator(s).parse()
    except (_EvalError, RecursionError, OverflowError, ValueError):
        return None
    if not math.isfinite(v):
        return None
    return v


# Points at which two expressions in the same variables must agree: irrational-looking, so
# that distinct polynomials or rational functions of a few variables agree at all of them
# only by a coincidence far below the tolerance; positive, so that \sqrt of a variable is real.
_POINTS = ((1.3719, 2.2537, 0.6143, 3.0917), (0.8291, 1.7723, 2.9411, 1.1537), (2.4173, 0.5309, 1.8861, 2.7311))
_SUPPORTED_COMMANDS_RE = re.compile(r"\\(?:frac|sqrt|pi)(?![A-Za-z])")


def _variables(s: str) -> list[str] | None:
    """The one-letter variables of an expression, or None when it has none or is not one:
    two letters side by side are a word or a function name (``\\text{seat}`` must not
    equal ``east``), and any other command is not evaluated."""
    bare = _SUPPORTED_COMMANDS_RE.sub(" ", s)
    if "\\" in bare or "=" in bare or re.search(r"[A-Za-z]{2}", bare):
        return None
    names = sorted(set(re.findall(r"[A-Za-z]", bare)))
    return names if 0 < len(names) <= len(_POINTS[0]) else None


def _atoms(s: str) -> Counter:
    return Counter(t for t in _TOKEN_RE.findall(s) if t[0].isalnum() or t[0] in ".\\")


def _same_expression(a: str, b: str) -> bool:
    """Two expressions in one-letter variables made of the same numbers, variables and
    commands, in another order, that agree at every point of _POINTS. Only rearrangements:
    an answer that restates a "factor" or "simplify" question's own expression equals its
    gold in value but is not its answer."""
    names = _variables(a)
    if names is None or names != _variables(b) or len(a) > 200 or len(b) > 200 or _atoms(a) != _atoms(b):
        return False
    for point in _POINTS:
        values = dict(zip(names, point))
        try:
            va, vb = _Evaluator(a, values).parse(), _Evaluator(b, values).parse()
        except (_EvalError, RecursionError, OverflowError, ValueError, ZeroDivisionError):
            return False
        if not (math.isfinite(va) and math.isfinite(vb)) or not math.isclose(va, vb, rel_tol=REL_TOL, abs_tol=ABS_TOL):
            return False
    return True


def _close(a: float, b: float) -> bool:
    """Relative tolerance 1e-6, except that two whole numbers must be equal: a tolerance
    would otherwise accept 1,450,001 for 1,450,000."""
    if a.is_integer() and b.is_integer():
        return a == b
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL)


# ---------------------------------------------------------- structured compare

_OPEN = "([{"
_CLOSE = ")]}"


def _split_top(s: str, sep: str) -> list[str]:
    """Split on ``sep`` outside any bracket (mixed brackets count, so ``(3,4]`` works)."""
    parts: list[str] = []
    depth = 0
    start = 0
    i = 0
    n = len(s)
    while i < n:
        ch = s[i]
        if ch == "\\":
            if s.startswith(sep, i) and depth == 0:
                parts.append(s[start:i])
                i += len(sep)
                start = i
                continue
            if i + 1 < n and s[i + 1] in "{}":  # \{ \} count as brackets (sets)
                depth += 1 if s[i + 1] == "{" else -1
            i += 2
            continue
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
        elif depth == 0 and s.startswith(sep, i):
            parts.append(s[start:i])
            i += len(sep)
            start = i
            continue
        i += 1
    parts.append(s[start:])
    return parts


def _outer_brackets(s: str) -> tuple[str, str, str] | None:
    """(open, inner, close) when one bracket pair spans the whole string."""
    if s.startswith("\\{") and s.endswith("\\}") and len(s) >= 4:
        inner = s[2:-2]
        opener, closer = "{", "}"
    elif len(s) >= 2 and s[0] in _OPEN and s[-1] in _CLOSE:
        inner = s[1:-1]
        opener, closer = s[0], s[-1]
    else:
        return None
    depth = 0
    i = 0
    while i < len(inner):  # the opening bracket must not close before the end
        ch = inner[i]
        if ch == "\\" and i + 1 < len(inner):
            if inner[i + 1] in "{}":
                depth += 1 if inner[i + 1] == "{" else -1
            i += 2
            if depth < 0:
                return None
            continue
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
            if depth < 0:
                return None
        i += 1
    if depth != 0:
        return None
    return opener, inner, closer


_MATRIX_RE = re.compile(r"\\begin\{([pbvBV]?matrix|array)\}(?:\{[^{}]*\})?(.*)\\end\{\1\}")


def _matrix_cells(s: str) -> list[list[str]] | None:
    m = _MATRIX_RE.fullmatch(s)
    if not m:
        return None
    rows = [r for r in m.group(2).split("\\\\")]
    while rows and rows[-1] == "":
        rows.pop()
    return [r.split("&") for r in rows]


def _strip_var(s: str) -> str:
    return _VAR_PREFIX_RE.sub("", s) if s.count("=") == 1 else s


def _unordered_match(xs: list[str], ys: list[str], depth: int) -> bool:
    remaining = list(ys)
    for x in xs:
        for j, y in enumerate(remaining):
            if _equiv(x, y, depth + 1):
                del remaining[j]
                break
        else:
            return False
    return not remaining


def _equiv(a: str, b: str, depth: int = 0) -> bool:
    """Equivalence of two normalised answers."""
    if a == b:
        return True
    if depth > 6 or not a or not b:
        return False
    va, vb = _const_value(a), _const_value(b)
    if va is not None and vb is not None:
        return _close(va, vb)
    # unions of intervals: ordered, piece by piece
    ua, ub = _split_top(a, "\\cup"), _split_top(b, "\\cup")
    if len(ua) > 1 or len(ub) > 1:
        return len(ua) == len(ub) and all(_equiv(x, y, depth + 1) for x, y in zip(ua, ub))
    # bare comma lists ("3,5,7", "x=1,x=2"): order-insensitive
    la, lb = _split_top(a, ","), _split_top(b, ",")
    if len(la) > 1 or len(lb) > 1:
        if len(la) != len(lb):
            return False
        return _unordered_match([_strip_var(x) for x in la], [_strip_var(y) for y in lb], depth)
    # tuples, intervals, sets
    oa, ob = _outer_brackets(a), _outer_brackets(b)
    if oa and ob:
        (open_a, in_a, close_a), (open_b, in_b, close_b) = oa, ob
        if (open_a, close_a) != (open_b, close_b):
            return False
        ea, eb = _split_top(in_a, ","), _split_top(in_b, ",")
        if len(ea) != len(eb):
            return False
        if open_a == "{":  # a set
            return _unordered_match(ea, eb, depth)
        return all(_equiv(x, y, depth + 1) for x, y in zip(ea, eb))
    ma, mb = _matrix_cells(a), _matrix_cells(b)
    if ma is not None and mb is not None:
        return len(ma) == len(mb) and all(
            len(ra) == len(rb) and all(_equiv(x, y, depth + 1) for x, y in zip(ra, rb))
            for ra, rb in zip(ma, mb)
        )
    sa, sb = _strip_var(a), _strip_var(b)
    if (sa, sb) != (a, b):
        return _equiv(sa, sb, depth + 1)
    return _same_expression(a, b)


# ---------------------------------------------------------------- numeric grader

_NUM = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+"
_NUM_TOKEN_RE = re.compile(
    r"(?P<neg>(?<![\w)\]}])-\s*)?"
    r"(?:\\[dt]?frac\s*\{\s*(?P<fn>-?(?:" + _NUM + r"))\s*\}\s*\{\s*(?P<fd>-?(?:" + _NUM + r"))\s*\}"
    r"|(?P<a>" + _NUM + r")(?:\s*/\s*(?P<b>" + _NUM + r"))?)"
)


# GSM8K asks "what time" and keeps only the hour as gold ("2" for 2:00 pm); read a clock
# time as hours so it is not graded by its last number (the minutes).
_CLOCK_RE = re.compile(r"(?P<h>\d{1,2}):(?P<m>[0-5]\d)(?:[ap]\.?m\.?)?", re.IGNORECASE)


def _num(text: str) -> Fraction:
    return Fraction(text.replace(",", ""))


def _token_value(m: re.Match) -> float | None:
    try:
        if m.group("fn") is not None:
            den = _num(m.group("fd"))
            value = _num(m.group("fn")) / den if den else None
        else:
            value = _num(m.group("a"))
            if m.group("b") is not None:
                den = _num(m.group("b"))
                value = value / den if den else None
    except (ValueError, ZeroDivisionError):
        return None
    if value is None:
        return None
    if m.group("neg"):
        value = -value
    return float(value)


def _number_tokens(text: str) -> list[tuple[str, float]]:
    out = []
    for m in _NUM_TOKEN_RE.finditer(text):
        v = _token_value(m)
        if v is not None:
            out.append((m.group(0).strip(), v))
    return out


def parse_number(text: str | None) -> float | None:
    """Read a number from an answer: the whole (normalised) text when it is a constant
    (``1,000``, ``$18.00``, ``-3``, ``\\frac{1}{2}``, ``75%``), else its last number
    (``18 dollars`` -> 18). A clock time reads as hours (``2:30 pm`` -> 2.5)."""
    if text is None:
        return None
    raw = unwrap_gold_list(str(text))
    if "####" in raw:
        raw = raw.rsplit("####", 1)[1]
    norm = normalize_math(raw)
    clock = _CLOCK_RE.fullmatch(norm)
    if clock and int(clock.group("h")) <= 24:
        return int(clock.group("h")) + int(clock.group("m")) / 60
    value = _const_value(norm)
    if value is not None:
        return value
    cleaned = raw.replace("\\!", "").replace("\\,", "")
    cleaned = re.sub(r"(?<=\d),\s+(?=\d{3}\b)", ",", cleaned)
    tokens = _number_tokens(cleaned)
    return tokens[-1][1] if tokens else None


def _extract_numeric(completion: str) -> str | None:
    boxed = last_boxed(completion)
    if boxed is not None:
        return boxed
    if "####" in completion:
        tail = completion.rsplit("####", 1)[1]
        tokens = _number_tokens(tail)
        if tokens:
            return tokens[0][0]
    tokens = _number_tokens(completion)
    return tokens[-1][0] if tokens else None


# ------------------------------------------------------------------- math grader

_ANSWER_IS_RE = re.compile(
    r"(?:final answer|the answer)\s*(?:is|:)\s*:?\s*(?P<ans>\$[^$]+\$|[^\n]+?)\s*(?:\.\s|\.?$|\n)",
    re.IGNORECASE,
)


def _extract_math(completion: str) -> str | None:
    boxed = last_boxed(completion)
    if boxed is not None:
        return boxed
    matches = list(_ANSWER_IS_RE.finditer(completion))
    if matches:
        return matches[-1].group("ans").strip().strip("$").strip() or None
    return None


# -------------------------------------------------------------------------- API


def _check_grader(grader: str) -> None:
    if grader not in GRADERS:
        raise ValueError(f"grader must be one of {GRADERS}, got {grader!r}")


def extract_answer(completion: str, grader: str) -> str | None:
    """The model's final answer as it wrote it (boxed content, or number), or None."""
    _check_grader(grader)
    if not completion:
        return None
    return _extract_numeric(completion) if grader == "numeric" else _extract_math(completion)


def answers_match(answer: str | None, gold: str, grader: str) -> bool:
    """Whether an already extracted answer equals the gold answer under ``grader``."""
    _check_grader(grader)
    if answer is None or gold is None:
        return False
    if grader == "numeric":
        gv = parse_number(gold)
        av = parse_number(answer)
        if gv is not None:
            return av is not None and _close(av, gv)
        # a non-numeric gold in a numeric dataset: fall back to normalised text
        return normalize_math(answer) == normalize_math(gold)
    gold_text = unwrap_gold_list(str(gold))
    return _equiv(normalize_math(answer), normalize_math(gold_text))


def is_correct(completion: str, gold: str, grader: str) -> tuple[bool, str | None]:
    """(correct, extracted answer) for a model completion against the gold answer."""
    extracted = extract_answer(completion, grader)
    return answers_match(extracted, gold, grader), extracted
