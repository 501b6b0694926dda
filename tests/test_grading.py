"""Grader tests on gold answers taken from the real bundled benchmark files.

Each case names a real problem (by qid), checks its gold answer is what we think it is,
then grades a plausible model completion that must be right and a near miss that must be
wrong. The sweep at the bottom grades every gold of every preset against ``\\boxed{gold}``.
"""

from __future__ import annotations

from functools import lru_cache

import pytest

from easd_local.bench.datasets import PRESETS, load_dataset
from easd_local.bench.grading import (
    answers_match,
    extract_answer,
    is_correct,
    last_boxed,
    normalize_math,
    parse_number,
)


@lru_cache(maxsize=None)
def _problems(name: str) -> dict:
    return {p.qid: p for p in load_dataset(name)}


# (dataset, qid, gold as loaded, completions that must grade right, near misses that must grade wrong)
CASES = [
    # ---- GSM8K: "####" golds, thousands separators, dollars
    ("gsm8k", "gsm8k-test-00000", "18",
     ["16 - 3 - 4 = 9 eggs are left, and 9 * 2 = $18.\n#### 18",
      "She makes 9 * $2 = $18 every day.",
      "So Janet makes \\boxed{\\$18} per day.",
      "\\boxed{18.00}"],
     ["She makes 9 * 2 = 16 dollars.", "\\boxed{17}", "#### 81"]),
    ("gsm8k", "gsm8k-test-00146", "2,125",
     ["Adding everything up, the total is $2,125.", "\\boxed{2125}", "\\boxed{2,125 \\text{ dollars}}"],
     ["\\boxed{2,152}", "The total is 2,120."]),
    ("gsm8k", "gsm8k-test-00611", "1,450,000",
     ["He earns \\boxed{\\$1,450,000.00}.", "1450000 in total", "$1,450,000"],
     ["\\boxed{145,000}", "The answer is 1,450,001."]),
    # ---- AMC: float golds ("27.0"), negative answers
    ("amc23", "amc23-0", "27.0",
     ["Alicia bikes 18 * 1.5 = 27 miles, so they meet \\boxed{27} miles from A.",
      "They meet 27 miles from City A.", "\\boxed{27.000000001}"],
     ["Beth bikes \\boxed{18} miles.", "\\boxed{27.5}", "\\boxed{27.0001}"]),
    ("amc23", "amc23-17", "-1.0",
     ["Summing the roots gives $-1$.", "\\boxed{-1}", "\\boxed{- 1}"],
     ["\\boxed{1}", "The sum is 3-1."]),
    # ---- AIME: integer golds, leading zeros
    ("aime24", "aime24-60", "204",
     ["The walk takes her \\boxed{204} minutes, including t minutes.", "so 204 minutes"],
     ["The walk takes her 240 minutes.", "\\boxed{205}"]),
    ("aime24", "aime24-67", "025",
     ["\\boxed{25}", "\\boxed{025}", "Therefore xy = 25."],
     ["\\boxed{250}", "xy = 52"]),
    # ---- MATH-500
    ("math500", "math500-test-algebra-2584", "\\frac{14}{3}",
     ["\\boxed{\\dfrac{14}{3}}", "\\boxed{14/3}", "The final answer is $\\frac{14}{3}$."],
     ["\\boxed{\\frac{13}{3}}", "\\boxed{4.67}"]),
    ("math500", "math500-test-prealgebra-1655", "\\dfrac{17}{50}",
     ["\\boxed{\\frac{17}{50}}", "\\boxed{0.34}", "$\\boxed{\\tfrac{17}{50}}$"],
     ["\\boxed{\\frac{17}{5}}", "\\boxed{\\frac{50}{17}}"]),
    ("math500", "math500-test-algebra-1349", "\\text{Evelyn}",
     ["\\boxed{\\text{Evelyn}}", "\\boxed{Evelyn}", "\\boxed{\\textbf{Evelyn}}"],
     ["\\boxed{\\text{Evan}}", "\\boxed{\\text{Briana}}"]),
    ("math500", "math500-test-precalculus-927", "90^\\circ",
     ["\\boxed{90^{\\circ}}", "\\boxed{90}", "\\boxed{90^\\circ}", "\\boxed{90 \\text{ degrees}}"],
     ["\\boxed{180^\\circ}", "\\boxed{9^\\circ}"]),
    ("math500", "math500-test-intermediate_algebra-558", "(3,4]",
     ["\\boxed{(3, 4]}", "\\boxed{\\left(3,4\\right]}"],
     ["\\boxed{[3,4]}", "\\boxed{(3,4)}", "\\boxed{(3,5]}"]),
    ("math500", "math500-test-precalculus-807", "\\left( 3, \\frac{\\pi}{2} \\right)",
     ["\\boxed{\\left(3,\\dfrac{\\pi}{2}\\right)}", "\\boxed{(3, \\pi/2)}", "\\boxed{(3,\\frac{\\pi}{2})}"],
     ["\\boxed{(3, \\pi)}", "\\boxed{\\left(\\frac{\\pi}{2}, 3\\right)}", "\\boxed{3}"]),
    ("math500", "math500-test-algebra-2036", "3\\sqrt{13}",
     ["\\boxed{3\\sqrt{13}}", "\\boxed{3 \\sqrt {13}}", "\\boxed{\\sqrt{117}}"],
     ["\\boxed{3\\sqrt{31}}", "\\boxed{\\sqrt{39}}"]),
    ("math500", "math500-test-prealgebra-1302", "11\\sqrt2",
     ["\\boxed{11\\sqrt{2}}", "\\boxed{11 \\sqrt 2}"],
     ["\\boxed{11}", "\\boxed{2\\sqrt{11}}"]),
    ("math500", "math500-test-algebra-1519", "\\frac{\\sqrt{3}}{3}",
     ["\\boxed{\\frac{\\sqrt{3}}{3}}", "\\boxed{\\frac{1}{\\sqrt{3}}}", "\\boxed{\\dfrac{\\sqrt3}{3}}"],
     ["\\boxed{\\sqrt{3}}", "\\boxed{\\frac{\\sqrt{3}}{2}}"]),
    ("math500", "math500-test-prealgebra-1003", "\\frac{270}7\\text{ degrees}",
     ["\\boxed{\\frac{270}{7}}", "\\boxed{\\frac{270}{7}^\\circ}", "\\boxed{\\frac{270}{7}\\text{ degrees}}"],
     ["\\boxed{\\frac{270}{17}}", "\\boxed{38}"]),
    ("math500", "math500-test-counting_and_probability-508", "10,\\!080",
     ["\\boxed{10080}", "\\boxed{10,080}", "\\boxed{10{,}080}"],
     ["\\boxed{1008}", "\\boxed{10,800}"]),
    ("math500", "math500-test-algebra-2626", "\\$32,\\!348",
     ["\\boxed{\\$32,348}", "\\boxed{32348}", "\\boxed{\\$32,\\!348}"],
     ["\\boxed{\\$32,384}", "\\boxed{32,347}"]),
    ("math500", "math500-test-precalculus-1300",
     "\\begin{pmatrix} -1/3 \\\\ 2/3 \\\\ 5/3 \\end{pmatrix}",
     ["\\boxed{\\begin{pmatrix} -\\frac{1}{3} \\\\ \\frac{2}{3} \\\\ \\frac{5}{3} \\end{pmatrix}}",
      "\\boxed{\\begin{pmatrix} -1/3 \\\\ 2/3 \\\\ 5/3 \\end{pmatrix}}"],
     ["\\boxed{\\begin{pmatrix} -1/3 \\\\ 2/3 \\\\ 4/3 \\end{pmatrix}}",
      "\\boxed{\\begin{pmatrix} -1/3 \\\\ 2/3 \\end{pmatrix}}"]),
    ("math500", "math500-test-precalculus-695", "(-\\infty, 0]",
     ["\\boxed{(-\\infty,0]}", "\\boxed{\\left(-\\infty, 0\\right]}"],
     ["\\boxed{(-\\infty, 0)}", "\\boxed{[0, \\infty)}"]),
    ("math500", "math500-test-intermediate_algebra-1992", "(0,9) \\cup (9,36)",
     ["\\boxed{(0, 9) \\cup (9, 36)}"],
     ["\\boxed{(0,36)}", "\\boxed{(0,9] \\cup (9,36)}"]),
    ("math500", "math500-test-algebra-101", "x \\in [-2,7]",
     ["\\boxed{[-2,7]}", "\\boxed{x \\in [-2, 7]}"],
     ["\\boxed{(-2,7)}", "\\boxed{[-7,2]}"]),
    ("math500", "math500-test-intermediate_algebra-428", "3, 5, 7",
     ["\\boxed{3, 5, 7}", "\\boxed{7,5,3}", "\\boxed{x=3, x=5, x=7}"],
     ["\\boxed{3, 5}", "\\boxed{3, 5, 8}"]),
    ("math500", "math500-test-intermediate_algebra-2015", "\\{1\\pm\\sqrt{5},-2\\}",
     ["\\boxed{\\{-2, 1\\pm\\sqrt{5}\\}}", "\\boxed{\\{1 \\pm \\sqrt{5}, -2\\}}"],
     ["\\boxed{\\{1\\pm\\sqrt{5}\\}}", "\\boxed{\\{1\\pm\\sqrt{5},2\\}}"]),
    ("math500", "math500-test-precalculus-819", "\\text{(C)}",
     ["\\boxed{\\text{(C)}}", "\\boxed{C}", "\\boxed{(C)}", "\\boxed{\\textbf{(C)}}"],
     ["\\boxed{(B)}", "\\boxed{\\text{(E)}}"]),
    ("math500", "math500-test-geometry-826", "1\\frac{4}{5}",
     ["\\boxed{\\frac{9}{5}}", "\\boxed{1.8}", "\\boxed{1\\frac{4}{5}}"],
     ["\\boxed{\\frac{4}{5}}", "\\boxed{\\frac{5}{9}}"]),
    ("math500", "math500-test-intermediate_algebra-515", "\\frac43",
     ["\\boxed{\\frac{4}{3}}", "\\boxed{4/3}"],
     ["\\boxed{\\frac{3}{4}}", "\\boxed{1.33}"]),
    ("math500", "math500-test-geometry-473", "864 \\mbox{ inches}^2",
     ["\\boxed{864}", "\\boxed{864 \\text{ square inches}}", "\\boxed{864\\text{ in}^2}"],
     ["\\boxed{846}", "\\boxed{432}"]),
    ("math500", "math500-test-intermediate_algebra-1994", "p - q",
     ["\\boxed{p-q}", "\\boxed{p - q}"],
     ["\\boxed{q-p}", "\\boxed{p+q}"]),
    ("math500", "math500-test-precalculus-990", "6 - 5i",
     ["\\boxed{6-5i}"],
     ["\\boxed{6+5i}", "\\boxed{6}"]),
    ("math500", "math500-test-algebra-2193", "x=5",
     ["\\boxed{5}", "\\boxed{x = 5}", "so $x = \\boxed 5$.", "\\fbox{5}"],
     ["\\boxed{x=-5}", "\\boxed{6}"]),
    ("math500", "math500-test-number_theory-864", "52_8",
     ["\\boxed{52_8}", "\\boxed{52_{8}}"],
     ["\\boxed{42_8}", "\\boxed{52}"]),
    # ---- OlympiadBench: gold lists, several answers, percentages, cube roots
    ("olympiadbench", "olympiadbench-1606", "2",
     ["\\boxed{2}", "Hence the minimum number of moves is $\\boxed{2}$."],
     ["\\boxed{3}", "\\boxed{20}"]),
    ("olympiadbench", "olympiadbench-1618", "$(1,8,19), (2,7,13), (4,5,7)$",
     ["\\boxed{(1,8,19),(2,7,13),(4,5,7)}", "\\boxed{(4,5,7), (1,8,19), (2,7,13)}"],
     ["\\boxed{(1,8,19),(2,7,13)}", "\\boxed{(1,19,8),(2,7,13),(4,5,7)}"]),
    ("olympiadbench", "olympiadbench-1610", "$\\frac{1}{2 n+2}$",
     ["\\boxed{\\dfrac{1}{2n+2}}", "\\boxed{\\frac{1}{2 n + 2}}"],
     ["\\boxed{\\frac{1}{2n+1}}", "\\boxed{\\frac{1}{2}}"]),
    ("olympiadbench", "olympiadbench-2255", "62.5%",
     ["\\boxed{62.5\\%}", "\\boxed{62.5}"],
     ["\\boxed{65\\%}", "\\boxed{37.5\\%}"]),
    ("olympiadbench", "olympiadbench-1664", "$69$,$84$",
     ["\\boxed{69, 84}", "\\boxed{84,69}", "\\boxed{n = 69, n = 84}"],
     ["\\boxed{69}", "\\boxed{69, 85}"]),
    ("olympiadbench", "olympiadbench-2099", "$90^{\\circ}$,$60^{\\circ}$",
     ["\\boxed{90^\\circ, 60^\\circ}", "\\boxed{90, 60}"],
     ["\\boxed{90^\\circ, 30^\\circ}", "\\boxed{90^\\circ}"]),
    ("olympiadbench", "olympiadbench-1675", "$k=1$",
     ["\\boxed{1}", "\\boxed{k = 1}"],
     ["\\boxed{k=2}", "\\boxed{k \\geq 1}"]),
    ("olympiadbench", "olympiadbench-2410", "$[\\frac{1}{2}, 8]$",
     ["\\boxed{\\left[\\tfrac12, 8\\right]}", "\\boxed{[0.5,8]}"],
     ["\\boxed{(\\frac{1}{2}, 8)}", "\\boxed{[\\frac{1}{2}, 9]}"]),
    ("olympiadbench", "olympiadbench-2035", "$\\frac{8}{\\sqrt[3]{7}}$",
     ["\\boxed{\\frac{8}{\\sqrt[3]{7}}}", "\\boxed{\\frac{8\\sqrt[3]{49}}{7}}"],
     ["\\boxed{\\frac{8}{\\sqrt{7}}}", "\\boxed{\\frac{8}{7}}"]),
]


