"""Notes that are news once per machine: the weight-repacking line tells a user something the
first time a model loads here and is noise on every later command (``doctor``, ``models check
--load``, ``--verbose`` and ``--json`` still give it every time). What was shown is recorded in
``$EASD_LOCAL_HOME/notes-shown.json``."""

from __future__ import annotations

import hashlib
import time

from .. import paths
from ..fsutil import read_json_dict, write_json_atomic

SHOWN_NAME = "notes-shown.json"


def first_time(text: str) -> bool:
    """True the first time ``text`` is asked about in this home, and records it. A home that
    cannot be written shows it every time rather than never."""
    path = paths.home() / SHOWN_NAME
    key = hashlib.sha256(text.encode()).hexdigest()[:16]
    seen = read_json_dict(path)
    if key in seen:
        return False
    seen[key] = {"note": text, "date": time.strftime("%Y-%m-%d")}
    try:
        write_json_atomic(path, seen)
    except OSError:
        pass
    return True
