"""`easd-local chat` and its session core, on the tiny real GGUF pair (llama.cpp)."""
from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp")

from typer.testing import CliRunner  # noqa: E402

from easd_local.chat import session as chat_mod  # noqa: E402
from easd_local.chat import CHAT_DEFAULTS, ChatSession, Notice, Reply, TranscriptWriter  # noqa: E402
from easd_local.cli import app  # noqa: E402
from easd_local.engine.decoding import TokenEvent  # noqa: E402
from easd_local.errors import ContextOverflowError  # noqa: E402
from easd_local.engine.pair import open_models  # noqa: E402
from easd_local.llamacpp.runtime import LoadOptions, Model  # noqa: E402


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    h = tmp_path / "home"
    monkeypatch.setenv("EASD_LOCAL_HOME", str(h))
    return h


def _args(draft, target, *extra):
    return ["chat", "--draft", str(draft), "--target", str(target), "--threads", "1", *extra]


def _transcript_rows(home: Path) -> list[dict]:
    files = sorted((home / "transcripts").glob("chat-*.jsonl"))
    assert len(files) == 1, files
    lines = files[0].read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]  # every line parses


def _session(draft, target, tmp_path, n_ctx=1024, **cfg):
    pair = open_models(draft, target, LoadOptions(n_ctx=n_ctx, n_threads=1))
    tw = TranscriptWriter(tmp_path / "t.jsonl")
    s = ChatSession(pair.target, pair.draft, CHAT_DEFAULTS.replace(**{"max_tokens": 12, **cfg}),
                    n_vocab=pair.n_vocab, transcript=tw, label="tiny")
    return pair, s


def _n_status(output: str) -> int:
    """How many per-reply status lines (render.status_line) the output holds."""
    return len(re.findall(r"^(?:easd|sd|target|draft|easd-tf) · \d+ tokens · ", output, flags=re.M))


def _drain(stream) -> tuple[list, Reply]:
    events = list(stream)
    assert isinstance(events[-1], Reply)
    return events[:-1], events[-1]


# --------------------------------------------------------------------------- CLI, piped
def test_chat_two_turns_and_commands(tiny_draft, tiny_target, home, tmp_path):
    saved_json = tmp_path / "conv.json"
    saved_md = tmp_path / "conv.md"
    script = "\n".join([
        "hello there",
        "/mode sd",
        "/set gamma 2",
        "/set gamma 0",
        "/set nope 1",
        "/set temperature",
        "/frobnicate",
        "/mode warp",
        "how are you?",
        "/stats",
        "/system You are terse.",
        f"/save {saved_json}",
        f"/save {saved_md}",
        "/save",
        "/help",
        "/reset",
        "/stats",
        "/quit",
        "never read",
    ]) + "\n"
    r = CliRunner().invoke(app, _args(tiny_draft, tiny_target, "--max-tokens", "12"), input=script)
    assert r.exit_code == 0, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    out = r.output
    assert "Traceback" not in out
    assert _n_status(out) == 2  # one status line per reply
    assert "mode sd" in out
    assert "gamma = 2" in out
    assert "gamma must be >= 1" in out
    assert "unknown setting 'nope'" in out
    assert "usage: /set KEY VALUE" in out
    assert "unknown command /frobnicate" in out
    assert "mode must be one of" in out
    assert "turns 2 (0 interrupted)" in out
    assert "settings: mode=sd" in out and "gamma=2" in out
    assert "turns 2" in out and "0/0 messages in context" in out  # /stats after /reset
    assert "/set KEY VALUE" in out  # /help

    data = json.loads(saved_json.read_text())
    assert [m["role"] for m in data["messages"]] == ["user", "assistant", "user", "assistant"]
    assert data["messages"][0]["content"] == "hello there"
    assert data["system"] == "You are terse."
    assert data["settings"]["mode"] == "sd" and data["settings"]["gamma"] == 2
    md = saved_md.read_text()
    assert "## User" in md and "how are you?" in md and "You are terse." in md
    assert list((home / "transcripts").glob("chat-*.json"))  # /save with no path

    rows = _transcript_rows(home)
    kinds = [row["event"] for row in rows]
    assert kinds[0] == "session_start" and kinds[-1] == "session_end"
    # the default way (nothing measured: the target alone) does not load the draft model; /mode sd does
    assert rows[0]["draft"] is None and rows[0]["settings"]["temperature"] == 0.7
    assert [row["draft"] for row in rows if row["event"] == "draft_loaded"] == [str(tiny_draft)]
    assert kinds.count("user") == 2 and kinds.count("assistant") == 2
    assert "mode" in kinds and "set" in kinds and "system" in kinds and "reset" in kinds
    replies = [row for row in rows if row["event"] == "assistant"]
    from easd_local.engine.ways import auto_mode
    from easd_local.llamacpp.devices import gpu_offload_supported

    assert replies[0]["stats"]["mode"] == auto_mode(gpu_offload_supported(), True).mode
    assert replies[1]["stats"]["mode"] == "sd"
    assert replies[1]["stats"]["gamma"] == 2 and replies[0]["stats"]["tokens"] == 12


