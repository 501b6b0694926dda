"""Bad input a user can feed the CLI ends in one clear line (or a clean return to the chat
prompt), never a traceback: unwritable transcripts, seeds, text that is not UTF-8 (issue 13,
items 1, 3 and 4). Real llama.cpp on the tiny pair."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from easd_local.chat import CHAT_DEFAULTS, ChatSession, TranscriptWriter
from easd_local.cli import app
from easd_local.errors import ConfigError, InvalidTextError
from easd_local.engine.pair import open_models
from easd_local.llamacpp.runtime import LoadOptions, Model, ModelFile

runner = CliRunner()


def _one_clean_line(output: str) -> None:
    assert "Traceback" not in output
    errors = [ln for ln in output.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, output


def _replies(stderr: str) -> int:
    """How many chat replies ended with a status line."""
    return len(re.findall(r"\d+ tokens · [\d.]+ tok/s", stderr))


def _chat(draft, target, *extra, input):
    return runner.invoke(app, ["chat", "--draft", str(draft), "--target", str(target), "--threads", "1",
                               "--ctx", "512", "--max-tokens", "6", *extra], input=input)


# ------------------------------------------------------------------ 1. transcripts


@pytest.fixture
def home_is_a_file(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "not-a-folder"
    home.write_text("x")
    monkeypatch.setenv("EASD_LOCAL_HOME", str(home))
    return home


def test_chat_goes_on_when_the_home_is_a_file(tiny_draft, tiny_target, home_is_a_file):
    home = home_is_a_file
    r = _chat(tiny_draft, tiny_target, input="hello\nagain\n")
    assert r.exit_code == 0, r.output
    assert "Traceback" not in r.output
    assert r.stderr.count("the chat transcript is off") == 1  # warned once
    assert f"{home} is a file, not a folder" in r.stderr
    assert _replies(r.stderr) == 2  # both messages were answered


def _transcript_disk_full(monkeypatch, full: bool = True) -> None:
    """Every write of the transcript's fails with ENOSPC, as on a full disk (not /dev/full: as
    root, a writer that went wrong there could replace or remove the device)."""
    import types

    from easd_local.chat import transcript as module

    def no_room(fd, data):
        raise OSError(28, "No space left on device")

    calls = {k: getattr(os, k) for k in dir(os) if not k.startswith("__")}
    monkeypatch.setattr(module, "os", types.SimpleNamespace(**{**calls, "write": no_room}) if full else os)


def test_transcript_on_a_full_disk_warns_once_and_chat_goes_on(tiny_draft, tiny_target, tmp_path, monkeypatch):
    _transcript_disk_full(monkeypatch)
    with open_models(tiny_draft, tiny_target, LoadOptions(n_ctx=512, n_threads=1)) as pair:
        s = ChatSession(pair.target, pair.draft, CHAT_DEFAULTS.replace(max_tokens=4), n_vocab=pair.n_vocab,
                        transcript=TranscriptWriter(tmp_path / "t.jsonl"))  # every write: ENOSPC
        notices = s.take_notices()
        assert len(notices) == 1 and "no space left" in notices[0].text
        for _ in range(2):
            events = list(s.send("hi"))
            assert events[-1].stats is not None
        assert s.take_notices() == []
        assert [m.role for m in s.messages] == ["user", "assistant", "user", "assistant"]
        s.close()


def test_transcript_never_keeps_half_a_line(tmp_path, monkeypatch):
    path = tmp_path / "t.jsonl"
    w = TranscriptWriter(path)
    w.write("user", content="first")
    real_write = os.write

    def half_then_full(fd, data):  # the disk fills up in the middle of a line
        real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_full)
    w.write("user", content="second, much longer " * 10)
    monkeypatch.setattr(os, "write", real_write)
    w.write("user", content="third")  # the writer has stopped
    w.close()
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert [r["content"] for r in rows] == ["first"]
    assert "no space left" in w.take_warning()


def test_save_under_a_file_names_the_file(tiny_target, tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    with open_models(None, tiny_target, LoadOptions(n_ctx=256, n_threads=1)) as pair:
        s = ChatSession(pair.target, None, CHAT_DEFAULTS.replace(mode="target"), n_vocab=pair.n_vocab)
        res = s.command(f"/save {blocker}/sub/chat.json")
    assert not res.ok
    assert res.message == f"could not save: {blocker} is a file, not a folder"


# ------------------------------------------------------------------ 3. seeds


def test_seed_below_minus_one_is_refused_before_loading(tmp_path):
    missing = tmp_path / "nope.gguf"
    for cmd in (["generate", "hi"], ["chat"]):
        r = runner.invoke(app, [*cmd, "--seed", "-2", "--draft", str(missing), "--target", str(missing)])
        assert r.exit_code == 2, r.output
        assert "seed must be >= 0, or -1 for a random seed, got -2" in r.output
        assert "file not found" not in r.output
    with pytest.raises(ConfigError):
        CHAT_DEFAULTS.replace(seed=-5)


def test_seed_minus_one_means_random(tiny_draft, tiny_target, tmp_path, monkeypatch):
    monkeypatch.setenv("EASD_LOCAL_HOME", str(tmp_path / "home"))
    texts = set()
    for _ in range(3):
        r = runner.invoke(app, ["generate", "Tell me", "--seed", "-1", "--temperature", "1.5", "--max-tokens", "24",
                                "--raw", "--json", "--mode", "sd", "--draft", str(tiny_draft),
                                "--target", str(tiny_target), "--threads", "1", "--ctx", "256"])
        assert r.exit_code == 0, r.output
        texts.add(json.loads(r.stdout.strip().splitlines()[-1])["text"])
    assert len(texts) > 1  # 24 tokens at T=1.5 from three fresh seeds: equal texts would mean a fixed seed
    r = _chat(tiny_draft, tiny_target, "--seed", "-1", input="hello\n/set seed 3\n/set seed -1\nhello\n")
    assert r.exit_code == 0, r.output
    assert "seed = -1" in r.stderr and _replies(r.stderr) == 2


# ------------------------------------------------------------------ 4. not UTF-8


def test_generate_refuses_bad_utf8_in_argv_and_stdin(tiny_draft, tiny_target, tmp_path, monkeypatch):
    monkeypatch.setenv("EASD_LOCAL_HOME", str(tmp_path / "home"))
    base = ["--draft", str(tiny_draft), "--target", str(tiny_target), "--threads", "1", "--max-tokens", "4"]
    # argv: Python hands a byte that is not UTF-8 over as a surrogate (surrogateescape)
    r = runner.invoke(app, ["generate", "caf\udcff au lait", *base])
    assert r.exit_code == 2
    _one_clean_line(r.output)
    assert "the prompt is not valid UTF-8: byte 0xff at character 4" in r.output
    r = runner.invoke(app, ["generate", "-", *base], input=b"caf\xe9\n")
    assert r.exit_code == 2
    _one_clean_line(r.output)
    assert "standard input is not valid UTF-8: byte 0xe9" in r.output
    r = runner.invoke(app, ["generate", "hi", "--system", "\ud800", *base])
    assert r.exit_code == 2 and "lone surrogate U+D800" in r.output
    # a real process, with the bytes in its argv
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.run([sys.executable, "-m", "easd_local", "generate", b"caf\xffe", *base],
                       capture_output=True, env=env, timeout=120)
    assert p.returncode == 2, p.stderr
    _one_clean_line(p.stderr.decode())


def test_chat_refuses_a_bad_line_and_goes_on(tiny_draft, tiny_target, tmp_path, monkeypatch):
    monkeypatch.setenv("EASD_LOCAL_HOME", str(tmp_path / "home"))
    r = _chat(tiny_draft, tiny_target, input=b"caf\xe9 au lait\n/system \xff\nhello\n")
    assert r.exit_code == 0, r.output
    assert "Traceback" not in r.output
    assert "the message is not valid UTF-8: byte 0xe9 at character 4" in r.stderr
    assert "the system prompt is not valid UTF-8" in r.stderr
    assert _replies(r.stderr) == 1  # the good line was answered


def test_runtime_tokenize_refuses_surrogates(tiny_target):
    with ModelFile(tiny_target) as m:
        with pytest.raises(InvalidTextError, match="lone surrogate U\\+DFFF at character 2"):
            m.vocab.tokenize("a\udfff")


def test_dataset_question_with_a_lone_surrogate(tmp_path, monkeypatch):
    monkeypatch.setenv("EASD_LOCAL_HOME", str(tmp_path / "home"))
    data = tmp_path / "q.jsonl"
    data.write_text('{"q": "fine", "a": "1"}\n{"q": "bad \\ud800 one", "a": "2"}\n', encoding="utf-8")
    missing = tmp_path / "nope.gguf"  # the dataset is checked before any model is looked for
    r = runner.invoke(app, ["bench", "--dataset", str(data), "--question-key", "q", "--answer-key", "a",
                            "--draft", str(missing), "--target", str(missing), "--out", str(tmp_path / "r.jsonl")])
    assert r.exit_code == 2, r.output
    _one_clean_line(r.output)
    assert "line 2: the question is not valid UTF-8: lone surrogate U+D800" in r.output
    r = runner.invoke(app, ["calibrate", "--dataset", str(data), "--question-key", "q",
                            "--draft", str(missing), "--target", str(missing)])
    assert r.exit_code == 2, r.output
    assert "line 2: the question is not valid UTF-8" in r.output


def test_calibrate_says_what_a_question_field_holds(tmp_path, monkeypatch):
    monkeypatch.setenv("EASD_LOCAL_HOME", str(tmp_path / "home"))
    data = tmp_path / "q.jsonl"
    data.write_text('{"question": ["a", "list"]}\n', encoding="utf-8")
    missing = tmp_path / "nope.gguf"
    r = runner.invoke(app, ["calibrate", "--dataset", str(data), "--draft", str(missing), "--target", str(missing)])
    assert r.exit_code == 2, r.output
    assert "line 1: field 'question' holds a JSON array, expected text" in r.output
    data.write_text('{"text": "hi"}\n', encoding="utf-8")
    r = runner.invoke(app, ["calibrate", "--dataset", str(data), "--draft", str(missing), "--target", str(missing)])
    assert "line 1 has no field 'question' (give --question-key; found: text)" in r.output


# ------------------------------------------------------------------ 11. misleading messages


def test_report_tells_a_torn_line_from_a_corrupt_one(tiny_draft, tiny_target, tmp_path, monkeypatch):
    monkeypatch.setenv("EASD_LOCAL_HOME", str(tmp_path / "home"))
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"q": "1 + 1?", "a": "2"}) + "\n")
    out = tmp_path / "r.jsonl"
    args = ["bench", "--dataset", str(data), "--question-key", "q", "--answer-key", "a", "--modes", "target",
            "--target", str(tiny_target), "--max-tokens", "2", "--threads", "1", "--ctx", "128", "--out", str(out)]
    assert runner.invoke(app, args).exit_code == 0
    good = out.read_text()
    # a garbage line that ends in a newline was written whole: corrupt, and --resume says so too
    out.write_text(good + "garbage\n")
    r = runner.invoke(app, ["bench", "report", str(out)])
    assert r.exit_code == 2
    _one_clean_line(r.output)
    assert "r.jsonl line 2 is not valid JSON" in r.output and "--resume" not in r.output
    r = runner.invoke(app, [*args, "--resume"])
    assert r.exit_code == 2 and "line 2 is not valid JSON" in r.output
    # cut off mid-write (no newline): skipped, and --resume does redo it
    out.write_text(good + good[: len(good) // 2])
    r = runner.invoke(app, ["bench", "report", str(out)])
    assert r.exit_code == 0 and "cut off mid-write" in r.stderr
    r = runner.invoke(app, [*args, "--resume"])
    assert r.exit_code == 0 and "removed a torn last line" in r.stderr


def _calibrate(tiny_draft, tiny_target, data, *extra):
    return runner.invoke(app, ["calibrate", "--dataset", str(data), "--draft", str(tiny_draft), "--target",
                               str(tiny_target), "--ctx", "64", "--max-tokens", "4", "--threads", "1", *extra])


def test_calibrate_skips_a_question_longer_than_the_context(tiny_draft, tiny_target, tmp_path, monkeypatch):
    monkeypatch.setenv("EASD_LOCAL_HOME", str(tmp_path / "home"))
    data = tmp_path / "q.jsonl"
    questions = ["What is 1 + 1?", "What is " + "one plus " * 110 + "one?", "What is 2 + 2?"]
    data.write_text("".join(json.dumps({"question": q}) + "\n" for q in questions), encoding="utf-8")
    trace = tmp_path / "trace.jsonl"
    r = _calibrate(tiny_draft, tiny_target, data, "--json", "--trace", str(trace))
    assert r.exit_code == 0, r.output  # it stopped the whole run before
    assert json.loads(r.stdout)["questions"] == 2
    assert ("skipped 1 question longer than the 256-token context (llama.cpp rounds --ctx 64 up to 256): "
            "question 2 (") in r.stderr
    assert "(raise --ctx to include them)" in r.stderr
    # the trace keeps each question's own index: the third is still the third
    assert {json.loads(ln)["q"] for ln in trace.read_text().splitlines()} == {0, 2}

    data.write_text(json.dumps({"question": questions[1]}) + "\n", encoding="utf-8")
    r = _calibrate(tiny_draft, tiny_target, data)
    assert r.exit_code == 2, r.output
    _one_clean_line(r.stderr)
    assert "no positions were generated (every question was longer than the context)" in r.stderr


def test_chat_banner_says_the_context_was_rounded_up(tiny_target, tmp_path, monkeypatch):
    monkeypatch.setenv("EASD_LOCAL_HOME", str(tmp_path / "home"))
    args = ["chat", "--target", str(tiny_target), "--mode", "target", "--threads", "1"]
    r = runner.invoke(app, [*args, "--ctx", "64"], input="")
    assert r.exit_code == 0, r.output
    assert "context 256 tokens (llama.cpp rounds --ctx 64 up to 256)" in r.stderr
    r = runner.invoke(app, [*args, "--ctx", "512"], input="")
    assert r.exit_code == 0, r.output
    assert "context 512 tokens\n" in r.stderr and "rounds" not in r.stderr


# ------------------------------------------------------------------ closed and full standard streams


def _cli(*args, input=None, stdout=subprocess.PIPE, close_stdin=False, home):
    """A real easd-local process; ``close_stdin``: fd 0 closed, as by ``<&-`` (sys.stdin is None)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "EASD_LOCAL_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "easd_local", *map(str, args)], input=input, stdout=stdout,
                          stderr=subprocess.PIPE, env=env, timeout=180,
                          preexec_fn=(lambda: os.close(0)) if close_stdin else None)


