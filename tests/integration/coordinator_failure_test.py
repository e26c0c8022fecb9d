"""The coordinator lost: killed (kill -9, injected at step 15) or hung (SIGSTOP). Every worker
and agent notices (a hung one within 1.5 x the heartbeat timeout, when it fences itself),
exits with a clear message and leaves no
process and no shared-memory segment behind; `troupe run --resume` then continues from the
last committed checkpoint and trains exactly the model of an uninterrupted run."""

import os
import signal
import tempfile
import time

from harness import (SMALL_MODEL, Job, checkpoint_param_diff, fail, main, pid_alive, relative_difference, run_ok,
                     run_to_end, step_losses, wait_until)

HEARTBEAT_MS = 1000
STEPS = 30
ARGS = SMALL_MODEL + ["--world", "2", "--steps", str(STEPS), "--checkpoint-every", "5", "--metrics-port", "0",
                      "--heartbeat-timeout-ms", str(HEARTBEAT_MS)]


def shm_entries():
    try:
        return {n for n in os.listdir("/dev/shm") if "troupe" in n}
    except OSError:
        return set()


def members(events):
    return [e["pid"] for e in events if e.get("event") in ("rank_joined", "agent_joined")]


def wait_gone(name, pids, since, output):
    wait_until(lambda: not any(pid_alive(p) for p in pids), 30, f"{name}: processes {pids} to exit")
    took = time.monotonic() - since
    if took > HEARTBEAT_MS / 1000 + 3:
        fail(f"{name}: members took {took:.1f}s to stop, more than the heartbeat timeout allows")
    if "lost the coordinator" not in output():
        fail(f"{name}: no clear message about the lost coordinator:\n{output()}")
    print(f"{name}: every member gone {took:.2f}s after the coordinator")


def resume_exactly(name, run_dir, reference, ref_dir):
    code, events, output = run_to_end(ARGS + ["--resume"], timeout=300, run_dir=run_dir)
    if code != 0:
        fail(f"{name}: --resume exited {code}:\n{output}")
    ref, got = step_losses(reference), step_losses(events)
    worst = max(relative_difference(ref[s], got[s]) for s in got)
    diff = checkpoint_param_diff(ref_dir, run_dir)
    if max(got) != STEPS or worst > 1e-4 or diff > 1e-4:
        fail(f"{name}: resumed run ends at {max(got)}, loss diff {worst:.2e}, parameters {diff:.2e}")
    print(f"{name}: --resume exact (loss {worst:.1e}, parameters {diff:.1e})")


def test():
    before = shm_entries()
    with tempfile.TemporaryDirectory(prefix="troupe-coord-") as tmp:
        ref_dir = os.path.join(tmp, "reference")
        reference = run_ok("reference", ARGS, ref_dir)

        # Killed: the coordinator's own fault schedule kills it when step 15 begins.
        with Job(ARGS + ["--fault", "kill:coordinator:step=15"], run_dir=os.path.join(tmp, "killed")) as job:
            code = job.wait(120)
            since = time.monotonic()
            if code != -signal.SIGKILL:
                fail(f"killed: the coordinator should die of SIGKILL, exited {code}")
            wait_gone("killed", members(job.events()), since, job.output)
            resume_exactly("killed", job.run_dir, reference, ref_dir)

        # Hung: the coordinator stops answering but keeps its connections open.
        with Job(ARGS[:-4] + ["--steps", "100000", "--heartbeat-timeout-ms", str(HEARTBEAT_MS)],
                 run_dir=os.path.join(tmp, "hung")) as job:
            wait_until(lambda: any(e.get("event") == "checkpoint" for e in job.events()), 120, "a checkpoint")
            pids = members(job.events())
            os.kill(job.proc.pid, signal.SIGSTOP)
            since = time.monotonic()
            try:
                wait_gone("hung", pids, since, job.output)
            finally:
                os.kill(job.proc.pid, signal.SIGKILL)
                os.kill(job.proc.pid, signal.SIGCONT)
    left = shm_entries() - before
    if left:
        fail(f"shared-memory segments left behind: {sorted(left)}")


if __name__ == "__main__":
    main(test)
