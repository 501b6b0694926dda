#!/usr/bin/env bash
# The quality study's tables (issue 16), each one `easd-local bench report` of a results file
# that scripts/quality_study.sh writes; a table whose rows do not exist yet is skipped, so this
# can run at any point of the study.
#
#   scripts/study_report.sh [DIR]        (default results/study; writes DIR/*.md and DIR/*.png)
#
# Every table takes its accuracies on the same problems (--common): the study's methods are at
# different points of the run (easd-tf one problem behind target; the sensitivity settings on
# the first 300 problems only; sd last).
set -euo pipefail
DIR=${1:-results/study}

# the methods of a results file that have rows, in the order asked for, comma-separated
present() {
    python - "$1" "$2" <<'EOF'
import json, sys
path, wanted = sys.argv[1], sys.argv[2].split(",")
seen = set()
with open(path, encoding="utf-8") as f:
    for line in f:
        try:
            seen.add(json.loads(line)["method"])
        except (ValueError, KeyError, TypeError):
            pass  # a torn last line: bench report says so
print(",".join(m for m in wanted if m in seen))
EOF
}

# report "FILE..." NAME METHODS [NEEDED]: DIR/NAME.md and DIR/NAME.png from the METHODS of the
# last FILE that have rows (several files report as one, a later file's rows replacing an
# earlier one's); skipped while NEEDED (default: the second method) has none
report() {
    local files=() f name=$2 methods need last
    for f in $1; do
        files+=("$DIR/$f")
        [[ -f $DIR/$f ]] || { echo "skip $name: no $DIR/$f yet"; return; }
    done
    last=${files[-1]}
    methods=$(present "$last" "$3")
    need=${4:-$(cut -d, -f2 <<<"$3")}
    [[ ,$methods, == *,$need,* && $methods == *,* ]] || { echo "skip $name: no $need rows in $last yet"; return; }
    echo "== $name: $methods"
    easd-local bench report "${files[@]}" --methods "$methods" --common \
        --markdown "$DIR/$name.md" --plot "$DIR/$name.png"
}

report gsm8k-greedy.jsonl gsm8k-greedy target,easd-tf
report gsm8k-greedy.jsonl gsm8k-sd-control target,sd,easd-tf sd
report gsm8k-greedy.jsonl gsm8k300-sensitivity target,sd,easd-tf,tf-p75,tf-p95,tf-p99,tf-no-overlap tf-p75
report math500-greedy.jsonl math500-greedy target,easd-tf
report gsm8k300-t07.jsonl gsm8k300-t07 target,easd-tf
report math500-unfinished-4096.jsonl math500-unfinished-4096 target,easd-tf
# MATH-500 whole: the 2,048-token rows, where a problem was re-run at 4,096 its re-run rows instead
report "math500-greedy.jsonl math500-unfinished-4096.jsonl" math500-final target,easd-tf