def test_closed_stdin_ends_chat_and_is_one_line_for_generate(tiny_draft, tiny_target, tmp_path):
    base = ["--draft", tiny_draft, "--target", tiny_target, "--threads", "1", "--max-tokens", "4"]
    p = _cli("chat", *base, close_stdin=True, home=tmp_path / "home")
    err = p.stderr.decode()
    assert p.returncode == 0, err  # as at the end of input: the chat ends at once
    assert "Traceback" not in err and "\ntranscript: " in err
    p = _cli("generate", "-", *base, close_stdin=True, home=tmp_path / "home")
    err = p.stderr.decode()
    assert p.returncode == 2, err
    _one_clean_line(err)
    assert "error: PROMPT is '-' but standard input is closed" in err


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_stdout_on_a_full_disk_is_one_line(tiny_draft, tiny_target, tmp_path):
    base = ["--draft", tiny_draft, "--target", tiny_target, "--threads", "1", "--max-tokens", "8"]
    home = tmp_path / "home"
    with open("/dev/full", "w") as full:  # every write: ENOSPC, as a redirect to a full disk
        runs = {
            "generate": _cli("generate", "hi", *base, stdout=full, home=home),
            "generate --json": _cli("generate", "hi", "--json", *base, stdout=full, home=home),
            "chat": _cli("chat", *base, input=b"hello\nagain\n", stdout=full, home=home),
        }
    for name, p in runs.items():
        err = p.stderr.decode()
        assert p.returncode == 2, (name, err)
        _one_clean_line(err)
        assert "error: cannot write to standard output: No space left on device" in err, (name, err)
        assert "Exception ignored" not in err, (name, err)
    # the chat ended at the first reply it could not show, and kept that reply as interrupted
    rows = [json.loads(ln) for f in (home / "transcripts").glob("chat-*.jsonl") for ln in f.read_text().splitlines()]
    assert [r["event"] for r in rows] == ["session_start", "user", "assistant", "session_end"]
    assert rows[2]["interrupted"] is True