@pytest.mark.parametrize(
    "dataset,qid,gold,rights,wrongs", CASES, ids=[f"{c[1]}" for c in CASES]
)
def test_real_gold_cases(dataset, qid, gold, rights, wrongs):
    problem = _problems(dataset)[qid]
    assert problem.gold == gold
    for completion in rights:
        ok, extracted = is_correct(completion, problem.gold, problem.grader)
        assert ok, f"should be right: {completion!r} (extracted {extracted!r}) vs {gold!r}"
    for completion in wrongs:
        ok, extracted = is_correct(completion, problem.gold, problem.grader)
        assert not ok, f"should be wrong: {completion!r} (extracted {extracted!r}) vs {gold!r}"


def test_olympiadbench_gold_list_string_unwraps():
    # a results file or a user's JSONL may hold the gold as the list's string form
    assert is_correct("\\boxed{2}", "['2']", "math") == (True, "2")
    assert is_correct("\\boxed{3}", "['2']", "math")[0] is False
    assert is_correct("\\boxed{69, 84}", "['$69$,$84$']", "math")[0]


def test_gsm8k_worked_gold_uses_text_after_hashes():
    worked = "9 * 2 = <<9*2=18>>18 dollars\n#### 18"
    assert is_correct("\\boxed{18}", worked, "numeric")[0]
    assert not is_correct("\\boxed{9}", worked, "numeric")[0]


