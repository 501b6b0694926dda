"""What a user meets before anything runs: --help (defaults, lossless note, plain
metavars, llama.cpp's short names) and the one-line rejection of bad --tensor-split."""

from __future__ import annotations

import re

import pytest
import typer.main
from typer.testing import CliRunner

from easd_local.cli import app

runner = CliRunner()
COMMANDS = [("generate",), ("chat",), ("serve",), ("bench",), ("calibrate",), ("pull",), ("models", "add-pair"),
            ("models", "inspect"), ("models", "check"), ("models", "verify"), ("pair", "score"), ("quantize",)]


def _flat(text: str) -> str:
    """Help text as one line: box drawing and line wraps become single spaces."""
    return " ".join(re.sub("[│╭╮╰╯─]", " ", text).split())


def _help(*cmd: str) -> str:
    # (typer reads TERMINAL_WIDTH once, when its help renderer is first imported)
    r = runner.invoke(app, [*cmd, "--help"], env={"COLUMNS": "80", "TERMINAL_WIDTH": "80"})
    assert r.exit_code == 0, r.output
    return r.stdout


def _command(*names: str):
    cmd = typer.main.get_command(app)
    for n in names:
        cmd = cmd.commands[n]
    return cmd


@pytest.mark.parametrize("cmd", COMMANDS, ids=" ".join)
def test_help_has_plain_metavars_and_usage(cmd):
    out = _help(*cmd)
    for bad in ("<bool>", "<str>", "<int>", "<float>", "<path>", "{"):
        assert bad not in out, f"{bad} in {' '.join(cmd)} --help"
    assert max(len(line) for line in out.splitlines()) <= 80


def _all_commands(cmd=None, path=()):
    cmd = cmd or typer.main.get_command(app)
    yield path, cmd
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from _all_commands(sub, (*path, name))


@pytest.mark.parametrize("path,cmd", list(_all_commands()), ids=lambda x: " ".join(x) if isinstance(x, tuple) else "")
def test_every_option_shows_its_default(path, cmd):
    """Flags are off unless given; every other option either has a default typer shows
    or says its default in its help (generate and chat: in typer's [default: ...] form)."""
    for p in cmd.params:
        # (typer vendors its own click: tell options by their kind, not by class)
        if getattr(p, "param_type_name", "") != "option" or p.is_flag or p.name == "help" or p.required:
            continue
        shown = p.default is not None and p.show_default is not False
        text = p.help or ""
        said = "[default:" in text if path in (("generate",), ("chat",)) else "default" in text.lower()
        assert shown or said, (path, p.name)


def test_chat_and_generate_defaults_differ_and_say_why():
    gen, chat = _flat(_help("generate")), _flat(_help("chat"))
    assert "[default: 512]" in gen and "[default: 1024]" in chat
    assert "[default: 0.7]" in chat
    # the reason is printed where they differ, in both
    assert "greedy" in gen and "repeat" in gen
    assert "greedy" in chat and "chat UIs" in chat
    for out in (gen, chat):
        assert "not lossless" in out and "--mode sd" in out
        # docs/commands.md: easd, easd-tf and draft are not lossless, and --help says so
        assert "nor is draft" in out


def test_generate_and_chat_describe_the_default_by_the_one_rule():
    """The default way is chosen by ``ways.choose``; both commands' help read its words from
    ``options.AUTO_MODE_RULE`` (generate's had kept an older rule, easd-tf on a CPU build)."""
    from easd_local.cli.options import AUTO_MODE_RULE
    rule = " ".join(AUTO_MODE_RULE.split())
    for cmd in ("generate", "chat"):
        out = _flat(_help(cmd))
        assert f"Default mode ({rule})" in out, cmd
        assert "easd-tf on a CPU build" not in out


@pytest.mark.parametrize("alias,long", [
    ("-m", "--target"), ("-md", "--draft"), ("-c", "--ctx"), ("-n", "--max-tokens"), ("-t", "--threads"),
    ("-ngl", "--n-gpu-layers"), ("-ngld", "--n-gpu-layers-draft"), ("-s", "--seed"), ("--draft-max", "--gamma"),
    ("--temp", "--temperature"), ("-ts", "--tensor-split"), ("-fa", "--flash-attn"),
])
@pytest.mark.parametrize("cmd", ["generate", "chat"])
def test_llama_cpp_short_names(cmd, alias, long):
    params = {o: p for p in _command(cmd).params for o in p.opts}
    assert params[alias] is params[long]


@pytest.mark.parametrize("text", ["a,b", "-1,2", "0,0"])
def test_bad_tensor_split_is_one_line_before_loading(text, tmp_path):
    """-ts, llama.cpp's short name (the parser itself: tests/test_rpc.py)."""
    missing = tmp_path / "nope.gguf"
    r = runner.invoke(app, ["generate", "hi", "-ts", text, "-m", str(missing), "-md", str(missing)])
    assert r.exit_code == 2 and "--tensor-split" in r.stderr and "file not found" not in r.output
    assert len(r.stderr.strip().splitlines()) == 1
