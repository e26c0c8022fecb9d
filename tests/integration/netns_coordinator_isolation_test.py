"""Issue 25, test 3: the coordinator isolated. Two nodes of two ranks each and the coordinator,
every one a network namespace (chaos/netns/cluster.py); the coordinator's link goes down
after step 25. Every worker stops within 2 x the heartbeat timeout, each saying that it lost
the coordinator and fenced itself (it sends no vote and writes no checkpoint); the agents say so
too and stay, looking for the leader (issue 37: to rejoin if the link heals). The coordinator,
which has lost every rank, ends the job with exit 1 and a message that says where --resume
continues from. The link heals: the old agents find nothing listening at the coordinator's
address and exit 1, saying so. `troupe coordinator --resume` with the same agents' command
lines continues from the last committed checkpoint: the loss at
every step it trains and the final parameters are bit-equal to an uninterrupted run of the
same job on one host (the same reduction order: shared memory inside a node, the network
across), up to the 1e-12 that the order of the votes' float64 sum leaves free.
Needs root; Skipped (exit 77) where namespaces cannot be made."""

import os
import tempfile
import time

from harness import (SMALL_MODEL, TROUPE, checkpoint_param_diff, fail, last_job, main, run_ok,
                     step_losses)
from netns_jobs import (TroupeJob, compare_losses, logs_of, netns, of, pids_in, wait_for_step,
                        wait_gone, wait_job)

STEPS = 80
ISOLATE_AFTER = 25
HEARTBEAT_MS = 2000
# Workers and agents give up on a silent coordinator after this (the default is 5 x the
# heartbeat timeout); 1.5 x keeps the cut-off side gone within the bound below.
COORDINATOR_MS = 3 * HEARTBEAT_MS // 2
BOUND_S = 2 * HEARTBEAT_MS / 1000
ARGS = SMALL_MODEL + ["--steps", str(STEPS), "--checkpoint-every", "10", "--metrics-port", "0",
                      "--heartbeat-timeout-ms", str(HEARTBEAT_MS), "--step-timeout-ms", "30000",
                      "--coordinator-timeout-ms", str(COORDINATOR_MS),
                      "--world", "4", "--nodes", "2"]


def isolated(c, run_dir):
    """The job until the coordinator is cut off and everything has stopped; returns the last
    committed checkpoint's step."""
    job = TroupeJob(c, TROUPE, run_dir, ARGS, agents={"n1": None, "n2": None},
                    log_dir=os.path.join(run_dir, "logs-first"))
    job.start()
    wait_for_step(job, ISOLATE_AFTER, 120, "before the isolation")
    workers = [e["pid"] for e in of(job.events(), "rank_joined")]
    on_nodes = pids_in(c, "n1") + pids_in(c, "n2")
    c.isolate_coordinator()
    cut = time.monotonic()
    print(f"coordinator isolated after step {max(e['step'] for e in of(job.events(), 'step'))}; "
          f"workers {workers}, every process on the nodes {on_nodes}", flush=True)
    # Each worker stops on its own (its agent, cut off too, only backs it up).
    took = {}
    for pid in workers:
        took[pid] = wait_gone([pid], cut, BOUND_S, f"worker {pid} after the isolation")
    agents = [p for p in on_nodes if p not in workers]
    left = [p for p in pids_in(c, "n1") + pids_in(c, "n2") if p not in agents]
    if left:
        fail(f"processes other than the agents still run on the nodes after the isolation: {left}")
    print(f"workers gone {', '.join(f'{t:.2f}s' for t in sorted(took.values()))} after the "
          f"isolation (bound {BOUND_S:.1f}s); the agents {agents} stay", flush=True)
    for node in ("n1", "n2"):
        log = job.log(f"agent-{node}")
        fenced = [line for line in log.splitlines()
                  if "lost the coordinator" in line and "fenced: this worker" in line]
        if len(fenced) != 2:
            fail(f"{node}: expected each of its 2 workers to say it lost the coordinator and "
                 f"fenced itself, got {len(fenced)}:\n{log}")
        if "fenced: this node's workers" not in log or "looks for the leader" not in log:
            fail(f"{node}: its agent does not say it lost the coordinator and looks for the "
                 f"leader:\n{log}")
        print(f"{node}: {fenced[0]}", flush=True)
    code = wait_job(job, 30, "the isolated coordinator")
    events = job.events()
    failed = of(events, "job_failed")
    if code != 1 or not failed:
        fail(f"the isolated coordinator should end the job with exit 1, got {code}:\n"
             f"{logs_of(job)}")
    message = failed[-1]["message"]
    if "--resume" not in message:
        fail(f"the coordinator's last word does not say how to resume: {message}")
    print(f"coordinator: exit {code}: {message}", flush=True)
    lost = of(events, "rank_lost")
    if len(lost) != 4 or any(e["cause"] != "hang" for e in lost):
        fail(f"expected all 4 ranks lost to silence, got {lost}")
    checkpoints = [e["step"] for e in of(events, "checkpoint")]
    if not checkpoints:
        fail("no checkpoint was committed before the isolation")
    return max(checkpoints), step_losses(events), job, agents


