"""Exactness of parallel layouts in real jobs (issue 3): each layout trains 20 steps with
the same loss at every step as one rank with the same global batch (within 1e-4
relative), and its final parameters, read back from its checkpoint in the single-rank
layout, match the one-rank run's within 1e-4 (relative L2 norm of the difference). A checkpoint written by one layout resumes
on another (data-parallel -> tensor-parallel)."""

import os
import tempfile

from harness import SMALL_MODEL, checkpoint_param_diff, fail, last_job, main, relative_difference, run_ok, step_losses

STEPS = 20
COMMON = SMALL_MODEL + ["--steps", str(STEPS), "--metrics-port", "0", "--checkpoint-every", "10"]
LAYOUTS = {
    "dp2": ["--world", "2"],
    "tp2": ["--world", "2", "--tp", "2"],
    "dp2xtp2": ["--world", "4", "--tp", "2"],
    "dp2 zero1": ["--world", "2", "--zero", "1"],
}






def run(name, args, run_dir):
    return run_ok(name, COMMON + args, run_dir, timeout=300)


def test():
    with tempfile.TemporaryDirectory(prefix="troupe-layouts-") as tmp:
        ref_dir = os.path.join(tmp, "one")
        reference = step_losses(run("one rank", ["--world", "1"], ref_dir))
        for name, args in LAYOUTS.items():
            run_dir = os.path.join(tmp, name.replace(" ", "_"))
            events = run(name, args, run_dir)
            layout = next(e["layout"] for e in events if e.get("event") == "training_started")
            losses = step_losses(events)
            worst = max(relative_difference(reference[s], losses[s]) for s in reference)
            params = checkpoint_param_diff(ref_dir, run_dir)
            print(f"{name:10s} ({layout['describe']}): loss {worst:.2e}, final parameters {params:.2e}")
            if worst > 1e-4 or params > 1e-4:
                fail(f"{name} is not exact against one rank")

        # dp2 writes step 10, tp2 resumes it: the checkpoint is layout-independent.
        run_dir = os.path.join(tmp, "switch")
        run("dp2 first half", ["--world", "2", "--exit-after-step", "10"], run_dir)
        resumed = step_losses(last_job(run("tp2 resume", ["--world", "2", "--tp", "2", "--resume"], run_dir)))
        if sorted(resumed) != list(range(11, STEPS + 1)):
            fail(f"resume on tp2 trained {sorted(resumed)}")
        worst = max(relative_difference(reference[s], resumed[s]) for s in resumed)
        print(f"dp2 checkpoint resumed as tp2: loss {worst:.2e}, final parameters {checkpoint_param_diff(ref_dir, run_dir):.2e}")
        if worst > 1e-4:
            fail("resuming a dp2 checkpoint as tp2 diverges")


if __name__ == "__main__":
    main(test)
