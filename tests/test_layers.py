"""The package's shape: no import cycle (type-only and in-function imports included), no
class past 250 lines, and one place for the gate's predicate. Read from the source with
``ast`` by scripts/import_graph.py, nothing imported."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tool():
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["import_graph"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_no_import_cycle():
    tool = _tool()
    g = tool.graph()
    assert "easd_local.engine.scheduler" in g["easd_local.engine.decoding"]  # generate sits above it
    assert tool.cycles(g) == []


def test_the_checker_sees_cycles_of_every_kind(tmp_path):
    """A cycle through a type-only import and one through an in-function import are found."""
    tool = _tool()
    pkg = tmp_path / "easd_local"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n")
    (pkg / "b.py").write_text("from . import a\n")
    (pkg / "sub" / "c.py").write_text("def f():\n    from ..d import x\n")
    (pkg / "d.py").write_text("from .sub import c\n")
    assert tool.cycles(tool.graph(tmp_path)) == [["easd_local.a", "easd_local.b"],
                                                  ["easd_local.d", "easd_local.sub.c"]]


def test_no_class_past_250_lines():
    longest = _tool().longest_classes(top=1)[0]
    assert longest[0] < 250, longest


def test_the_gate_predicate_is_written_once():
    """``H_d >= tau_d and H_t >= tau_t and O >= tau_O`` as code appears only in engine/gate.py."""
    pattern = re.compile(r">=\s*(self\.)?tau_draft\b.*\n?.*>=\s*(self\.)?tau_target\b|"
                         r">=\s*(self\.)?tau_target\b.*\n?.*>=\s*(self\.)?tau_draft\b")
    hits = [p.relative_to(ROOT).as_posix() for p in (ROOT / "easd_local").rglob("*.py")
            if pattern.search("\n".join(line for line in p.read_text().splitlines()
                                        if not line.lstrip().startswith("#")))]
    assert hits == ["easd_local/engine/gate.py"], hits
