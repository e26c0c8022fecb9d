"""SIGTERM and SIGUSR1 mean "a scheduler wants the nodes back" (issue 25): the job commits the
next step with a checkpoint, stops, and exits 75 ("requeue me"); `--resume` continues from that
step and ends bit-equal to an uninterrupted run. A second SIGTERM changes nothing (Slurm sends
one to every process, and the batch script forwards its own); Ctrl-C keeps its exit 130.
On this machine, no scheduler needed: tests/integration/slurm_test.py does it under Slurm."""

import os
import signal
import tempfile

from harness import (SMALL_MODEL, Job, checkpoint_param_diff, fail, last_job, main,
                     relative_difference, run_ok, step_losses, wait_until)

STEPS = 300
COMMON = SMALL_MODEL + ["--world", "2", "--steps", str(STEPS), "--checkpoint-every", "100",
                        "--metrics-port", "0"]
REQUEUE = 75


def committed(job):
    steps = [e["step"] for e in job.events() if e.get("event") == "step"]
    return max(steps) if steps else 0


def preempted_run(run_dir, sig, extra=()):
    """Runs until step 10, sends `sig` (twice, the second at once), expects exit 75 with a
    checkpoint of the last committed step; returns that step."""
    with Job(COMMON + list(extra), run_dir=run_dir) as job:
        wait_until(lambda: committed(job) >= 10 or job.proc.poll() is not None, 120, "step 10")
        at = committed(job)
        job.proc.send_signal(sig)
        job.proc.send_signal(sig)
        code = job.wait(120)
        out = job.output()
        events = last_job(job.events())
        if code != REQUEUE:
            fail(f"{sig.name}: expected exit {REQUEUE}, got {code}:\n{out}")
        last = max(e["step"] for e in events if e.get("event") == "step")
        checkpoints = [e["step"] for e in events if e.get("event") == "checkpoint"]
        if last >= STEPS or last < at or not checkpoints or max(checkpoints) != last:
            fail(f"{sig.name} at step {at}: last committed step {last}, checkpoints {checkpoints}:"
                 f"\n{out}")
        if not any(e.get("event") == "preempted" for e in events):
            fail(f"{sig.name}: no preempted event")
        for words in ("requeue", f"checkpoint is step {last}"):
            if words not in out:
                fail(f"{sig.name}: '{words}' is not in the output:\n{out}")
        job.assert_no_process_left()
        print(f"{sig.name} at step {at}: checkpoint step {last}, exit {code}", flush=True)
        return last


def test():
    with tempfile.TemporaryDirectory(prefix="troupe-preempt-") as tmp:
        ref_dir = os.path.join(tmp, "ref")
        reference = step_losses(run_ok("uninterrupted", COMMON, ref_dir))
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            run_dir = os.path.join(tmp, sig.name)
            last = preempted_run(run_dir, sig)
            events = run_ok(f"resume after {sig.name}", COMMON + ["--resume"], run_dir)
            resumed = step_losses(last_job(events))
            if sorted(resumed) != list(range(last + 1, STEPS + 1)):
                fail(f"resume after {sig.name}: trained {min(resumed)}..{max(resumed)}, expected "
                     f"{last + 1}..{STEPS}")
            losses = step_losses(events)
            worst = max(relative_difference(reference[s], losses[s]) for s in losses)
            params = checkpoint_param_diff(ref_dir, run_dir)
            # The loss of a step is a float64 sum of the ranks' votes in arrival order: 1e-12
            # leaves that order free; the model must be the same to the last bit.
            if worst > 1e-12 or params != 0.0:
                fail(f"resume after {sig.name}: differs from the uninterrupted run: loss by "
                     f"{worst:.2e}, parameters by {params:.2e} (expected bit-equal)")
            print(f"resume after {sig.name}: steps {last + 1}..{STEPS} bit-equal", flush=True)
        # Ctrl-C is an interrupt, not a preemption: exit 130 as before.
        with Job(COMMON, run_dir=os.path.join(tmp, "sigint")) as job:
            wait_until(lambda: committed(job) >= 5 or job.proc.poll() is not None, 120, "step 5")
            job.proc.send_signal(signal.SIGINT)
            code = job.wait(120)
            if code != 130:
                fail(f"SIGINT: expected exit 130, got {code}:\n{job.output()}")


if __name__ == "__main__":
    main(test)
