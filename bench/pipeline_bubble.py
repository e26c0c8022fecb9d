#!/usr/bin/env python3
"""The measured pipeline bubble of a troupe run, from its per-stage traces.

    bench/pipeline_bubble.py RUN_DIR [--ranks 0,1]

Each rank of a pipeline job writes RUN_DIR/traces/rank<r>.json (Chrome trace, one complete
event per forward or backward pass, on the machine's steady clock, args.step = the step).
For every step this merges the stages of one pipeline (by default every rank that wrote a
trace, which is right for a pure pipeline; pass the stage ranks of one replica otherwise)
and prints 1 - busy / (stages * makespan): the idle fraction the schedule left, including
time spent moving activations. The ideal for GPipe and 1F1B is (p-1)/(m+p-1)."""

import argparse
import glob
import json
import os
import re
import statistics


def step_bubbles(run_dir, ranks=None):
    """{step: (bubble, micro_batches)} over the given ranks' traces."""
    files = {}
    for path in glob.glob(os.path.join(run_dir, "traces", "rank*.json")):
        rank = int(re.search(r"rank(\d+)\.json$", path).group(1))
        if ranks is None or rank in ranks:
            files[rank] = path
    if not files:
        raise SystemExit(f"no traces under {run_dir}/traces")
    per_step = {}
    for path in files.values():
        with open(path) as f:
            for e in json.load(f)["traceEvents"]:
                if e.get("ph") == "X":
                    per_step.setdefault(e["args"]["step"], []).append(e)
    out = {}
    for step, events in sorted(per_step.items()):
        busy = sum(e["dur"] for e in events)
        start = min(e["ts"] for e in events)
        end = max(e["ts"] + e["dur"] for e in events)
        forwards = sum(1 for e in events if e["name"].startswith("F"))
        out[step] = (1.0 - busy / (len(files) * (end - start)), forwards // len(files))
    return out, len(files)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir")
    parser.add_argument("--ranks", help="comma-separated ranks of one pipeline (default: every trace)")
    args = parser.parse_args()
    ranks = {int(r) for r in args.ranks.split(",")} if args.ranks else None
    bubbles, stages = step_bubbles(args.run_dir, ranks)
    for step, (bubble, m) in bubbles.items():
        print(f"step {step}: bubble {bubble:.4f} (p={stages}, m={m}, ideal {(stages - 1) / (m + stages - 1):.4f})")
    later = [b for s, (b, _) in bubbles.items() if s != min(bubbles)] or [b for b, _ in bubbles.values()]
    print(f"median over steps after the first: {statistics.median(later):.4f}")


if __name__ == "__main__":
    main()
