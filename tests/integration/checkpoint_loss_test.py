"""A rank lost while a checkpoint is being collected costs a few steps of checkpoint, never an
interval (issue 24). dp4 with --checkpoint-every 500: rank 2 is killed with kill -9 the moment
step 500 is committed (the fault fires as step 501 begins), before it can write its share of
checkpoint 500. The survivors' shares are no whole checkpoint, so checkpoint 500 is abandoned
(a checkpoint_abandoned event, no checkpoint_failed), and the new generation's first
committed step takes a checkpoint in its place, at once; before, the next one came 500 steps
later. Ctrl-C as soon as that checkpoint is committed (the next one due is 499 steps away) ends
the job with exit 130; LATEST names the replacement and `troupe ckpt verify` reads it back."""

import os
import signal
import subprocess
import time

from harness import SMALL_MODEL, TROUPE, Job, fail, main

EVERY = 500
ARGS = SMALL_MODEL + ["--world", "4", "--steps", str(2 * EVERY), "--checkpoint-every", str(EVERY),
                      "--metrics-port", "0", "--step-timeout-ms", "20000",
                      "--fault", f"kill:rank=2:step={EVERY + 1}"]


def of(events, name):
    return [e for e in events if e.get("event") == name]


def poll(predicate, timeout, what, job):
    """Like harness.wait_until, but every 20 ms: the test must act within the 499 steps (a
    few seconds at the least) between the replacement checkpoint and the next one due."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if job.proc.poll() is not None:
            fail(f"the job ended (exit {job.proc.returncode}) before {what}:\n{job.output()}")
        if time.monotonic() > deadline:
            fail(f"timed out after {timeout}s waiting for {what}:\n{job.output()}")
        time.sleep(0.02)


def replacement(events):
    return next((e for e in of(events, "checkpoint") if EVERY <= e["step"] < 2 * EVERY), None)


def test():
    with Job(ARGS) as job:
        saved = poll(lambda: replacement(job.events()), 60, "a checkpoint after the loss", job)
        job.proc.send_signal(signal.SIGINT)
        code = job.wait(60)
        events, out = job.events(), job.output()
        if code != 130:
            fail(f"Ctrl-C should end the job with exit code 130, got {code}:\n{out}")

        faults = of(events, "fault")
        if not faults or faults[0]["step"] != EVERY + 1:
            fail(f"expected the kill as step {EVERY + 1} began, got {faults}")
        if not any(e.get("rank") == 2 for e in of(events, "rank_lost")):
            fail(f"no rank_lost event for rank 2: {of(events, 'rank_lost')}")
        abandoned = of(events, "checkpoint_abandoned")
        if [e["step"] for e in abandoned] != [EVERY]:
            fail(f"expected checkpoint {EVERY} abandoned once, got {abandoned}")
        if of(events, "checkpoint_failed"):
            fail(f"the loss was reported as a failed checkpoint: {of(events, 'checkpoint_failed')}")
        if any(e["step"] == EVERY and e["generation"] == 1 for e in of(events, "checkpoint")):
            fail(f"checkpoint {EVERY} committed although the victim never wrote its share")

        # The replacement is the new generation's first committed step, and says what it replaces.
        generation = next((g for g in of(events, "generation") if g["number"] == saved["generation"]), None)
        if saved["generation"] < 2 or generation is None:
            fail(f"the replacement should come from a generation after the loss: {saved}")
        if saved["step"] != generation["start_step"] + 1:
            fail(f"checkpoint at step {saved['step']}, but generation {generation['number']} started "
                 f"at step {generation['start_step']}: not at once")
        if saved.get("replaces") != EVERY:
            fail(f"the replacement does not name checkpoint {EVERY}: {saved}")
        later = [e["step"] for e in of(events, "checkpoint") if e["step"] > saved["step"]]
        if later:
            fail(f"checkpoints after the replacement {later}: the test reacted too late")

        latest_path = os.path.join(job.run_dir, "checkpoints", "LATEST")
        with open(latest_path) as f:
            latest = f.read().strip()
        if latest != f"step-{saved['step']:08d}":
            fail(f"LATEST names {latest!r}, expected the replacement at step {saved['step']}")
        verify = subprocess.run([TROUPE, "ckpt", "verify", job.run_dir, "--step", str(saved["step"])],
                                capture_output=True, text=True, timeout=60)
        if verify.returncode != 0:
            fail(f"troupe ckpt verify failed ({verify.returncode}):\n{verify.stdout}{verify.stderr}")
        job.assert_no_process_left()
        print(f"rank 2 lost at step {EVERY + 1}: checkpoint {EVERY} abandoned, step {saved['step']} "
              f"committed in its place by generation {saved['generation']} (verified)")


if __name__ == "__main__":
    main(test)
