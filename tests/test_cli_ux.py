"""What generate and chat tell the user, on the tiny real GGUF pair: the lossless note,
llama.cpp's short flags, where the layers went, the --json keys that repeat a run, the
transcript path on leaving, and /stats lines that wrap between words."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp")

from rich.console import Console  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from easd_local.cli import app  # noqa: E402

runner = CliRunner()

REPRO_KEYS = {"top_k", "top_p", "seed", "max_tokens", "temperature", "gamma", "draft_p_min", "draft_path",
              "target_path", "mode", "tau_draft", "tau_target", "top_n", "overlap", "penalty"}
PLACEMENT_KEYS = {"placement", "lossless"}


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("EASD_LOCAL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _last_json(r) -> dict:
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mode,lossless", [("easd", False), ("easd-tf", False), ("draft", False), ("sd", True),
                                           ("target", True)])
def test_generate_says_when_not_lossless(tiny_draft, tiny_target, mode, lossless):
    args = ["generate", "hi", "-m", str(tiny_target), "-md", str(tiny_draft), "-n", "4", "-t", "1", "--mode", mode]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    if lossless:
        assert "not lossless" not in r.stderr and "note:" not in r.stderr
    else:
        assert "note:" in r.stderr and "--mode sd gives the target's own output" in r.stderr
    obj = _last_json(runner.invoke(app, [*args, "--json"]))
    assert obj["lossless"] is lossless
    assert "note:" not in r.stdout  # the note never mixes into the text


def test_generate_json_repeats_its_run(tiny_draft, tiny_target):
    """llama.cpp's short names set the values that --json reports back."""
    r = runner.invoke(app, ["generate", "hi", "-m", str(tiny_target), "-md", str(tiny_draft), "-n", "7", "-c", "256",
                            "-t", "1", "-s", "11", "--temp", "0.5", "--top-k", "9", "--top-p", "0.8",
                            "--draft-max", "3", "--mode", "sd", "--json"])
    obj = _last_json(r)
    assert REPRO_KEYS | PLACEMENT_KEYS <= set(obj)
    assert (obj["max_tokens"], obj["seed"], obj["temperature"], obj["top_k"], obj["top_p"], obj["gamma"]) == \
        (7, 11, 0.5, 9, 0.8, 3)
    assert obj["tokens"] <= 7
    assert Path(obj["target_path"]) == tiny_target and Path(obj["draft_path"]) == tiny_draft
    # where the layers went, as llama.cpp's load log says it
    import gguf

    from easd_local.llamacpp.devices import gpu_offload_supported

    where = obj["placement"]
    assert where["backend"] == obj["provenance"]["env"]["backend"].replace("+CPU", "")
    for role, path in (("target", tiny_target), ("draft", tiny_draft)):
        p = where[role]
        blocks = int(gguf.GGUFReader(str(path)).fields["llama.block_count"].contents())
        assert p["layers_total"] == blocks + 1  # the blocks + the output layer, as llama.cpp counts them
        assert 0 <= p["layers_gpu"] <= p["layers_total"]
        assert p["model_bytes"] > 0 and p["kv_bytes"] > 0
        if not gpu_offload_supported():
            assert p["layers_gpu"] == 0 and p["layers"] == {"CPU": blocks + 1}
    if not gpu_offload_supported():
        assert where["backend"] == "CPU"
    # KV grows with the context: 256 here; the tiny models keep 2 KV heads of 32 dims, 4 layers, f16
    assert where["target"]["kv_bytes"] == 256 * 4 * 2 * (2 * 32) * 2


def test_same_rule_for_the_mode_in_generate_and_chat(tiny_draft, tiny_target):
    from easd_local.engine.ways import auto_mode
    from easd_local.llamacpp.devices import gpu_offload_supported

    obj = _last_json(runner.invoke(app, ["generate", "hi", "-m", str(tiny_target), "-md", str(tiny_draft), "-n", "3",
                                         "-t", "1", "--json"]))
    assert obj["mode"] == auto_mode(gpu_offload_supported(), True).mode
    assert obj["auto_mode_reason"] == auto_mode(gpu_offload_supported(), True).why


