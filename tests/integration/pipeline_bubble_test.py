"""The pipeline bubble of a real run (issue 3): a 1F1B job's per-stage traces
(runs/<job>/traces/rank<r>.json, on the machine's steady clock) merge, step by step, into
one timeline whose idle fraction 1 - busy / (p * makespan) comes near the textbook
(p-1)/(m+p-1). Another process on the two cores can only stretch a pass and make the other
stage wait, so the ceiling (10% above the textbook figure) is checked on the best step after
the first: a schedule that serialises the stages (0.5 for p = 2) fails it in every step. The
floor (half the textbook figure) is checked on the median. A run above the ceiling is measured
again, up to three runs. The medians, the figures to quote, are bench/pipeline_bubble.py's
(docs/benchmarks/pipeline.md, m = 4 and 8). Runs alone (RUN_SERIAL)."""

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
        # Another process on the two cores can only add waiting, sometimes for the whole run (a
        # CI run measured 0.208-0.233 in every step once, another a median 29% over, against
        # 0.20-0.21 alone): the best step, and the best of up to three runs, is the schedule's.
        attempts = 3
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
            later = [b for s, (b, _) in bubbles.items() if s > 1]
            measured, best = statistics.median(later), min(later)
            each = ", ".join(f"{b:.3f}" for b in later)
            print(f"1F1B p={stages} m={micro}, run {attempt}: bubble {measured:.4f} median, {best:.4f} best "
                  f"(steps 2-10: {each}), {ideal:.4f} ideal ({measured / ideal - 1:+.1%}, best {best / ideal - 1:+.1%})")
            # Below the textbook figure only a loose floor: on some machines (a 2-core Xeon VM,
            # 2026-12-04) half the runs measure about 0.13 instead of 0.20, every step alike, for
            # a reason not yet found (docs/benchmarks/pipeline.md); the traces still show the
            # stages waiting for each other.
            if measured < 0.5 * ideal:
                fail(f"the measured bubble {measured:.4f} is under half of (p-1)/(m+p-1) = {ideal:.4f}: "
                     "the stages barely wait for each other, which 1F1B cannot do")
            # No more waiting than the textbook schedule (+10% for a shared machine).
            if best <= 1.1 * ideal:
                return
        fail(f"even the best step's bubble is more than 10% above (p-1)/(m+p-1) = {ideal:.4f} in {attempts} runs")

if __name__ == "__main__":
    main(test)