def test():
    with tempfile.TemporaryDirectory(prefix="troupe-netns-isolation-") as tmp:
        run_dir = os.path.join(tmp, "across")
        with netns.Cluster(nodes=2) as c:
            last_checkpoint, first, job, agents = isolated(c, run_dir)
            c.heal()
            gone = wait_gone(agents, time.monotonic(), 30, "the old agents after the heal")
            for node in ("n1", "n2"):
                log = job.log(f"agent-{node}")
                code = job.agent_procs[node].wait(timeout=5)
                if "refuses connections" not in log or code != 1:
                    fail(f"{node}: the old agent should exit 1 saying that nothing listens at "
                         f"the coordinator's address, exited {code}:\n{log}")
            print(f"the old agents exited {gone:.2f}s after the heal: "
                  f"{job.log('agent-n1').splitlines()[-1][:200]}", flush=True)
            started = time.monotonic()
            resumed = TroupeJob(c, TROUPE, run_dir, ARGS + ["--resume"],
                                agents={"n1": None, "n2": None},
                                log_dir=os.path.join(run_dir, "logs-resumed"))
            resumed.start()
            code = wait_job(resumed, 240, "the resumed job")
            if code != 0:
                fail(f"the resumed job exited {code}:\n{logs_of(resumed)}")
            print(f"resumed and finished in {time.monotonic() - started:.1f}s", flush=True)
            deadline = time.monotonic() + 30
            while c.pids_in_namespaces() and time.monotonic() < deadline:
                time.sleep(0.05)
            if c.pids_in_namespaces():
                fail(f"processes left in the namespaces: {c.pids_in_namespaces()}")
            second = last_job(resumed.events())
        start = of(second, "training_started")
        if not start or start[0]["start_step"] != last_checkpoint:
            fail(f"the resumed job should continue from checkpoint step {last_checkpoint}, "
                 f"started {start}")
        got = step_losses(second)
        if sorted(got) != list(range(last_checkpoint + 1, STEPS + 1)):
            fail(f"the resumed job committed steps {sorted(got)}, expected "
                 f"{last_checkpoint + 1}..{STEPS}")
        ref_dir = os.path.join(tmp, "uninterrupted")
        reference = step_losses(run_ok("uninterrupted, one host", ARGS, ref_dir, timeout=300))
        worst_first = compare_losses("before the isolation", reference, first, sorted(first), 1e-12)
        worst = compare_losses("resumed", reference, got, sorted(got), 1e-12)
        params = checkpoint_param_diff(ref_dir, run_dir)
        if params != 0.0:
            fail(f"the resumed job's final parameters differ from an uninterrupted run by "
                 f"{params:.2e}")
        print(f"exact: resumed from step {last_checkpoint}; loss {worst:.1e} (before the "
              f"isolation {worst_first:.1e}), parameters {params:.1e} against an uninterrupted "
              f"run", flush=True)


if __name__ == "__main__":
    netns.require_netns()  # exit 77 (Skipped) where namespaces cannot be made
    main(test)