def test_chat_banner_lossless_note_and_transcript_path(tiny_draft, tiny_target, _home):
    from easd_local.llamacpp.devices import gpu_offload_supported

    r = runner.invoke(app, ["chat", "-m", str(tiny_target), "-md", str(tiny_draft), "-t", "1", "-n", "4",
                            "--mode", "easd"], input="/about\nhi\n/mode sd\n/mode easd-tf\n/set mode easd\n/about\n")
    assert r.exit_code == 0, r.output
    err = r.stderr
    assert "note: easd is not lossless" in err and "/mode sd here, or --mode sd" in err
    assert "mode sd (lossless: the target's own output)" in err
    assert "mode easd-tf (easd-tf is not lossless" in err
    assert "mode = easd (easd is not lossless" in err
    assert "sampling: temperature 0.7" in err and "backend " in err
    if not gpu_offload_supported():
        assert "target layers CPU 5/5, model " in err and "draft layers CPU 3/3, model " in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("transcript: ")
    path = Path(last.removeprefix("transcript: "))
    assert path.is_file() and path.parent == _home / "transcripts"
    events = [json.loads(line)["event"] for line in path.read_text().splitlines()]
    assert events[0] == "session_start" and events[-1] == "session_end"


def test_chat_sd_banner_has_no_note(tiny_draft, tiny_target):
    r = runner.invoke(app, ["chat", "-m", str(tiny_target), "-md", str(tiny_draft), "-t", "1", "--mode", "sd",
                            "--temp", "0"], input="/about\n")
    assert r.exit_code == 0, r.output
    assert "not lossless" not in r.stderr and "greedy, up to 1024 tokens" in r.stderr


def test_stats_wraps_between_words_on_a_terminal(monkeypatch):
    """A terminal 80 columns wide: the /stats settings line breaks at spaces, never inside
    a 'key=value' word."""
    import easd_local.cli.chat as cli_chat

    buf = io.StringIO()
    term = Console(file=buf, width=80, force_terminal=True, color_system=None, highlight=False, soft_wrap=True)
    monkeypatch.setattr(cli_chat, "err_console", term)
    words = [f"{k}={v}" for k, v in [("mode", "easd-tf"), ("max-tokens", 1024), ("temperature", 0.7), ("top-k", 40),
                                     ("top-p", 0.95), ("seed", 0), ("gamma", 4), ("draft-p-min", 0.0), ("top-n", 5),
                                     ("overlap", 0.6), ("tau-draft", 0.8899), ("tau-target", 0.7017),
                                     ("penalty", 0.0)]]
    cli_chat._note("settings: " + " ".join(words))
    lines = buf.getvalue().splitlines()
    assert len(lines) > 1 and all(len(line) <= 80 for line in lines)
    got = " ".join(line.strip() for line in lines).split()
    assert got == ["settings:", *words]


def test_memory_from_llama_cpp_buffer_lines():
    """The parser on the lines a CUDA build prints (no GPU needed to check the reading)."""
    from easd_local.llamacpp.llama_log import parse_buffers

    lines = ["load_tensors:        CUDA0 model buffer size =  1000.50 MiB",
             "load_tensors:   CPU_Mapped model buffer size =   100.00 MiB",
             "llama_kv_cache:      CUDA0 KV buffer size =    56.00 MiB",
             "llama_context:        CPU  output buffer size =     0.58 MiB",
             "sched_reserve:      CUDA0 compute buffer size =   300.00 MiB"]
    m = parse_buffers(lines)
    mib = 1 << 20
    assert m.model_bytes == int(1100.5 * mib) and m.kv_bytes == 56 * mib and m.compute_bytes == 300 * mib


def test_until_first_passes_every_event_and_shows_a_spinner_only_on_a_terminal(monkeypatch):
    import easd_local.cli.progress as prog

    seen = []

    def events():
        seen.append("prefill")  # the work before the first event (prompt evaluation)
        yield from (1, 2, 3)

    assert list(prog.until_first(events(), "evaluating")) == [1, 2, 3] and seen == ["prefill"]
    assert list(prog.until_first(iter(()), "x")) == []
    buf = io.StringIO()
    term = Console(file=buf, width=80, force_terminal=True, color_system=None)
    monkeypatch.setattr(prog, "err_console", term)
    assert list(prog.until_first(events(), "evaluating the prompt")) == [1, 2, 3]
    assert "evaluating the prompt" in buf.getvalue()