def test_numeric_fractions_percent_and_negatives():
    assert answers_match("\\frac{1}{2}", "0.5", "numeric")
    assert answers_match("1/2", "0.5", "numeric")
    assert answers_match("50\\%", "50", "numeric")
    assert answers_match("-3", "-3.00", "numeric")
    assert not answers_match("3", "-3", "numeric")
    # a hyphen between numbers is subtraction, not a sign: last number is 5
    assert extract_answer("The range 10-5", "numeric") == "5"
    assert is_correct("It costs $\\frac{3}{4}$ of a dollar.", "0.75", "numeric")[0]


def test_numeric_clock_time_reads_as_hours():
    # GSM8K test 01001: "what time" with gold 2; the answer 2:00 pm was graded by its minutes
    assert is_correct("\\boxed{2:00 \\text{ pm}}", "2", "numeric") == (True, "2:00 \\text{ pm}")
    assert answers_match("10:00 a.m.", "10", "numeric")
    assert not answers_match("3:00 pm", "2", "numeric")
    assert not answers_match("2:30 pm", "2", "numeric")
    assert answers_match("2:30", "2.5", "numeric")
    # not a clock: a ratio still reads as its last number
    assert parse_number("3:1") == 1


def test_extraction_details():
    assert last_boxed("\\boxed{\\frac{a}{b^{2}}}") == "\\frac{a}{b^{2}}"
    assert last_boxed("first \\boxed{1} then \\boxed{2}") == "2"
    # a box cut off by max_tokens is skipped in favour of the previous complete one
    assert last_boxed("\\boxed{5} and finally \\boxed{\\frac{1}{") == "5"
    assert last_boxed("\\boxed{\\{1,2\\}}") == "\\{1,2\\}"
    assert last_boxed("no box here") is None
    assert extract_answer("", "math") is None
    assert extract_answer("I am not sure.", "math") is None
    assert is_correct("I am not sure.", "5", "math") == (False, None)
    assert extract_answer("Total: 5 apples.\n#### 12\nDone 3", "numeric") == "12"
    # the box wins over numbers written after it
    assert is_correct("\\boxed{18}. Check: 18 - 2 = 16", "18", "numeric")[0]


