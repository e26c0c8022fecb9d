"""Issue 37: a healed partition heals the job. Two nodes of two ranks, every one a network
namespace (chaos/netns/cluster.py), default heartbeat (2 s) and coordinator (10 s) timeouts.

(a) node n2's link is cut at step 15 and restored 5 s later. The coordinator declares n2's
    ranks lost at the heartbeat timeout and goes on with n1's two. n2's workers stop computing
    at twice the heartbeat timeout of their last word from it (their own log says after how
    long, and their CPU time stands still from then on); at the heal their old heartbeats
    reach the coordinator, which answers that they were removed: they exit 3, their agent
    starts the members again, and a later generation has all 4 ranks.
(b) the same with the link restored after 60 s: n2's workers fence themselves at the
    coordinator timeout, the agent stops them but stays, looks for the leader with backoff and
    rejoins when the link heals, starting its members again; the job grows back to 4 ranks.
(c) with --rejoin-timeout-ms 3000, n2's agent gives up 3 s after it lost the coordinator: it
    exits 1 and its log names the option; the job finishes on n1.
(d) with a standby coordinator (etcd in a namespace of its own, as netns_leader_isolation_test
    runs it), n2's link cut for 20 s: its agent looks for the leader among both coordinators
    for the coordinator timeout, stops its workers, keeps looking and rejoins after the heal;
    the job grows back to 4 ranks and ends with exit 0 under the same leader. Skipped (with a
    note) where etcd is not installed.

(a) and (b) end with exit 0, every step committed once, each step's loss and the final
parameters bit-for-bit what one host computes through the same schedule of worlds, undisturbed
(4 ranks, then 2 from the step the shrunk generation continued from, then 4 again from the step
the regrown one did; 3 in between when the returning members join one at a time). Against an
uninterrupted 4-rank run the losses drift (float32 reassociation of fewer replicas, amplified
over hundreds of steps), and the mean loss of the last 50 steps agrees within 2 %.
n1's link carries 50 ms of delay from the cut until the job has grown back, which paces the
job so that it still runs when the link heals. Needs root; Skipped (exit 77) where namespaces
cannot be made."""

import os
import re
import tempfile
import time

from harness import SMALL_MODEL, TROUPE, checkpoint_param_diff, fail, main, \
    relative_difference, run_ok, step_losses
from netns_leader_isolation_test import ETCD, start_etcd, start_standby
from netns_jobs import (TroupeJob, compare_losses, logs_of, netns, of, pids_in, run_schedule,
                        wait_for_step, wait_job, worlds_of, batch_of)

CUT_AFTER = 15
HEARTBEAT_S = 2.0
COORDINATOR_S = 5 * HEARTBEAT_S  # the default: --coordinator-timeout-ms 0
PACE_MS = 50
TAIL_AGREEMENT = 0.02  # the last 50 steps' mean loss against an uninterrupted run (check_exact)
ARGS = batch_of(SMALL_MODEL, 24) + ["--checkpoint-every", "50", "--metrics-port", "0",
                                   "--step-timeout-ms", "30000"]