def test_save_onto_a_folder_or_a_pipe_is_refused(tiny_target, tmp_path):
    # /save renames a new file over its path: a FIFO (or, as root, /dev/null) was replaced by
    # a plain file, and a folder gave a message naming a temporary file
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    with open_models(None, tiny_target, LoadOptions(n_ctx=256, n_threads=1)) as pair:
        s = ChatSession(pair.target, None, CHAT_DEFAULTS.replace(mode="target"), n_vocab=pair.n_vocab)
        folder = s.command(f"/save {tmp_path}")
        fifo = s.command(f"/save {pipe}")
    assert not folder.ok and folder.message == f"could not save: {tmp_path}: is a folder, not a file"
    assert not fifo.ok and fifo.message == f"could not save: {pipe}: is not a regular file (a device or a pipe?)"
    assert stat.S_ISFIFO(os.stat(pipe).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["pipe"]  # no temporary file left


def test_chat_names_no_transcript_when_none_was_written(tiny_draft, tiny_target, tmp_path, monkeypatch,
                                                         home_is_a_file):
    home = home_is_a_file
    r = _chat(tiny_draft, tiny_target, input="hello\n")
    assert r.exit_code == 0, r.output
    assert r.stderr.splitlines()[-1] == f"transcript: none ({home} is a file, not a folder)"
    path = tmp_path / "t.jsonl"
    w = TranscriptWriter(path)
    w.write("user", content="first")
    _transcript_disk_full(monkeypatch)
    w.write("user", content="second")  # the disk filled up: the line before it stays
    _transcript_disk_full(monkeypatch, full=False)
    assert w.where() == f"{path} (incomplete: no space left on the device holding {path})"

    empty = tmp_path / "e.jsonl"
    w = TranscriptWriter(empty)  # opened, then the first line fails: nothing kept, no empty file
    _transcript_disk_full(monkeypatch)
    w.write("user", content="hi")
    _transcript_disk_full(monkeypatch, full=False)
    assert w.where().startswith("none (no space left") and not empty.exists()

    pipe = tmp_path / "pipe"  # not a regular file: never removed (as root, /dev/full could have been)
    os.mkfifo(pipe)
    reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)  # so that the writer's open does not block
    try:
        w = TranscriptWriter(pipe)
        _transcript_disk_full(monkeypatch)
        w.write("user", content="hi")
        _transcript_disk_full(monkeypatch, full=False)
    finally:
        os.close(reader)
    assert w.where().startswith("none (") and stat.S_ISFIFO(os.stat(pipe).st_mode)


def test_chat_refuses_a_system_prompt_that_is_not_utf8_before_loading(tmp_path, monkeypatch):
    monkeypatch.setenv("EASD_LOCAL_HOME", str(tmp_path / "home"))
    missing = tmp_path / "nope.gguf"
    r = _chat(missing, missing, "--system", "caf\udcff", input="hello\n")
    assert r.exit_code == 2, r.output
    _one_clean_line(r.output)
    assert "the system prompt is not valid UTF-8: byte 0xff at character 4" in r.output
    assert "file not found" not in r.output
