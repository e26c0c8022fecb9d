#!/usr/bin/env bash
# The workload seam's cost (issue 39): the same job through two `troupe` binaries, run
# alternately ROUNDS times each in this session: BASE (built before the worker drove the GPT
# through runtime/workload/workload.hpp) and NEW. Each run is the default model at world 2 with
# a checkpoint every 40 steps; its figure is the job's tokens per second from the first
# committed step after SKIP to the last (events.jsonl), which leaves out start-up. Prints
# each run, the medians and NEW/BASE.
#
# usage: bench/seam_bench.sh BASE_TROUPE NEW_TROUPE [ROUNDS]   (STEPS=160, SKIP=20)
set -euo pipefail
base=$1
new=$2
rounds=${3:-5}
steps=${STEPS:-160}
skip=${SKIP:-20}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rate() {  # tokens/s between step SKIP and the last step of a run directory's events
  /usr/bin/python3 - "$1/events.jsonl" "$skip" <<'PY'
import json, sys
steps = [e for e in (json.loads(l) for l in open(sys.argv[1]) if l.strip()) if e.get("event") == "step"]
skip = int(sys.argv[2])
first = next(e for e in steps if e["step"] > skip)
last = steps[-1]
tokens = sum(e["tokens"] for e in steps if first["step"] < e["step"] <= last["step"])
print(f"{tokens / ((last['unix_ms'] - first['unix_ms']) / 1000):.0f}")
PY
}
for ((r = 1; r <= rounds; r++)); do
  for which in base new; do
    bin=$base; [[ $which == new ]] && bin=$new
    dir=$tmp/$which-$r
    "$bin" run --world 2 --steps "$steps" --checkpoint-every 40 --metrics-port 0 \
      --run-dir "$dir" --no-progress >/dev/null 2>&1
    figure=$(rate "$dir")
    echo "round $r $which: $figure tokens/s"
    echo "$figure" >> "$tmp/$which"
  done
done
median() { sort -n "$1" | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
b=$(median "$tmp/base")
n=$(median "$tmp/new")
echo "median base $b tokens/s, new $n tokens/s, new/base $(awk -v n="$n" -v b="$b" 'BEGIN {printf "%.3f", n / b}')"