def cpu_seconds(pid):
    """User + system CPU time of a process; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_for(what, condition, timeout, job):
    deadline = time.monotonic() + timeout
    while not condition():
        if job.coordinator.poll() is not None:
            fail(f"{what}: the coordinator exited {job.coordinator.returncode}:\n{logs_of(job)}")
        if time.monotonic() > deadline:
            fail(f"{what}: not within {timeout}s:\n{logs_of(job)}")
        time.sleep(0.02)


def start_job(c, run_dir, steps, extra=()):
    job = TroupeJob(c, TROUPE, run_dir, ARGS + ["--steps", str(steps), "--world", "4",
                                                "--nodes", "2"] + list(extra),
                    agents={"n1": None, "n2": None})
    # n1 joins first and is node 0 (members 0 and 1), as on the one host that the job is
    # compared with: a regrown generation with the nodes the other way round sums the nodes'
    # shares in another order (a difference of 1e-8, not of bits).
    job.start_coordinator()
    job.start_agent("n1")
    wait_for("n1's agent to join", lambda: of(job.events(), "agent_joined"), 60, job)
    job.start_agent("n2")
    wait_for_step(job, CUT_AFTER, 120, "before the cut")
    cut_side = pids_in(c, "n2")
    workers = [e["pid"] for e in of(job.events(), "rank_joined") if e["pid"] in cut_side]
    members = sorted(e["member"] for e in of(job.events(), "rank_joined") if e["pid"] in cut_side)
    agent = job.agent_procs["n2"].pid
    if len(workers) != 2 or agent not in cut_side:
        fail(f"expected n2's agent {agent} and two workers in its namespace, found {cut_side}")
    return job, agent, workers, members


def check_stopped_computing(job, workers, cut_at, until):
    """n2's workers stop computing within 2 x the heartbeat timeout of their last word from
    the coordinator: their CPU time stands still from then until `until` (monotonic), and each
    says after how much silence it stopped."""
    settle = cut_at + 2 * HEARTBEAT_S + 0.5
    while time.monotonic() < settle:
        time.sleep(0.02)
    first = {p: cpu_seconds(p) for p in workers}
    while time.monotonic() < until:
        time.sleep(0.02)
    last = {p: cpu_seconds(p) for p in workers}
    window = until - settle
    for p in workers:
        if first[p] is None or last[p] is None:
            fail(f"worker {p} of n2 exited before {until - cut_at:.1f}s after the cut: "
                 f"nothing to measure\n{logs_of(job)}")
        if last[p] - first[p] > 0.05 * window + 0.02:
            fail(f"worker {p} of n2 used {last[p] - first[p]:.2f}s of CPU in the {window:.1f}s "
                 f"from 2 x the heartbeat timeout after the cut: it did not stop computing")
    return {p: last[p] - first[p] for p in workers}, window


def stop_silences(log):
    """The silence after which each n2 worker stopped, from its own words."""
    return [float(s) for s in
            re.findall(r"lost the coordinator \(no heartbeat from it for ([0-9.]+) s\)", log)]


def check_regrown(name, events, members, heal_ms):
    """The generation that grew back: world 4 after the heal, n2's members placed in it."""
    lost = of(events, "rank_lost")
    if sorted(e["member"] for e in lost) != members or any(e["cause"] != "hang" for e in lost):
        fail(f"{name}: expected n2's members {members} lost to silence (hang), got {lost}")
    generations = of(events, "generation")
    shrunk = [g for g in generations if g["world"] == 2]
    regrown = [g for g in generations if g["world"] == 4 and g["unix_ms"] >= heal_ms]
    if not shrunk or not regrown:
        fail(f"{name}: expected a generation of world 2 and one of world 4 after the heal, got "
             f"{[(g['number'], g['world']) for g in generations]}")
    placed = {e["member"] for e in of(events, "restored")
              if e["generation"] == regrown[0]["number"]}
    if not set(members) <= placed:
        fail(f"{name}: n2's members {members} are not placed in generation "
             f"{regrown[0]['number']} (placed: {sorted(placed)})")
    final = generations[-1]
    if final["world"] != 4:
        fail(f"{name}: the job ended on {final['world']} ranks, not 4")
    return shrunk[0], regrown[0]


def check_exact(name, tmp, steps, events, run_dir, plain_dir):
    got = step_losses(events)
    if sorted(got) != list(range(1, steps + 1)):
        fail(f"{name}: steps committed: {sorted(got)[:5]}..{sorted(got)[-5:]} (each of 1..{steps} "
             "once expected)")
    ref_dir = os.path.join(tmp, f"{name}-schedule")
    schedule = worlds_of(events, steps)
    reference = run_schedule(f"{name}: one host", ARGS + ["--steps", str(steps)], schedule,
                             ref_dir)
    worst = compare_losses(f"{name}: against the same schedule of worlds", reference, got,
                           range(1, steps + 1), 1e-12)
    params = checkpoint_param_diff(ref_dir, run_dir)
    if params != 0.0:
        fail(f"{name}: the final parameters differ from the same schedule of worlds by "
             f"{params:.2e}")
    plain = step_losses(run_ok(f"{name}: uninterrupted, 4 ranks",
                               ARGS + ["--steps", str(steps), "--world", "4", "--nodes", "2"],
                               plain_dir, timeout=300))
    # Fewer replicas sum the same gradients in another float32 order; the difference is tiny
    # (1e-8) at first, and training amplifies it step by step, chaotically (the largest
    # per-step difference measured 4e-4 in one run and 1.4e-2 in another). The same training,
    # not the same bits (bit-exactness across worlds is the comparison above): the mean loss
    # of the last 50 steps agrees within 2 %.
    missing = [s for s in range(1, steps + 1) if s not in plain]
    if missing:
        fail(f"{name}: the uninterrupted run lacks steps {missing[:5]}")
    drift = max(relative_difference(plain[s], got[s]) for s in got)
    tail = range(steps - 49, steps + 1)
    mean_got = sum(got[s] for s in tail) / len(tail)
    mean_plain = sum(plain[s] for s in tail) / len(tail)
    if relative_difference(mean_plain, mean_got) > TAIL_AGREEMENT:
        fail(f"{name}: the mean loss of the last 50 steps is {mean_got:.4f}, the uninterrupted "
             f"run's {mean_plain:.4f}: more than {TAIL_AGREEMENT:.0%} apart")
    print(f"{name}: worlds (world, nodes, to step) {schedule}: loss {worst:.1e} and parameters "
          f"{params:.1e} from the same schedule on one host; against an uninterrupted 4-rank "
          f"run, up to {drift:.1e} per step and mean loss of the last 50 steps {mean_got:.4f} "
          f"against {mean_plain:.4f}", flush=True)


