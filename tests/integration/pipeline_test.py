"""Pipeline parallelism in real jobs (issue 3): every layout with pipeline stages (and ZeRO-1
with tensor parallelism) trains 20 steps with the same loss at every step as one rank with
the same global batch (within 1e-4 relative) and the same final parameters (relative L2
within 1e-4, read back from its checkpoint in the single-rank layout). Then the bubble: a
1F1B run's per-stage traces (runs/<job>/traces/rank<r>.json) merge into one timeline whose
idle fraction is within 10% of (p-1)/(m+p-1)."""

import os
import tempfile

from harness import SMALL_MODEL, checkpoint_param_diff, fail, main, relative_difference, run_ok, step_losses

STEPS = 20
COMMON = SMALL_MODEL + ["--steps", str(STEPS), "--metrics-port", "0", "--checkpoint-every", "10"]
LAYOUTS = {
    "pp2 gpipe": ["--world", "2", "--pp", "2", "--schedule", "gpipe", "--micro-batches", "4"],
    "pp2 1f1b": ["--world", "2", "--pp", "2", "--schedule", "1f1b", "--micro-batches", "4"],
    "tp2xpp2": ["--world", "4", "--tp", "2", "--pp", "2", "--micro-batches", "4"],
    "dp2xpp2 zero1": ["--world", "4", "--pp", "2", "--zero", "1", "--micro-batches", "4"],
    "dp2xtp2 zero1": ["--world", "4", "--tp", "2", "--zero", "1"],
    "dp2xtp2xpp2": ["--world", "8", "--tp", "2", "--pp", "2", "--micro-batches", "4"],
}






def test():
    with tempfile.TemporaryDirectory(prefix="troupe-pipeline-") as tmp:
        ref_dir = os.path.join(tmp, "one")
        reference = step_losses(run_ok("one rank", COMMON + ["--world", "1"], ref_dir))
        for name, args in LAYOUTS.items():
            run_dir = os.path.join(tmp, name.replace(" ", "_"))
            events = run_ok(name, COMMON + args, run_dir)
            started = next(e for e in events if e.get("event") == "training_started")
            losses = step_losses(events)
            if sorted(losses) != sorted(reference):
                fail(f"{name} reported steps {sorted(losses)}")
            worst = max(relative_difference(reference[s], losses[s]) for s in reference)
            params = checkpoint_param_diff(ref_dir, run_dir)
            print(f"{name:14s} ({started['layout']['describe']}): loss {worst:.2e}, final parameters {params:.2e}")
            if worst > 1e-4 or params > 1e-4:
                fail(f"{name} is not exact against one rank")


if __name__ == "__main__":
    main(test)
