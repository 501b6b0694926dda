"""The model cache (issue 13, items 7-9): a corrupted cached model is never used silently,
pull says only what it checked, `models verify` reads in full, and pulls of one file take
turns. A catalog whose sources are local files (the tiny pair), real llama.cpp for generate."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from easd_local import paths
from easd_local.store import filehash
from easd_local.store import pull as P
from easd_local.store.catalog import load_catalog, local_path
from easd_local.cli import app
from easd_local.errors import PullError

runner = CliRunner()


def _write_catalog(path: Path, files: dict[str, Path]) -> None:
    lines = ["schema = 1", 'default_pair = "tiny"', ""]
    for name, f in files.items():
        data = f.read_bytes()
        lines += [f'[models."{name}"]', f'file = "{name}.gguf"', f"size = {len(data)}",
                  f'sha256 = "{hashlib.sha256(data).hexdigest()}"', "",
                  f'[[models."{name}".sources]]', 'kind = "path"', f'path = "{f}"', ""]
    if {"tiny-draft", "tiny-target"} <= files.keys():
        lines += ["[pairs.tiny]", 'draft = "tiny-draft"', 'target = "tiny-target"']
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture
def cache(tmp_path, monkeypatch, tiny_draft, tiny_target):
    monkeypatch.setenv("EASD_LOCAL_HOME", str(tmp_path / "home"))
    cat = tmp_path / "catalog.toml"
    _write_catalog(cat, {"tiny-draft": tiny_draft, "tiny-target": tiny_target})
    monkeypatch.setenv("EASD_LOCAL_CATALOG", str(cat))
    return load_catalog()


def _flip_middle_byte(path: Path, keep_stamp: bool = False) -> None:
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(st.st_size // 2)
        b = f.read(1)
        f.seek(st.st_size // 2)
        f.write(bytes([b[0] ^ 0xFF]))
    if keep_stamp:  # the same size, mtime and inode: what the quick check cannot see
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    else:  # a write within the same clock tick may leave mtime as it was; a real edit does not
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


def _generate(*model_args: str):
    return runner.invoke(app, ["generate", "hello", *(model_args or ("--pair", "tiny")), "--mode", "sd",
                               "--max-tokens", "4", "--threads", "1", "--ctx", "256", "--json"])


def test_a_flipped_byte_in_a_cached_model_is_caught(cache):
    r = runner.invoke(app, ["pull", "--yes"])
    assert r.exit_code == 0, r.output
    assert r.stdout.count(", downloaded, sha256 ") == 2
    # nothing changed: pull says it trusted the stamp, and does not claim to have hashed
    r = runner.invoke(app, ["pull"])
    assert r.exit_code == 0, r.output
    assert r.stdout.count("already present, unchanged (size, mtime, inode) since its sha256") == 2
    assert "not re-read" in r.stdout and "hashed now" not in r.stdout
    assert _generate().exit_code == 0

    target = local_path(cache.model("tiny-target"))
    _flip_middle_byte(target)
    r = _generate()
    assert r.exit_code == 2, r.output  # it decoded with exit 0 before
    assert "Traceback" not in r.output and r.stdout == ""
    err = r.stderr.strip().splitlines()  # the hashing bar's last frame, then the one error line
    assert [ln for ln in err if "verifying" not in ln] == err[-1:], r.stderr
    assert f"tiny-target: the cached file {target} is corrupt" in err[-1]
    assert "`easd-local pull tiny-target` downloads it again" in err[-1]

    r = runner.invoke(app, ["pull", "--yes"])
    assert r.exit_code == 0, r.output
    assert "tiny-target: the cached file" in r.stderr and "is corrupt" in r.stderr
    assert "downloading it again" in r.stderr  # said before it was replaced
    assert "tiny-target: " in r.stdout and ", downloaded, sha256 " in r.stdout
    assert "tiny-draft: " in r.stdout and "already present, unchanged" in r.stdout
    assert _generate().exit_code == 0


def test_a_changed_but_intact_file_is_hashed_again_and_trusted(cache):
    assert runner.invoke(app, ["pull", "--yes"]).exit_code == 0
    target = local_path(cache.model("tiny-target"))
    st = target.stat()
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # touched, not changed
    r = runner.invoke(app, ["pull"])
    assert r.exit_code == 0, r.output
    assert "tiny-target: " in r.stdout and "already present, sha256 " in r.stdout and "hashed now: verified" in r.stdout
    assert filehash.lookup(target) == cache.model("tiny-target").sha256  # the new stamp is trusted from now on


def test_models_verify_finds_what_the_stamp_cannot(cache):
    assert runner.invoke(app, ["pull", "--yes"]).exit_code == 0
    target = local_path(cache.model("tiny-target"))
    _flip_middle_byte(target, keep_stamp=True)
    assert _generate().exit_code == 0  # the quick check trusts an unchanged stamp (the README says so)
    r = runner.invoke(app, ["models", "verify"])
    assert r.exit_code == 2, r.output
    assert "tiny-draft: sha256 " in r.stdout and "verified (read in full)" in r.stdout
    assert f"tiny-target: the cached file {target} is corrupt" in r.stdout
    assert "1 corrupt model (tiny-target)" in r.stderr and "Traceback" not in r.output
    # what verify found is remembered: the next command refuses the file
    r = _generate()
    assert r.exit_code == 2 and "is corrupt" in r.stderr
    # a pair name and a path name the same files
    assert runner.invoke(app, ["models", "verify", "tiny"]).exit_code == 2
    r = runner.invoke(app, ["models", "verify", str(local_path(cache.model("tiny-draft")))])
    assert r.exit_code == 0, r.output
    assert "tiny-draft: sha256 " in r.stdout and "tiny-target" not in r.stdout


def test_models_verify_a_file_outside_the_catalog_and_nothing_downloaded(cache, tmp_path):
    r = runner.invoke(app, ["models", "verify"])
    assert r.exit_code == 0 and "no model is downloaded yet" in r.stdout
    r = runner.invoke(app, ["models", "verify", "tiny"])
    assert r.exit_code == 0 and "tiny-draft: not downloaded" in r.stdout
    loose = tmp_path / "other.gguf"
    loose.write_bytes(b"GGUF" + b"x" * 1000)
    r = runner.invoke(app, ["models", "verify", str(loose)])
    assert r.exit_code == 0, r.output
    assert f"sha256 {hashlib.sha256(loose.read_bytes()).hexdigest()}, not a catalog model's file" in r.stdout
    r = runner.invoke(app, ["models", "verify", str(tmp_path / "nope.gguf")])
    assert r.exit_code == 2 and "no such file" in r.stderr and "Traceback" not in r.output


def test_a_user_model_changed_since_models_add_is_refused(cache, tmp_path, tiny_target):
    mine = tmp_path / "mine.gguf"
    mine.write_bytes(tiny_target.read_bytes())
    assert runner.invoke(app, ["models", "add", "mine", str(mine)]).exit_code == 0
    assert _generate("--target", "mine", "--draft", "mine").exit_code == 0
    _flip_middle_byte(mine)
    r = _generate("--target", "mine", "--draft", "mine")
    assert r.exit_code == 2, r.output
    assert f"mine: {mine} changed since `models add`" in r.stderr
    assert f"add it again: easd-local models add mine {mine}" in r.stderr
    # verify and pull say the same, and never offer to download a file that has no download
    r = runner.invoke(app, ["models", "verify", "mine"])
    assert r.exit_code == 2 and f"add it again: easd-local models add mine {mine}" in r.output
    assert "pull NAME" not in r.output and "each line above says what to do" in r.stderr
    r = runner.invoke(app, ["pull", "mine"])
    assert r.exit_code == 2 and "add it again" in r.stderr and "downloading it again" not in r.output


def test_a_second_pull_waits_for_the_first_and_says_who_holds_it(cache):
    import fcntl

    entry = cache.model("tiny-target")
    lock_path = paths.home() / "locks" / f"{entry.file}.lock"
    lock_path.parent.mkdir(parents=True)
    messages: list[str] = []
    with open(lock_path, "a+") as held:  # another pull, as far as the lock can tell
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        held.write("4242\n")
        held.flush()
        t = threading.Thread(target=P.pull_model, args=(entry,),
                             kwargs={"progress": lambda d, n, m: messages.append(m)})
        t.start()
        deadline = time.monotonic() + 30
        while not messages and time.monotonic() < deadline:
            time.sleep(0.01)
        assert messages[:1] == ["tiny-target: waiting for another pull of it (pid 4242)"]
        time.sleep(0.2)
        assert t.is_alive() and not local_path(entry).exists()  # it waits; it did not download
    t.join(30)
    assert not t.is_alive()
    assert P.check_cached(entry).state == "trusted"


def test_two_pull_processes_download_once(tmp_path):
    big = tmp_path / "big.gguf"
    big.write_bytes(b"GGUF" + os.urandom(48 << 20))
    home = tmp_path / "home"
    cat = tmp_path / "catalog.toml"
    _write_catalog(cat, {"big": big})
    env = {**os.environ, "EASD_LOCAL_HOME": str(home), "EASD_LOCAL_CATALOG": str(cat),
           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    procs = [subprocess.Popen([sys.executable, "-m", "easd_local", "pull", "big", "--yes"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    stdout = "".join(o for o, _ in outs)
    assert stdout.count(", downloaded, sha256") == 1, outs  # the other one found it done
    assert ("downloaded by another pull meanwhile" in stdout) or ("already present" in stdout), outs
    assert "Traceback" not in "".join(e for _, e in outs)
    assert (home / "models" / "big.gguf").read_bytes() == big.read_bytes()
    assert sorted(p.name for p in (home / "models").iterdir()) == ["big.gguf"]


def test_leftovers_of_killed_pulls_are_cleaned_at_the_start(cache):
    entry = cache.model("tiny-draft")
    P.pull_model(entry)
    d = local_path(entry).parent
    # a temp named after a live process (this one's parent): under the lock it is still stale
    for pid in (999999999, os.getppid()):
        (d / f"{entry.file}.part-{pid}").write_bytes(b"half a download")
    tmpdir = d / f".{entry.file}.dl-abc123"
    tmpdir.mkdir()
    (tmpdir / "part1.whl").write_bytes(b"PK")
    assert P.pull_model(entry) == local_path(entry)  # nothing to download: still cleaned
    assert sorted(p.name for p in d.iterdir()) == [entry.file]


def test_free_space_is_checked_before_writing(cache, monkeypatch):
    entry = cache.model("tiny-target")
    real = P.shutil.disk_usage
    monkeypatch.setattr(P.shutil, "disk_usage", lambda p: real(p)._replace(free=entry.size // 2))
    with pytest.raises(PullError, match=r"tiny-target: not enough free space in .*: the download needs .*, .* are free"):
        P.pull_model(entry)
    assert list(local_path(entry).parent.iterdir()) == []
    r = runner.invoke(app, ["pull", "tiny-target"])
    assert r.exit_code == 2 and "not enough free space" in r.stderr and "Traceback" not in r.output


def test_models_verify_reports_a_cut_off_file(cache):
    assert runner.invoke(app, ["pull", "--yes"]).exit_code == 0
    target = local_path(cache.model("tiny-target"))
    with open(target, "r+b") as f:
        f.truncate(1000)
    r = runner.invoke(app, ["models", "verify"])
    assert r.exit_code == 2, r.output
    assert f"tiny-target: the cached file {target} is incomplete or changed (not the catalog's" in r.stdout
    # generate does not use it: it fetches the file again (a small one: no question)
    assert _generate().exit_code == 0 and target.stat().st_size == cache.model("tiny-target").size
