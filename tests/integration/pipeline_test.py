"""Pipeline parallelism in real jobs (issue 3): every layout with pipeline stages (and ZeRO-1
with tensor parallelism) trains 20 steps with the same loss at every step as one rank with
the same global batch (within 1e-4 relative) and the same final parameters (relative L2
within 1e-4, read back from its checkpoint in the single-rank layout). Then the bubble: a
1F1B run's per-stage traces (runs/<job>/traces/rank<r>.json) merge into one timeline whose
idle fraction is within 10% of (p-1)/(m+p-1)."""

import json
import os
import subprocess
import tempfile

from harness import SMALL_MODEL, fail, main, relative_difference, run_to_end, step_losses

STEPS = 20
COMMON = SMALL_MODEL + ["--steps", str(STEPS), "--metrics-port", "0", "--checkpoint-every", "10"]
DIFF = os.environ.get("CHECKPOINT_DIFF", "")
LAYOUTS = {
    "pp2 gpipe": ["--world", "2", "--pp", "2", "--schedule", "gpipe", "--micro-batches", "4"],
    "pp2 1f1b": ["--world", "2", "--pp", "2", "--schedule", "1f1b", "--micro-batches", "4"],
    "tp2xpp2": ["--world", "4", "--tp", "2", "--pp", "2", "--micro-batches", "4"],
    "dp2xpp2 zero1": ["--world", "4", "--pp", "2", "--zero", "1", "--micro-batches", "4"],
    "tp2 zero1": ["--world", "2", "--tp", "2", "--zero", "1"],
    "dp2xtp2xpp2": ["--world", "8", "--tp", "2", "--pp", "2", "--micro-batches", "4"],
}
# Big enough that a pass takes milliseconds, so the schedule, not the transport, shapes the
# timeline; 4 layers split evenly over 2 stages.
BUBBLE_MODEL = ["--layers", "4", "--heads", "4", "--d-model", "128", "--context", "64", "--batch", "16",
                "--eval-every", "0", "--no-progress", "--steps", "3", "--metrics-port", "0"]


def run(name, args, run_dir, timeout=600):
    code, events, output = run_to_end(args, timeout=timeout, run_dir=run_dir)
    if code != 0:
        fail(f"{name} exited {code}:\n{output}")
    return events


def param_diff(a, b):
    out = subprocess.run([DIFF, a, b], capture_output=True, text=True)
    if out.returncode != 0:
        fail(f"checkpoint_diff failed: {out.stderr}")
    return float(out.stdout.split()[1])


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
    if not DIFF:
        fail("CHECKPOINT_DIFF is not set")
    with tempfile.TemporaryDirectory(prefix="troupe-pipeline-") as tmp:
        ref_dir = os.path.join(tmp, "one")
        reference = step_losses(run("one rank", COMMON + ["--world", "1"], ref_dir))
        for name, args in LAYOUTS.items():
            run_dir = os.path.join(tmp, name.replace(" ", "_"))
            events = run(name, COMMON + args, run_dir)
            started = next(e for e in events if e.get("event") == "training_started")
            losses = step_losses(events)
            if sorted(losses) != sorted(reference):
                fail(f"{name} reported steps {sorted(losses)}")
            worst = max(relative_difference(reference[s], losses[s]) for s in reference)
            params = param_diff(ref_dir, run_dir)
            print(f"{name:14s} ({started['layout']['describe']}): loss {worst:.2e}, final parameters {params:.2e}")
            if worst > 1e-4 or params > 1e-4:
                fail(f"{name} is not exact against one rank")

        stages, micro = 2, 8
        run_dir = os.path.join(tmp, "bubble")
        run("1f1b bubble", BUBBLE_MODEL + ["--world", str(stages), "--pp", str(stages), "--schedule", "1f1b",
                                          "--micro-batches", str(micro)], run_dir)
        ideal = (stages - 1) / (micro + stages - 1)
        measured = merged_bubble(run_dir, range(stages))
        print(f"1F1B p={stages} m={micro}: bubble {measured:.4f} measured, {ideal:.4f} ideal "
              f"({measured / ideal - 1:+.1%})")
        if abs(measured - ideal) > 0.1 * ideal:
            fail(f"the measured bubble {measured:.4f} is not within 10% of (p-1)/(m+p-1) = {ideal:.4f}")


if __name__ == "__main__":
    main(test)
