"""The pipeline bubble of a real run (issue 3): a 1F1B job's per-stage traces
(runs/<job>/traces/rank<r>.json, one per stage, on the machine's steady clock) merge into
one timeline whose idle fraction, 1 - busy / (p * makespan), is within 10% of the textbook
(p-1)/(m+p-1). Runs alone (RUN_SERIAL): other jobs on two cores would stretch the passes."""

import json
import os
import tempfile

from harness import fail, main, run_to_end

# Big enough that a pass takes tens of milliseconds, so the schedule, not the transport, shapes the
# timeline; 4 layers split evenly over 2 stages.
BUBBLE_MODEL = ["--layers", "4", "--heads", "4", "--d-model", "256", "--context", "128", "--batch", "16",
                "--eval-every", "0", "--no-progress", "--steps", "3", "--metrics-port", "0"]


def merged_bubble(run_dir, ranks):
    """1 - busy / (stages * makespan) over the passes in the given ranks' traces."""
    busy, start, end = 0.0, None, None
    for r in ranks:
        with open(os.path.join(run_dir, "traces", f"rank{r}.json")) as f:
            events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
        if not events:
            fail(f"rank {r}'s trace has no passes")
        for e in events:
            busy += e["dur"]
            start = e["ts"] if start is None else min(start, e["ts"])
            end = e["ts"] + e["dur"] if end is None else max(end, e["ts"] + e["dur"])
    return 1.0 - busy / (len(ranks) * (end - start))


def test():
    with tempfile.TemporaryDirectory(prefix="troupe-bubble-") as tmp:
        for stages, micro in ((2, 4), (2, 8)):
            run_dir = os.path.join(tmp, f"m{micro}")
            args = BUBBLE_MODEL + ["--world", str(stages), "--pp", str(stages), "--schedule", "1f1b",
                                   "--micro-batches", str(micro)]
            code, _, output = run_to_end(args, timeout=600, run_dir=run_dir)
            if code != 0:
                fail(f"the 1F1B job exited {code}:\n{output}")
            ideal = (stages - 1) / (micro + stages - 1)
            measured = merged_bubble(run_dir, range(stages))
            print(f"1F1B p={stages} m={micro}: bubble {measured:.4f} measured, {ideal:.4f} ideal "
                  f"({measured / ideal - 1:+.1%})")
            if abs(measured - ideal) > 0.1 * ideal:
                fail(f"the measured bubble {measured:.4f} is not within 10% of (p-1)/(m+p-1) = {ideal:.4f}")


if __name__ == "__main__":
    main(test)
