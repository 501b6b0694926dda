"""The chat's slash-command table (easd_local.chat.commands) is the one definition of the
commands: it dispatches them, writes /help and `chat --help`, and refuses anything else with
one clean line. On the tiny real target (llama.cpp), without a draft."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("llama_cpp")

from typer.testing import CliRunner  # noqa: E402

from easd_local.chat import CHAT_DEFAULTS, ChatSession, TranscriptWriter, commands  # noqa: E402
from easd_local.chat.commands import COMMANDS, Command, CommandResult  # noqa: E402
from easd_local.cli import app  # noqa: E402
from easd_local.cli.chat import KEYS  # noqa: E402
from easd_local.engine.pair import open_models  # noqa: E402
from easd_local.llamacpp.runtime import LoadOptions  # noqa: E402


@pytest.fixture
def session(tiny_target, tmp_path):
    with open_models(None, tiny_target, LoadOptions(n_ctx=256, n_threads=1)) as pair:
        s = ChatSession(pair.target, None, CHAT_DEFAULTS.replace(mode="target", max_tokens=4), n_vocab=pair.n_vocab,
                        transcript=TranscriptWriter(tmp_path / "t.jsonl"), label="t")
        yield s
        s.close()


def _events(tmp_path) -> list[str]:
    return [json.loads(line)["event"] for line in (tmp_path / "t.jsonl").read_text().splitlines()]


def test_help_is_written_from_the_table(session):
    res = session.command("/help")
    assert res.ok and res.kind == "help"
    lines = res.message.splitlines()
    assert len(lines) == len(COMMANDS)
    for line, cmd in zip(lines, COMMANDS):
        assert line.startswith(cmd.usage + " ") and line.endswith(cmd.help)
    assert session.command("/?").message == res.message  # an alias runs the same command


def test_a_command_added_to_the_table_is_run_and_listed(session, monkeypatch):
    seen = []

    def echo(s, arg):
        seen.append((s, arg))
        return CommandResult(True, f"echo {arg}", kind="echo")

    monkeypatch.setattr(commands, "COMMANDS", COMMANDS + (Command("echo", "TEXT", "say TEXT back", echo, aliases=("e",)),))
    assert session.command("/Echo  hello there ").message == "echo hello there"
    assert session.command("/e x").message == "echo x"
    assert seen == [(session, "hello there"), (session, "x")]
    assert session.command("/help").message.splitlines()[-1].startswith("/echo TEXT")
    assert commands.synopsis().endswith("/quit, /echo TEXT")


@pytest.mark.parametrize("line, name", [("/frobnicate now", "frobnicate"), ("/", ""), ("/  ", ""),
                                        ("/mode2 sd", "mode2")])
def test_unknown_commands_are_refused_with_one_line(session, tmp_path, line, name):
    before = (session.cfg, session.system, list(session.messages), _events(tmp_path))
    res = session.command(line)
    assert (res.ok, res.quit, res.kind) == (False, False, "unknown")
    assert res.message == f"unknown command /{name}; /help lists the commands"
    assert (session.cfg, session.system, list(session.messages), _events(tmp_path)) == before


def test_a_bad_value_is_the_commands_error_not_an_exception(session, tmp_path):
    res = session.command("/mode warp")
    assert (res.ok, res.kind) == (False, "mode") and res.message.startswith("mode must be one of")
    res = session.command("/system caf\udce9")  # a lone surrogate: bytes that were not UTF-8
    assert (res.ok, res.kind) == (False, "system") and session.system is None
    res = session.command("/set top-p 2")
    assert (res.ok, res.kind) == (False, "set") and session.cfg.top_p == CHAT_DEFAULTS.top_p
    assert not {"mode", "set", "system"} & set(_events(tmp_path))  # nothing changed, nothing logged


def test_mode_takes_the_way_label_the_banner_shows(session, tmp_path):
    """`/mode sd:ngram-simple` (the banner's and /about's name for the way) sets the mode and its
    drafters at once; prompt lookup loads no draft model (this session has none)."""
    res = session.command("/mode SD:ngram-simple")
    assert res.ok and res.message.startswith("mode sd:ngram-simple (lossless")
    assert (session.cfg.mode, session.cfg.spec_type) == ("sd", "ngram-simple")
    assert "sd:ngram-simple" in session.command("/mode").message  # the usage line names the way in force
    res = session.command("/mode sd:nope")
    assert (res.ok, res.kind) == (False, "mode") and "unknown drafter 'nope'" in res.message
    assert session.cfg.spec_type == "ngram-simple"
    assert [json.loads(line).get("spec_type") for line in (tmp_path / "t.jsonl").read_text().splitlines()
            if json.loads(line)["event"] == "mode"] == ["ngram-simple"]


def test_every_setting_that_set_lists_is_accepted(session):
    help_line = next(c.help for c in COMMANDS if c.name == "set")
    keys = help_line.split(": ", 1)[1].split(", ")
    assert "tau-target" in keys and "mode" not in keys  # /mode switches modes
    settings = session.settings()
    for key in keys:
        res = session.command(f"/set {key} {settings[key.replace('-', '_')]}")
        assert (res.ok, res.message) == (True, "unchanged"), key


def test_cli_help_lists_the_table_and_the_keys(tiny_draft, tiny_target, tmp_path, monkeypatch):
    monkeypatch.setenv("EASD_LOCAL_HOME", str(tmp_path))
    r = CliRunner().invoke(app, ["chat", "--draft", str(tiny_draft), "--target", str(tiny_target), "--threads", "1",
                                 "--ctx", "256"],
                           input="/help\n/nope\n")
    assert r.exit_code == 0, r.output
    for cmd in COMMANDS:
        assert cmd.usage in r.output
    assert KEYS in r.output  # the keys are the CLI's, added after the table's lines
    assert "unknown command /nope; /help lists the commands" in r.output
    r = CliRunner().invoke(app, ["chat", "--help"], env={"COLUMNS": "400"})
    assert r.exit_code == 0
    assert commands.synopsis() in " ".join(r.output.split())