def heal_and_finish(name, job, cut, pace, heal_at):
    """Heals the cut at `heal_at` (monotonic), waits for the job to grow back to 4 ranks, then
    lifts the pace and waits for exit 0. Returns the heal's unix ms and the seconds from the
    heal to the generation of 4 ranks."""
    while time.monotonic() < heal_at:
        time.sleep(0.02)
    cut.revert()
    heal_ms = time.time() * 1000
    healed = time.monotonic()
    wait_for(f"{name}: a generation of 4 ranks after the heal",
             lambda: any(e["world"] == 4 and e["unix_ms"] >= heal_ms
                         for e in of(job.events(), "generation")), 60, job)
    regrow_s = time.monotonic() - healed
    pace.revert()
    code = wait_job(job, 300, f"{name}: after the heal")
    if code != 0:
        fail(f"{name}: the job exited {code}:\n{logs_of(job)}")
    return heal_ms, regrow_s


def heal_after(c, tmp, name, heal_s, steps):
    run_dir = os.path.join(tmp, name)
    job, agent, workers, members = start_job(c, run_dir, steps)
    cut = c.cut("n2")
    cut_at = time.monotonic()
    pace = c.delay("n1", PACE_MS)
    print(f"{name}: cut n2 (agent {agent}, workers {workers}, members {members}); heal in "
          f"{heal_s:.0f}s", flush=True)
    # Measured while every old worker still lives: until the heal (a), or until they fence
    # themselves (b) at the coordinator timeout after their last heartbeat, which came up to
    # one beat interval (400 ms) before the cut, later under load: a second's margin (0.3 s
    # was too little, CI 2026-12-07: a worker had gone before the window closed).
    used, window = check_stopped_computing(job, workers, cut_at,
                                           cut_at + min(heal_s - 0.3, COORDINATOR_S - 1.0))
    heal_ms, regrow_s = heal_and_finish(name, job, cut, pace, cut_at + heal_s)
    events = job.events()
    n2_log = job.log("agent-n2")
    silences = stop_silences(n2_log)
    if len(silences) != 2 or max(silences) > 2 * HEARTBEAT_S + 0.5:
        fail(f"{name}: expected both of n2's workers to stop within 2 x the heartbeat timeout "
             f"of silence, they said {silences}:\n{n2_log}")
    # The same agent process throughout, stopped by the coordinator at the job's end.
    agent_code = job.agent_procs["n2"].wait(timeout=30)
    if agent_code != 0:
        fail(f"{name}: n2's agent {agent} exited {agent_code}:\n{n2_log}")
    shrunk, regrown = check_regrown(name, events, members, heal_ms)
    new_pids = {e["pid"] for e in of(events, "rank_joined")
                if e["member"] in members and e["unix_ms"] >= heal_ms}
    if len(new_pids) != 2 or new_pids & set(workers):
        fail(f"{name}: expected two new processes for n2's members after the heal, got "
             f"{sorted(new_pids)} (old: {workers})")
    print(f"{name}: n2's workers stopped after {max(silences):.2f}s of silence (CPU "
          f"{max(used.values()):.3f}s over the next {window:.1f}s); lost at "
          f"{shrunk['start_step']}, back to 4 ranks from step {regrown['start_step']}, "
          f"{regrow_s:.1f}s after the heal", flush=True)
    return run_dir, events, n2_log, shrunk, regrown