def test_chat_eof_and_empty_stdin_exit_zero(tiny_draft, tiny_target, home):
    r = CliRunner().invoke(app, _args(tiny_draft, tiny_target, "--max-tokens", "4"), input="")
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, _args(tiny_draft, tiny_target, "--max-tokens", "4"), input="hi")  # no newline
    assert r.exit_code == 0, r.output
    assert _n_status(r.output) == 1


def test_chat_subprocess_closed_stdin_and_pipe(tiny_draft, tiny_target, home):
    env = {**os.environ, "EASD_LOCAL_HOME": str(home)}
    exe = [sys.executable, "-c", "from easd_local.cli import main; main()"]
    p = subprocess.run(exe + _args(tiny_draft, tiny_target, "--max-tokens", "4"), stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    p = subprocess.run(exe + _args(tiny_draft, tiny_target, "--max-tokens", "6", "--mode", "target",
                                   "--show-origin", "--system", "Be brief."),
                       input="first line \\\ncontinued\nsecond\n", capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "\x1b[" not in p.stdout  # no colour codes into a pipe
    assert p.stderr.count("target · 6 tokens") == 2
    rows = [json.loads(x) for f in (home / "transcripts").glob("chat-*.jsonl")
            for x in f.read_text().splitlines()]
    users = [r["content"] for r in rows if r["event"] == "user"]
    assert users == ["first line \ncontinued", "second"]
    replies = [r["content"] for r in rows if r["event"] == "assistant"]
    # stdout holds the two replies and nothing else (no prompts, no echo)
    assert p.stdout == "".join(t if t.endswith("\n") else t + "\n" for t in replies)


def test_chat_help_mentions_defaults():
    r = CliRunner().invoke(app, ["chat", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0
    text = " ".join(r.output.split())
    assert "temperature 0.7" in text and "top-k 40" in text and "top-p 0.95" in text and "1024" in text
    for flag in ("--tau-draft", "--tau-target", "--gamma", "--penalty", "--system", "--show-origin", "--ctx"):
        assert flag in text


def test_chat_bad_flag_fails_before_loading(home):
    r = CliRunner().invoke(app, ["chat", "--draft", "nope.gguf", "--target", "nope.gguf", "--gamma", "0"])
    assert r.exit_code == 2
    assert "gamma must be >= 1" in r.output


# --------------------------------------------------------------------------- context
def test_chat_context_trim_and_refusal_cli(tiny_draft, tiny_target, home):
    huge = "the cat sat on the mat and then " * 40
    msgs = [f"message number {i} is about ordinary things" for i in range(6)]
    script = "\n".join(msgs[:3] + [huge] + msgs[3:] + ["/stats"]) + "\n"
    r = CliRunner().invoke(app, _args(tiny_draft, tiny_target, "--ctx", "128", "--max-tokens", "16"), input=script)
    assert r.exit_code == 0, r.output
    assert "Traceback" not in r.output
    # llama.cpp rounds the context up (128 -> 256); the note names the real size
    n_ctx = int(re.search(r"context (\d+) tokens", r.output).group(1))
    assert 128 <= n_ctx <= 512
    assert "oldest message" in r.output and f"to fit the {n_ctx}-token context" in r.output
    assert "message not sent" in r.output and "raise --ctx" in r.output
    assert _n_status(r.output) == 6  # every normal message got a reply
    rows = _transcript_rows(home)
    assert any(row["event"] == "trim" for row in rows)
    assert any(row["event"] == "refused" for row in rows)
    assert huge not in [row.get("content") for row in rows if row["event"] == "user"]


def test_session_trim_keeps_system_and_refuses_huge(tiny_draft, tiny_target, tmp_path):
    pair, s = _session(tiny_draft, tiny_target, tmp_path, n_ctx=128, max_tokens=16, mode="target")
    with pair:
        s.system = "Answer briefly."
        notices = []
        for i in range(6):
            events, reply = _drain(s.send(f"turn {i}: tell me something"))
            notices += [e for e in events if isinstance(e, Notice)]
            assert len(s.render()) <= s.n_ctx
        assert notices, "history should have been trimmed"
        ctx = s.context_messages()
        assert ctx[0] == {"role": "system", "content": "Answer briefly."}
        assert ctx[1]["role"] == "user"  # whole turns dropped
        assert any(not m.in_context for m in s.messages)
        n_before = len(s.messages)
        with pytest.raises(ContextOverflowError, match="message not sent"):
            s.send("word " * 300)
        assert len(s.messages) == n_before
        _drain(s.send("still here?"))
        assert s.messages[-2].content == "still here?"
        saved = json.loads(s.save(tmp_path / "s.json").read_text())
        assert any(m.get("in_context") is False for m in saved["messages"])
        s.close()


# --------------------------------------------------------------------------- KV reuse
def test_second_turn_evaluates_only_new_tokens(tiny_draft, tiny_target, tmp_path, monkeypatch):
    evaluated: dict[str, int] = {"target": 0, "draft": 0}
    real_decode = Model.decode_batch

    def counting(self, parts, **kw):
        who = "draft" if "draft" in self.path.name else "target"
        evaluated[who] += sum(len(p.tokens) for p in parts)
        return real_decode(self, parts, **kw)

    monkeypatch.setattr(Model, "decode_batch", counting)
    pair, s = _session(tiny_draft, tiny_target, tmp_path, mode="sd", max_tokens=8, temperature=0.0)
    with pair:
        s.system = "You are a helpful assistant who answers every question in a calm and precise manner."
        _, r1 = _drain(s.send("Please tell me about the weather in the mountains in the early spring."))
        first = dict(evaluated)
        assert first["target"] >= r1.stats.prompt_tokens - 1
        evaluated.update(target=0, draft=0)
        _, r2 = _drain(s.send("And in summer?"))
        prompt2 = r2.stats.prompt_tokens
        assert prompt2 > r1.stats.prompt_tokens + r1.stats.tokens
        new_tokens = prompt2 - r1.stats.prompt_tokens - r1.stats.tokens  # template glue + the message
        # generation of 8 tokens with gamma 4 costs at most 8 verify calls of <= 5 tokens
        budget = new_tokens + 8 * (s.cfg.gamma + 1) + 4
        assert evaluated["target"] <= budget, (evaluated, prompt2, new_tokens)
        assert evaluated["target"] < prompt2 / 2
        assert evaluated["draft"] <= budget
        s.close()


# --------------------------------------------------------------------------- Ctrl-C
def test_interrupt_inside_generation_keeps_partial(tiny_draft, tiny_target, tmp_path, monkeypatch):
    real_generate = chat_mod.generate
    state = {"armed": True}

    def interrupting(*a, **kw):
        for i, ev in enumerate(real_generate(*a, **kw)):
            if state["armed"] and i == 5:
                state["armed"] = False
                raise KeyboardInterrupt
            yield ev

    monkeypatch.setattr(chat_mod, "generate", interrupting)
    pair, s = _session(tiny_draft, tiny_target, tmp_path, max_tokens=20)
    with pair:
        events, reply = _drain(s.send("tell me a long story"))
        tokens = [e for e in events if isinstance(e, TokenEvent)]
        assert len(tokens) == 5
        assert reply.interrupted and reply.stats is None and reply.n_tokens == 5
        last = s.messages[-1]
        assert last.role == "assistant" and last.interrupted
        assert last.content == "".join(e.text for e in tokens)
        # the session continues: the next turn renders the partial reply into the prompt
        _, r2 = _drain(s.send("go on"))
        assert not r2.interrupted and r2.stats.tokens == 20
        assert [m.role for m in s.messages] == ["user", "assistant", "user", "assistant"]
        assert s.totals.interrupted == 1 and s.totals.turns == 1
        # /stats counts every reply, the interrupted one included
        assert s.stats()["turns"] == 2
        assert s.command("/stats").message.startswith("turns 2 (1 interrupted)")
        s.close()
    rows = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    flags = [r["interrupted"] for r in rows if r["event"] == "assistant"]
    assert flags == [True, False]


def test_interrupted_turn_counts_its_drafts_fires_and_times(tiny_draft, tiny_target, tmp_path, monkeypatch):
    """A turn cut short by Ctrl-C adds to /stats everything it did, not only its tokens:
    its drafts and gate fires (else fires per 100 tokens is understated) and its prompt
    time apart from its generation time (else tokens/s mixes the prompt in)."""
    real_generate = chat_mod.generate
    seen: list = []

    def interrupting(*a, **kw):
        for i, ev in enumerate(real_generate(*a, **kw)):
            if i == 8:
                raise KeyboardInterrupt
            seen.append(ev)
            yield ev

    monkeypatch.setattr(chat_mod, "generate", interrupting)
    # the gate wide open: on the tiny pair it fires within the first few tokens
    pair, s = _session(tiny_draft, tiny_target, tmp_path, max_tokens=40, mode="easd", temperature=0.0,
                       tau_draft=0.0, tau_target=0.0, overlap=0.0)
    with pair:
        _, reply = _drain(s.send("tell me a long story"))
        assert reply.interrupted and reply.n_tokens == 8
        st = s.stats()
        assert st["turns"] == 1 and st["interrupted"] == 1  # turns counts every reply
        fires_seen = sum(e.origin == "easd" for e in seen)
        assert fires_seen > 0, "the open gate should have fired in 8 tokens"
        assert st["drafted"] >= 1 and st["easd_fires"] >= fires_seen
        # a step may emit more tokens than were shown before the interrupt
        assert st["tokens"] >= 8
        assert st["easd_fires_per_100"] == pytest.approx(100.0 * st["easd_fires"] / st["tokens"])
        total = s.totals.stats
        assert total.seconds_prompt > 0 and st["seconds_prompt"] == total.seconds_prompt
        assert st["seconds_generating"] == pytest.approx(total.seconds_total - total.seconds_prompt)
        s.close()


def test_interrupt_while_rendering_keeps_partial(tiny_draft, tiny_target, tmp_path):
    """Ctrl-C that lands in the consumer (the CLI's rendering), not inside generate."""
    pair, s = _session(tiny_draft, tiny_target, tmp_path, max_tokens=20)
    with pair:
        stream = s.send("hello")
        got = []
        for ev in stream:
            got.append(ev)
            if len(got) == 3:
                break
        reply = s.interrupt()
        stream.close()
        assert reply is not None and reply.interrupted and reply.n_tokens == 3
        assert s.messages[-1].interrupted and s.messages[-1].content == "".join(e.text for e in got)
        assert s.interrupt() is None  # idempotent
        # a stream dropped without interrupt() is also recorded when closed
        stream = s.send("again")
        next(stream)
        stream.close()
        assert s.messages[-1].interrupted and len(s.messages) == 4
        _drain(s.send("and once more"))
        assert not s.messages[-1].interrupted
        s.close()


def test_cli_interrupt_during_reply(tiny_draft, tiny_target, home, monkeypatch):
    real_generate = chat_mod.generate
    state = {"armed": True}

    def interrupting(*a, **kw):
        for i, ev in enumerate(real_generate(*a, **kw)):
            if state["armed"] and i == 3:
                state["armed"] = False
                raise KeyboardInterrupt
            yield ev

    monkeypatch.setattr(chat_mod, "generate", interrupting)
    r = CliRunner().invoke(app, _args(tiny_draft, tiny_target, "--max-tokens", "10"),
                           input="first\nsecond\n")
    assert r.exit_code == 0, r.output
    assert "[interrupted after 3 tokens" in r.output
    assert _n_status(r.output) == 1  # the second reply finished normally
    rows = _transcript_rows(home)
    assert [row["interrupted"] for row in rows if row["event"] == "assistant"] == [True, False]


def test_cli_interrupt_during_a_command_returns_to_the_prompt(tiny_draft, tiny_target, home, monkeypatch):
    # Ctrl-C while /mode sd loads the draft model (seconds on a real pair) ended the whole chat
    def interrupted_load(spec, dopts):
        def load():
            raise KeyboardInterrupt  # where a Ctrl-C held back during llama.cpp's load lands

        return load

    monkeypatch.setattr("easd_local.cli.options.draft_loader", interrupted_load)
    r = CliRunner().invoke(app, _args(tiny_draft, tiny_target, "--mode", "target", "--max-tokens", "4"),
                           input="/mode sd\nhello\n/stats\n")
    assert r.exit_code == 0, r.output
    assert "[stopped; the command changed nothing]" in r.stderr
    assert "target · 4 tokens" in r.stderr  # the chat went on, in the mode it had
    assert "settings: mode=target" in r.stderr


# --------------------------------------------------------------------------- commands, directly
def test_session_commands(tiny_target, tmp_path):
    pair = open_models(None, tiny_target, LoadOptions(n_ctx=256, n_threads=1))
    with pair:
        s = ChatSession(pair.target, None, CHAT_DEFAULTS.replace(mode="target", max_tokens=4), label="t")
        r = s.command("/mode sd")
        assert not r.ok and "needs a draft model" in r.message
        assert s.cfg.mode == "target"
        r = s.command("/set tau-target 0.9")
        assert r.ok and s.cfg.tau_target == 0.9 and s.thresholds_source == "/set"
        r = s.command("/set top-n 100000")
        assert not r.ok and "vocabulary size" in r.message and s.cfg.top_n == 5
        r = s.command("/set temp 0")
        assert r.ok and s.cfg.temperature == 0.0
        assert s.command("/set mode sd").ok is False
        assert s.command("/QUIT").quit and s.command("/exit").quit
        r = s.command("/stats")
        assert r.ok and r.data["settings"]["tau_target"] == 0.9 and r.data["turns"] == 0
        s.close()


def test_stats_shows_the_figures_of_the_modes_used(tiny_draft, tiny_target, tmp_path):
    # tiny-pair entropies are 1-2 nats: these thresholds make easd-tf consult the draft
    pair, s = _session(tiny_draft, tiny_target, tmp_path, mode="target", temperature=0.0,
                       tau_draft=0.5, tau_target=1.0, overlap=0.2)
    with pair:
        _drain(s.send("hello"))
        line = s.command("/stats").message.splitlines()[1]
        assert "n_accept" not in line and "consulted" not in line  # target turns have neither
        assert s.command("/mode easd-tf").ok
        _drain(s.send("and again"))
        st = s.command("/stats")
        assert "n_accept" not in st.message and "draft consulted at" in st.message
        assert 0 < st.data["draft_consult_rate"] <= 1
        assert s.command("/mode sd").ok
        _drain(s.send("once more"))
        st = s.command("/stats")
        assert "n_accept" in st.message and "tok/verify" in st.message and "draft consulted at" in st.message
        s.close()


def test_auto_mode_without_measurements_is_lossless_for_the_hardware():
    from easd_local.engine.ways import auto_mode

    assert auto_mode(False, True).mode == "target" and "pair costs" in auto_mode(False, True).why
    assert (auto_mode(True, True).mode, auto_mode(True, True).spec_type) == ("sd", "draft")  # layers on a GPU
    assert auto_mode(True, False).mode == "target"


def test_banner_says_which_mode_was_chosen(tiny_draft, tiny_target, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from easd_local.cli import app

    monkeypatch.setenv("EASD_LOCAL_HOME", str(tmp_path))
    r = CliRunner().invoke(app, ["chat", "--draft", str(tiny_draft), "--target", str(tiny_target),
                                 "--max-tokens", "4", "--threads", "1"], input="hi\n/about\n")
    assert r.exit_code == 0, r.output
    from easd_local.engine.ways import auto_mode
    from easd_local.llamacpp.devices import gpu_offload_supported

    c = auto_mode(gpu_offload_supported(), True)
    mode, why = c.mode, c.why
    assert f"mode {mode} (auto: {why})" in r.output
    assert f"{mode} · 4 tokens" in r.output
