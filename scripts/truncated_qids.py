#!/usr/bin/env python3
"""Print the problems of a results file that some row left unfinished: stopped at max tokens (or
the context) while still working, not in a loop. They are the problems a larger max tokens could
change, so the quality study re-runs them with one (`bench --qid "$(this script F)" ...`);
`--looping N` adds the first N problems whose cut-off rows all loop, to check that more tokens
only lengthen a loop.

    python scripts/truncated_qids.py RESULTS [--methods M1,M2] [--looping N]

Prints the qids comma-separated in the file's problem order, or nothing when there are none.
"""

from __future__ import annotations

import argparse
import sys

from easd_local.bench.loops import is_looping, is_truncated
from easd_local.bench.report import latest_rows, load_results, select_rows
from easd_local.errors import ConfigError


def unfinished_qids(rows: list[dict], looping: int = 0) -> list[str]:
    index: dict[str, int] = {}
    working: set[str] = set()  # some row was cut off while not in a loop
    for row in latest_rows(rows)[0]:
        if is_truncated(row):
            index.setdefault(row["qid"], row["index"])
            if not is_looping(row):
                working.add(row["qid"])
    in_order = sorted(index, key=lambda q: (index[q], q))
    loops_only = [q for q in in_order if q not in working][:looping]
    return [q for q in in_order if q in working or q in loops_only]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", help="a results file written by easd-local bench --out")
    ap.add_argument("--methods", help="only these methods' rows (comma-separated; default: all)")
    ap.add_argument("--looping", type=int, default=0, metavar="N",
                    help="also the first N problems whose cut-off rows all loop (default 0)")
    args = ap.parse_args(argv)
    try:
        rows = load_results(args.results)
        if args.methods is not None:
            rows = select_rows(rows, methods=[m.strip() for m in args.methods.split(",") if m.strip()])
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(",".join(unfinished_qids(rows, max(args.looping, 0))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
