"""A coordinator that is paused (SIGSTOP, as a stalled VM would be) costs the job a pause and
nothing else: workers and agents wait longer for a silent coordinator (--coordinator-timeout-ms,
by default 5 x the heartbeat timeout) than it waits for them, and the coordinator, waking up,
sees that it was itself stalled instead of declaring every member hung. Paused for 2 s, and
again for 3.5 s (past the 1.5 x heartbeat timeout at which members used to give up on it), the
job ends with exit 0, with the same worker processes throughout and the same losses, step by
step, as an undisturbed run with the same seed."""

import os
import signal
import tempfile
import time

from harness import Job, fail, main, run_ok, step_losses, wait_until

STEPS = 30
# The default model, so that a step takes long enough to pause in the middle of training.
ARGS = ["--world", "2", "--steps", str(STEPS), "--seed", "7", "--metrics-port", "0",
        "--checkpoint-every", "0", "--eval-every", "0", "--no-progress"]


def of(events, name):
    return [e for e in events if e.get("event") == name]


def paused_run(name, tmp, pause_s, reference):
    with Job(ARGS, run_dir=os.path.join(tmp, name.replace(" ", "-"))) as job:
        wait_until(lambda: any(e["step"] >= 5 for e in of(job.events(), "step")), 120, "step 5")
        workers = sorted(e["pid"] for e in of(job.events(), "rank_joined"))
        os.kill(job.proc.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            time.sleep(pause_s)
        finally:
            os.kill(job.proc.pid, signal.SIGCONT)
        print(f"{name}: paused the coordinator for {time.monotonic() - stopped:.2f}s after step "
              f"{max(e['step'] for e in of(job.events(), 'step'))}", flush=True)
        code = job.wait(300)
        events, output = job.events(), job.output()
        if code != 0:
            fail(f"{name}: the paused job exited {code}:\n{output}")
        lost = of(events, "rank_lost")
        if lost:
            fail(f"{name}: the coordinator's own pause cost members: {lost}\n{output}")
        joined = sorted(e["pid"] for e in of(events, "rank_joined"))
        if joined != workers:
            fail(f"{name}: workers changed across the pause: {workers} before, {joined} in all")
        if "lost the coordinator" in output:
            fail(f"{name}: a worker or agent gave up on the paused coordinator:\n{output}")
        if "noticed a stall of" not in output:
            fail(f"{name}: the coordinator did not say that it noticed its own stall:\n{output}")
        ref, got = step_losses(reference), step_losses(events)
        if sorted(got) != list(range(1, STEPS + 1)):
            fail(f"{name}: steps committed: {sorted(got)}")
        differ = {s: (ref[s], got[s]) for s in ref if got.get(s) != ref[s]}
        if differ:
            fail(f"{name}: losses differ from the undisturbed run at steps {differ}")
        print(f"{name}: exit 0, workers {joined} throughout, {STEPS} losses equal the "
              "undisturbed run's", flush=True)


def test():
    with tempfile.TemporaryDirectory(prefix="troupe-pause-") as tmp:
        reference = run_ok("reference", ARGS, os.path.join(tmp, "reference"), timeout=300)
        paused_run("paused 2 s", tmp, 2.0, reference)
        # Past the old bound of 1.5 x the default heartbeat timeout (3 s), well within the
        # coordinator timeout's default (10 s).
        paused_run("paused 3.5 s", tmp, 3.5, reference)


if __name__ == "__main__":
    main(test)