def rejoin_timeout(c, tmp):
    name = "rejoin-timeout"
    job, agent, workers, members = start_job(c, os.path.join(tmp, name), 300,
                                             ["--rejoin-timeout-ms", "3000"])
    cut = c.cut("n2")
    cut_at = time.monotonic()
    pace = c.delay("n1", PACE_MS)
    proc = job.agent_procs["n2"]
    limit = COORDINATOR_S + 3 + 5
    wait_for(f"{name}: n2's agent to give up", lambda: proc.poll() is not None, limit, job)
    gone = time.monotonic() - cut_at
    n2_log = job.log("agent-n2")
    if proc.returncode != 1 or "--rejoin-timeout-ms" not in n2_log or \
            "this agent exits" not in n2_log:
        fail(f"{name}: n2's agent should exit 1 naming --rejoin-timeout-ms, it exited "
             f"{proc.returncode}:\n{n2_log}")
    cut.revert()
    pace.revert()
    code = wait_job(job, 300, f"{name}: after the agent gave up")
    if code != 0:
        fail(f"{name}: the job exited {code}:\n{logs_of(job)}")
    final = of(job.events(), "generation")[-1]
    if final["world"] != 2:
        fail(f"{name}: the job should end on n1's 2 ranks, its last generation has world "
             f"{final['world']}")
    said = [line for line in n2_log.splitlines() if "--rejoin-timeout-ms" in line][-1]
    print(f"{name}: n2's agent exited 1 {gone:.1f}s after the cut: {said}", flush=True)


def heal_with_standby(tmp):
    name = "heal-standby"
    if not os.access(ETCD, os.X_OK):
        print(f"{name}: skipped: etcd is not installed ({ETCD}: apt-get install etcd-server)",
              flush=True)
        return
    run_dir, log_dir = os.path.join(tmp, name), os.path.join(tmp, f"{name}-logs")
    with netns.Cluster(nodes=4, forwarder=["n1"]) as c:
        url = start_etcd(c, tmp)
        job = TroupeJob(c, TROUPE, run_dir,
                        ARGS + ["--steps", "600", "--world", "4", "--nodes", "2", "--etcd", url,
                                "--etcd-timeout-ms", "10000"],
                        agents={"n1": None, "n2": None}, log_dir=log_dir)
        job.start_coordinator()
        standby, address, _ = start_standby(c, job, url, log_dir)
        job.endpoint = f"{job.endpoint},{address}"
        for node in ("n1", "n2"):
            job.start_agent(node)
        wait_for_step(job, CUT_AFTER, 120, f"{name}: before the cut")
        cut_side = pids_in(c, "n2")
        members = sorted(e["member"] for e in of(job.events(), "rank_joined")
                         if e["pid"] in cut_side)
        cut = c.cut("n2")
        cut_at = time.monotonic()
        pace = c.delay("n1", PACE_MS)
        heal_ms, regrow_s = heal_and_finish(name, job, cut, pace, cut_at + 20)
        events = job.events()
        n2_log = job.log("agent-n2")
        if "rejoined the leader" not in n2_log or "cut off from the coordinator" not in n2_log:
            fail(f"{name}: n2's agent should say it was cut off and rejoined:\n{n2_log}")
        if len(of(events, "leader")) != 1:
            fail(f"{name}: the leader changed: {of(events, 'leader')}")
        shrunk, regrown = check_regrown(name, events, members, heal_ms)
        standby.terminate()
        standby.wait(timeout=30)
    print(f"{name}: lost at {shrunk['start_step']}, back to 4 ranks from step "
          f"{regrown['start_step']}, {regrow_s:.1f}s after a 20 s cut healed", flush=True)


def test():
    with tempfile.TemporaryDirectory(prefix="troupe-netns-heal-") as tmp:
        with netns.Cluster(nodes=2, forwarder=["n1"]) as c:
            short = heal_after(c, tmp, "heal-5s", 5.0, 300)
            if "started it again to rejoin" not in short[2] or "removed: " not in short[2]:
                fail(f"heal-5s: n2's workers should have been told they were removed and "
                     f"started again by their agent:\n{short[2]}")
            long = heal_after(c, tmp, "heal-60s", 60.0, 1000)
            if "rejoined the leader" not in long[2] or "cut off from the coordinator" not in long[2]:
                fail(f"heal-60s: n2's agent should say it was cut off and rejoined:\n{long[2]}")
            rejoin_timeout(c, tmp)
        heal_with_standby(tmp)
        for (run_dir, events, _, _, _), steps in ((short, 300), (long, 1000)):
            name = os.path.basename(run_dir)
            check_exact(name, tmp, steps, events, run_dir,
                        os.path.join(tmp, f"{name}-plain"))


if __name__ == "__main__":
    netns.require_netns(forwarder=True)  # exit 77 (Skipped) where namespaces cannot be made
    main(test)
