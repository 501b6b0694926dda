"""The durable results file of a bench run: JSON lines, one fsynced row at a time, one
writer at a time, resumable after a kill (a torn last line is cut away)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import ConfigError
from ..fsutil import describe_write_error, try_lock
from .schema import validate_row

Key = tuple[str, str, str, str]  # (dataset, qid, method, pair)


def row_key(row: dict) -> Key:
    return (row["dataset"], row["qid"], row["method"], row["pair"])


class ResultsFile:
    """The JSON-lines results file, opened for appending one fsynced row at a time.

    Without ``resume`` an existing non-empty file is an error (never overwritten or
    appended to). With ``resume`` its rows are read (``done`` holds their keys) and a torn
    last line (no final newline: the writer was killed mid-row) is cut away on
    :meth:`open`, so the next row starts on a line of its own.
    """

    def __init__(self, path: str | Path, resume: bool) -> None:
        self.path = Path(path).expanduser()
        self.resume = resume
        self.rows: dict[Key, dict] = {}
        self.torn_bytes = 0  # length of the unterminated tail cut away by open()
        self._keep = 0  # bytes kept (everything up to the last newline)
        self._fh = None
        self._created = False  # open() made the file: close() removes it if no row came
        p = self.path
        if p.is_dir():
            raise ConfigError(f"--out {str(p)!r} is a directory")
        if p.exists() and not p.is_file():  # /dev/full would be read without end, /dev/null never keeps a row
            raise ConfigError(f"--out {str(p)!r} is not a regular file (a device or a pipe?); "
                              "give a file to keep the rows in")
        size = p.stat().st_size if p.exists() else 0
        if size and not resume:
            raise ConfigError(f"{str(p)!r} exists; use --resume or another --out")
        self._load()  # early, so that a corrupt file is reported before any model loads

    def _load(self) -> None:
        p = self.path
        self.rows, self.torn_bytes, self._keep = {}, 0, 0
        if not p.exists():
            return
        try:
            data = p.read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read {str(p)!r}: {exc.strerror or exc}") from None
        self._keep = data.rfind(b"\n") + 1
        self.torn_bytes = len(data) - self._keep
        for lineno, raw in enumerate(data[: self._keep].split(b"\n"), 1):
            if not raw.strip():
                continue
            where = f"{p.name} line {lineno}"
            try:
                row = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                raise ConfigError(f"{where} is not valid JSON; the file is corrupt (cannot resume into it)") from None
            validate_row(row, where)
            self.rows[row_key(row)] = row

    @property
    def done(self) -> set[Key]:
        return set(self.rows)

    def open(self) -> "ResultsFile":
        """Lock the file for this run, reread it and cut a torn last line away."""
        p = self.path
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            self._created = not p.exists()
            # unbuffered: a row that cannot be written in full is cut away in append(), and
            # no buffered remainder is left for close() to fail on
            self._fh = open(p, "ab", buffering=0)  # noqa: SIM115
        except OSError as exc:
            raise ConfigError(f"cannot write {str(p)!r}: {exc.strerror or exc}") from None
        if not try_lock(self._fh):  # one writer per file: a second run on the same --out would duplicate rows
            self.close()
            raise ConfigError(f"{str(p)!r} is being written by another run") from None
        try:
            self._load()  # under the lock: what another run may have added meanwhile
            if self.torn_bytes:
                os.ftruncate(self._fh.fileno(), self._keep)  # appends then go to the new end
                os.fsync(self._fh.fileno())
        except BaseException:
            self.close()
            raise
        return self

    def append(self, row: dict) -> None:
        assert self._fh is not None, "ResultsFile.open() first"
        # one line per row; fsynced so that a kill loses at most this row.
        # allow_nan=False: a bare Infinity or NaN is not JSON (jq and others reject the whole
        # file), so a non-finite float that reached a row unconverted fails here, loudly
        data = memoryview((json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8"))
        fd = self._fh.fileno()
        end = os.lseek(fd, 0, os.SEEK_END)
        try:
            while data:
                data = data[os.write(fd, data):]
            os.fsync(fd)
        except OSError as exc:
            self._cut(fd, end)
            raise ConfigError(
                f"cannot write a row to {str(self.path)!r}: {describe_write_error(self.path, exc)}; "
                f"{len(self.rows)} row{'' if len(self.rows) == 1 else 's'} saved before it: "
                "make room and rerun with --resume"
            ) from None
        self.rows[row_key(row)] = row

    @staticmethod
    def _cut(fd: int, end: int) -> None:
        # a full disk may take part of a row: the file keeps only whole rows
        try:
            os.ftruncate(fd, end)
            os.fsync(fd)
        except OSError:
            pass  # what is left is a torn last line, which report skips and --resume cuts

    def close(self, failed: bool = False) -> None:
        """Unlock. ``failed`` (the run ended by an error: a model that would not load, Ctrl-C
        before the first row): a file this run created and wrote no row to is removed, so no
        empty results file is left behind. A run that finished with every problem skipped
        keeps its empty file: the report reads it as no results yet."""
        if self._fh is not None:
            try:
                if failed and self._created and os.fstat(self._fh.fileno()).st_size == 0:
                    self.path.unlink(missing_ok=True)  # still under our lock: no other run wrote
            except OSError:
                pass  # an empty file left is harmless: report reads it as no rows
            self._fh.close()
            self._fh = None

    def __enter__(self) -> "ResultsFile":
        return self.open() if self._fh is None else self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(failed=exc_type is not None)
