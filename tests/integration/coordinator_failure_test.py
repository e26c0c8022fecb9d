"""The coordinator lost: killed (kill -9, injected at step 15) or hung (SIGSTOP). Every worker
notices (a hung one within --coordinator-timeout-ms, here 1.5 x the heartbeat timeout, when it
fences itself) and exits with a clear message; killed, the agents exit too; hung, they stay and
look for the leader (it may wake up, issue 37) until the launcher goes. Nothing leaves a
process or a shared-memory segment behind (no process the job started still holds a troupe
memfd: procfs.py); `troupe run --resume` then continues from the last committed checkpoint and
trains exactly the model of an uninterrupted run."""

import os
import signal
import tempfile
import time

from harness import (SMALL_MODEL, Job, checkpoint_param_diff, fail, main, pid_alive, relative_difference, run_ok,
                     run_to_end, step_losses, wait_until)
from procfs import segments_held, tagged_env

HEARTBEAT_MS = 1000
COORDINATOR_MS = 3 * HEARTBEAT_MS // 2
STEPS = 30
ARGS = SMALL_MODEL + ["--world", "2", "--steps", str(STEPS), "--checkpoint-every", "5", "--metrics-port", "0",
                      "--coordinator-timeout-ms", str(COORDINATOR_MS), "--heartbeat-timeout-ms", str(HEARTBEAT_MS)]


def members(events):
    return [e["pid"] for e in events if e.get("event") in ("rank_joined", "agent_joined")]


def wait_gone(name, pids, since, output, tag):
    wait_until(lambda: not any(pid_alive(p) for p in pids), 30, f"{name}: processes {pids} to exit")
    took = time.monotonic() - since
    if took > HEARTBEAT_MS / 1000 + 3:
        fail(f"{name}: members took {took:.1f}s to stop, more than the heartbeat timeout allows")
    if "lost the coordinator" not in output():
        fail(f"{name}: no clear message about the lost coordinator:\n{output()}")
    # A segment lives while any process holds it: one the job started and the events do not
    # name (a standby worker, a helper) would keep it. Such a process gets a few seconds to
    # finish exiting.
    deadline = time.monotonic() + 5
    while (held := segments_held(tag)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if held:
        fail(f"{name}: processes of the job still hold shared-memory segments: {held}")
    print(f"{name}: every member gone {took:.2f}s after the coordinator, no segment held")


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
    with tempfile.TemporaryDirectory(prefix="troupe-coord-") as tmp:
        ref_dir = os.path.join(tmp, "reference")
        reference = run_ok("reference", ARGS, ref_dir)

        # Killed: the coordinator's own fault schedule kills it when step 15 begins.
        env, tag = tagged_env()
        with Job(ARGS + ["--fault", "kill:coordinator:step=15"], run_dir=os.path.join(tmp, "killed"),
                 env=env) as job:
            code = job.wait(120)
            since = time.monotonic()
            if code != -signal.SIGKILL:
                fail(f"killed: the coordinator should die of SIGKILL, exited {code}")
            wait_gone("killed", members(job.events()), since, job.output, tag)
            resume_exactly("killed", job.run_dir, reference, ref_dir)

        # Hung: the coordinator stops answering but keeps its connections open.
        env, tag = tagged_env()
        with Job(ARGS[:-4] + ["--steps", "100000", "--heartbeat-timeout-ms", str(HEARTBEAT_MS),
                              "--coordinator-timeout-ms", str(COORDINATOR_MS)],
                 run_dir=os.path.join(tmp, "hung"), env=env) as job:
            wait_until(lambda: any(e.get("event") == "checkpoint" for e in job.events()), 120, "a checkpoint")
            workers = [e["pid"] for e in job.events() if e.get("event") == "rank_joined"]
            agents = [e["pid"] for e in job.events() if e.get("event") == "agent_joined"]
            # The check below can see a segment: the training ranks hold their group's.
            held = segments_held(tag)
            if not any(n.startswith("troupe-g") for names in held.values() for n in names):
                fail(f"hung: no troupe segment found in a training job's processes: {held}")
            os.kill(job.proc.pid, signal.SIGSTOP)
            since = time.monotonic()
            try:
                wait_gone("hung", workers, since, job.output, tag)
                if not all(pid_alive(p) for p in agents) or \
                        "looks for the leader" not in job.output():
                    fail(f"hung: the agents {agents} should stay and look for the leader:\n"
                         f"{job.output()}")
            finally:
                os.kill(job.proc.pid, signal.SIGKILL)
                os.kill(job.proc.pid, signal.SIGCONT)
            # The launcher is gone: its agents go with it.
            wait_until(lambda: not any(pid_alive(p) for p in agents), 15,
                       "hung: the agents to exit after the launcher")


if __name__ == "__main__":
    main(test)