def test_normalize_math_examples():
    assert normalize_math("\\left( 3, \\frac{\\pi}{2} \\right)") == "(3,\\frac{\\pi}{2})"
    assert normalize_math("\\dfrac{17}{50}") == "\\frac{17}{50}"
    assert normalize_math("\\frac 59") == "\\frac{5}{9}"
    assert normalize_math("10,\\!080") == "10080"
    assert normalize_math("\\text{(C)}") == "c"
    assert normalize_math("x \\in [-2,7]") == "[-2,7]"
    assert normalize_math("\\displaystyle 5.") == "5"
    assert normalize_math(".35625") == "0.35625"


def test_expressions_in_one_letter_variables_compare_by_value():
    # a MATH-500 row (intermediate_algebra-431) the grader once failed: the same factors swapped
    assert answers_match("(b + 2)(a + 5)", "(a+5)(b+2)", "math")
    assert answers_match("-1+x-x^2+x^3-x^4+x^5", "x^5 - x^4 + x^3 - x^2 + x - 1", "math")
    assert answers_match("-5i+6", "6 - 5i", "math")
    assert answers_match("2 n", "2n", "math")
    # only rearrangements: equal in value is not enough where the question's own expression
    # (unfactored, unsimplified) would be its answer's equal
    for wrong, gold in [("x^2-1", "(x+1)(x-1)"), ("ab+2a+5b+10", "(a+5)(b+2)"),
                        ("\\frac{x+1}{2}", "\\frac{1}{2}x+\\frac12"),
                        ("(a+5)(b+3)", "(a+5)(b+2)"), ("x^3 + 4x - 6", "x^3+3x-6"),
                        ("x^5 - x^4 - x^3 - x^2 - x - 1", "x^5 - x^4 + x^3 - x^2 + x - 1"),
                        ("3+9i", "6+9i"), ("-\\frac{1}{2} q", "p - q"), ("x", "y"),
                        ("\\text{seat}", "\\text{East}"),  # words are not products of letters
                        ("\\sec x \\csc x", "\\cot x")]:  # other commands are not evaluated
        assert not answers_match(wrong, gold, "math"), (wrong, gold)


