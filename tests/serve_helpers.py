"""A real `easd-local serve` process on a free loopback port, and plain HTTP calls to it.

tests/ is on sys.path (rootdir conftest), so test modules import this as ``serve_helpers``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from easd_local.lifeline import preexec

EXE = [sys.executable, "-c", "from easd_local.cli import main; main()"]


class ServerProc:
    def __init__(self, args: list[str], log: Path, env: dict | None = None, timeout: float = 60.0):
        self.log = log
        self._f = open(log, "w")  # noqa: SIM115
        full_env = {**os.environ, **(env or {})}
        full_env = {k: v for k, v in full_env.items() if v is not None}  # None: unset it
        self.proc = subprocess.Popen(EXE + ["serve", "--port", "0", "--log-level", "warning", *args],
                                     stdout=self._f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=full_env, preexec_fn=preexec())  # a killed suite leaves no server
        self.port = self._wait_port(timeout)
        self.base = f"http://127.0.0.1:{self.port}"

    def _wait_port(self, timeout: float) -> int:
        t_end = time.monotonic() + timeout
        while time.monotonic() < t_end:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)/v1", self.output())
            if m:
                return int(m.group(1))
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited {self.proc.returncode}:\n{self.output()}")
            time.sleep(0.05)
        raise AssertionError(f"server did not start:\n{self.output()}")

    def wait_ready(self, timeout: float = 60.0) -> None:
        t_end = time.monotonic() + timeout
        while time.monotonic() < t_end:
            status, _, _ = http("GET", self.base + "/health")
            if status == 200:
                return
            assert self.proc.poll() is None, self.output()
            time.sleep(0.05)
        raise AssertionError(f"server not ready:\n{self.output()}")

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._f.close()
        return self.output()


def start_tiny(draft: Path, target: Path, tmp: Path, *flags: str, env: dict | None = None) -> ServerProc:
    """`serve` on a pair with its own home under ``tmp`` and no API key unless ``env`` gives
    one, once /health says it is ready."""
    srv = ServerProc(["--draft", str(draft), "--target", str(target), *flags], tmp / "server.log",
                     env={"EASD_LOCAL_HOME": str(tmp / "home"), "EASD_LOCAL_API_KEY": None, **(env or {})})
    srv.wait_ready()
    return srv


def stop_clean(srv: ServerProc) -> str:
    """Stop the server; what it printed, which must hold no traceback."""
    out = srv.stop()
    assert "Traceback" not in out, out
    return out


def openai_client(srv: ServerProc, api_key: str = "unused", **kw):
    import openai

    return openai.OpenAI(base_url=srv.base + "/v1", api_key=api_key, max_retries=0, **{"timeout": 120, **kw})


def http(method: str, url: str, body=None, headers: dict | None = None, raw: bytes | None = None,
         timeout: float = 60.0) -> tuple[int, dict, object]:
    """(status, headers with lower-case names, decoded JSON or text) of one request; HTTP errors are
    returned, not raised."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json",
                                                                          **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, hdrs, payload = r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        status, hdrs, payload = e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()
    text = payload.decode("utf-8", errors="replace")
    try:
        return status, hdrs, json.loads(text)
    except ValueError:
        return status, hdrs, text


def metric_values(text: str) -> dict:
    """{(name, frozenset(labels)): value} of a Prometheus text exposition, parsed with
    prometheus_client's own parser (so a malformed exposition fails the test)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out
