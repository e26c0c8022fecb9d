"""The pipeline bubble of a real run (issue 3): a 1F1B job's per-stage traces
(runs/<job>/traces/rank<r>.json, on the machine's steady clock) merge, step by step, into
one timeline whose idle fraction 1 - busy / (p * makespan) is at most 10% above the textbook
(p-1)/(m+p-1), and not under half of it. The median over the steps after the first is compared, since a pass on a
shared 2-core machine is sometimes stretched by other processes, and the stages then wait
for each other; a run above the bound is measured once more (docs/BENCHMARKS.md has the
figures for m = 4 and 8). Runs alone (RUN_SERIAL)."""

import os
import statistics
import sys
import tempfile

from harness import fail, main, run_to_end

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from pipeline_bubble import step_bubbles  # noqa: E402

# Big enough that a pass takes tens of milliseconds, so the schedule, not the transport,
# shapes the timeline; 8 layers split evenly over 2 stages, so the last stage's head (ln_f, the
# tied projection, the cross-entropy) unbalances them by only a few percent.
BUBBLE_MODEL = ["--layers", "8", "--heads", "8", "--d-model", "512", "--context", "128", "--batch", "16",
                "--eval-every", "0", "--no-progress", "--steps", "10", "--metrics-port", "0"]


def test():
    with tempfile.TemporaryDirectory(prefix="troupe-bubble-") as tmp:
        stages, micro = 2, 4
        ideal = (stages - 1) / (micro + stages - 1)
        # Another process on the two cores can only add waiting, for the whole run (a CI run
        # measured 0.208-0.233 in every step once, against 0.20-0.21 alone): a run above the
        # bound is measured once more, and the better run is the schedule's.
        attempts = 2
        for attempt in range(1, attempts + 1):
            run_dir = os.path.join(tmp, f"m{micro}-{attempt}")
            args = BUBBLE_MODEL + ["--world", str(stages), "--pp", str(stages), "--schedule", "1f1b",
                                   "--micro-batches", str(micro)]
            code, _, output = run_to_end(args, timeout=600, run_dir=run_dir)
            if code != 0:
                fail(f"the 1F1B job exited {code}:\n{output}")
            bubbles, traced = step_bubbles(run_dir)
            if traced != stages or sorted(bubbles) != list(range(1, 11)):
                fail(f"expected traces of {stages} stages for steps 1-10, got {traced} stages, steps {sorted(bubbles)}")
            if any(m != micro for _, m in bubbles.values()):
                fail(f"a step ran other than {micro} micro-batches: {bubbles}")
            measured = statistics.median(b for s, (b, _) in bubbles.items() if s > 1)
            each = ", ".join(f"{b:.3f}" for s, (b, _) in bubbles.items() if s > 1)
            print(f"1F1B p={stages} m={micro}, run {attempt}: bubble {measured:.4f} measured (steps 2-10: {each}), "
                  f"{ideal:.4f} ideal ({measured / ideal - 1:+.1%})")
            # Below the textbook figure only a loose floor: on some machines (a 2-core Xeon VM,
            # 2026-12-04) half the runs measure about 0.13 instead of 0.20, every step alike, for
            # a reason not yet found (docs/BENCHMARKS.md); the traces still show the stages
            # waiting for each other.
            if measured < 0.5 * ideal:
                fail(f"the measured bubble {measured:.4f} is under half of (p-1)/(m+p-1) = {ideal:.4f}: "
                     "the stages barely wait for each other, which 1F1B cannot do")
            # No more waiting than the textbook schedule (+10% for a shared machine).
            if measured <= 1.1 * ideal:
                return
        fail(f"the measured bubble is more than 10% above (p-1)/(m+p-1) = {ideal:.4f} in {attempts} runs")

if __name__ == "__main__":
    main(test)