def test_unknown_grader_is_rejected():
    with pytest.raises(ValueError):
        is_correct("\\boxed{1}", "1", "fuzzy")


# Every gold of every preset must grade correct against a completion that boxes it.
# Measured: 100% for all six presets (gsm8k 1319/1319, gsm8k-train 7473/7473,
# math500 500/500, aime24 30/30, amc23 40/40, olympiadbench 675/675). Exceptions allowed
# below must be listed by qid; there are none.
KNOWN_SELF_GRADE_EXCEPTIONS: dict[str, set[str]] = {name: set() for name in PRESETS}


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_gold_grades_correct_against_itself(name):
    failures = []
    problems = list(_problems(name).values())
    for p in problems:
        completion = (
            "Let me work through this step by step. 2 + 3 = 5, so we continue.\n"
            f"Therefore, the final answer is $\\boxed{{{p.gold}}}$."
        )
        ok, extracted = is_correct(completion, p.gold, p.grader)
        if not ok:
            failures.append((p.qid, p.gold, extracted))
    unexpected = [f for f in failures if f[0] not in KNOWN_SELF_GRADE_EXCEPTIONS[name]]
    assert not unexpected, f"{name}: {len(failures)}/{len(problems)} golds fail: {unexpected[:10]}"
    assert len(failures) <= 0.01 * len(problems)
