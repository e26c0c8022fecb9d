"""No single point of failure: `troupe run --coordinators 2 --etcd local` runs two coordinator
processes, one leading through etcd and one standing by. The leader is lost and the standby
takes the running job over without restarting a worker; the job trains exactly what an
undisturbed run trains.

(1) kill -9 of the leader as step 10 begins (--fault kill:coordinator:step=10): exit 0, every
    step committed with the undisturbed run's loss, the same final parameters, the workers keep
    their processes, the first commit after the kill within 3 s.
(2) the leader SIGSTOPped for three times its lease (15 s): the standby takes over; the old one,
    woken, steps down and commits nothing; exact. The agent, whose connection to the stopped
    leader stays open, rejoins the standby within 3 s of its election (it looks for the leader
    after a heartbeat timeout of silence, not the coordinator timeout).
(3) the leader killed in the middle of committing step 10, after its commit reached one rank
    and not the other (--fault kill:coordinator:step=10:commits=1): the new leader completes
    step 10 on both; exact.
(5) a history check over the events of (1)-(3): one leader per epoch, epochs increase, every
    step committed with one loss, committed steps never go back except a step no rank applied
    being redone (with the same loss) right after a takeover, and no member acted on an older
    epoch (no stale message from an older leader counted).
Skipped when etcd is not installed."""

import os
import signal
import tempfile
import time
import urllib.request

from harness import (SMALL_MODEL, Job, checkpoint_param_diff, fail, main, pid_alive,
                     relative_difference, run_ok, skip, step_losses, two_free_ports, wait_until)

ETCD = "/usr/bin/etcd"
STEPS = 24
BASE = SMALL_MODEL + ["--steps", str(STEPS), "--checkpoint-every", "5", "--metrics-port", "0",
                      "--step-timeout-ms", "20000"]
HA = ["--coordinators", "2", "--etcd", "local"]
LEASE_S = 5  # the leader's lease (coordinator/job_etcd.cpp leader_ttl)


def of(events, name):
    return [e for e in events if e.get("event") == name]


def leader_pid(event):
    return int(event["id"].rsplit(":", 1)[1])


def worker_pids(events):
    return {e["member"]: e["pid"] for e in of(events, "rank_joined")}


def history(name, events, reference, steps=STEPS):
    """(5): what the events of one job say about its leaders and commits: one leader per
    epoch, epochs that only increase, every step committed with one loss (the undisturbed
    run's), committed steps that never go back except one redone right after a takeover."""
    leaders = of(events, "leader")
    epochs = [e["epoch"] for e in leaders]
    if len(leaders) < 2 or epochs != sorted(set(epochs)):
        fail(f"{name}: expected two leaderships or more with increasing epochs, got {leaders}")
    ref = step_losses(reference)
    seen = {}
    last = 0
    takeover_since_last_step = False
    for e in events:
        kind = e.get("event")
        if kind == "leader":
            takeover_since_last_step = True
        if kind != "step":
            continue
        step, loss = e["step"], e["loss"]
        if step in seen:
            # Only a step that no rank applied may come again, right after a takeover, once.
            if not (takeover_since_last_step and step == last):
                fail(f"{name}: step {step} committed again without a takeover between")
            if seen[step] != loss:
                fail(f"{name}: step {step} committed with two losses {seen[step]} and {loss}")
        elif step != last + 1:
            fail(f"{name}: step {step} committed after step {last}")
        if relative_difference(loss, ref[step]) > 1e-4:
            fail(f"{name}: step {step} loss {loss} differs from the undisturbed {ref[step]}")
        seen[step] = loss
        last = step
        takeover_since_last_step = False
    if sorted(seen) != list(range(1, steps + 1)):
        fail(f"{name}: committed steps {sorted(seen)}")


def exact(name, tmp, ref_dir, rec_dir, reference, events):
    history(name, events, reference)
    diff = checkpoint_param_diff(ref_dir, rec_dir)
    if diff > 1e-4:
        fail(f"{name}: final parameters differ by {diff:.2e} relative")


def same_workers(name, events):
    """The workers that joined the first leader are the ones that finished under the last."""
    first = {}
    for e in of(events, "rank_joined"):
        first.setdefault(e["member"], e["pid"])
    for e in of(events, "rank_joined"):
        if e["pid"] != first[e["member"]]:
            fail(f"{name}: member {e['member']} came back as a new process {e['pid']} "
                 f"(was {first[e['member']]})")
    if of(events, "rank_lost"):
        fail(f"{name}: a member was lost: {of(events, 'rank_lost')}")


def first_commit_after(events, marker_index):
    for e in events[marker_index:]:
        if e.get("event") == "step":
            return e
    return None


def agents_rejoined(name, events, leader, limit_ms=3000, required=True):
    """Every node whose agent joined before `leader` (a `leader` event of a takeover) rejoins
    that leader (its `agent_joined`) within `limit_ms` of it. With several coordinators an
    agent looks for the leader after a heartbeat timeout of silence, not the coordinator
    timeout, so even a leader stopped with its connections open is left in time. Not
    `required`: only said (a short job may end before its agents are back)."""
    at = events.index(leader)
    nodes = {e["node"] for e in of(events[:at], "agent_joined")}
    if not nodes:
        fail(f"{name}: no agent joined before the takeover")
    rejoined = {}
    for e in of(events[at:], "agent_joined"):
        rejoined.setdefault(e["node"], e["unix_ms"] - leader["unix_ms"])
    late = {n: rejoined.get(n) for n in nodes if rejoined.get(n) is None or rejoined[n] > limit_ms}
    if late and not required:
        print(f"{name}: agents not back within {limit_ms} ms of the new leader's election "
              f"(the job may have ended first): {late}", flush=True)
        return
    if late:
        fail(f"{name}: agents that did not rejoin the new leader within {limit_ms} ms of its "
             f"election (node: ms, None = never): {late}")
    print(f"{name}: agents rejoined {max(rejoined[n] for n in nodes)} ms after the new leader's "
          "election", flush=True)


def killed(tmp, ref_dir, reference, name, fault):
    rec_dir = os.path.join(tmp, name)
    events = run_ok(name, BASE + HA + ["--fault", fault], rec_dir, timeout=300)
    faults = of(events, "fault")
    if len(faults) != 1 or faults[0].get("target") != "coordinator":
        fail(f"{name}: expected one fault on the coordinator, got {faults}")
    leaders = of(events, "leader")
    if faults[0]["pids"] != [leader_pid(leaders[0])]:
        fail(f"{name}: the fault hit {faults[0]['pids']}, not the leader {leaders[0]}")
    same_workers(name, events)
    if len(leaders) < 2:
        fail(f"{name}: no second leader: {leaders}")
    # The job ends well under a second after the takeover, which may be before the agent is
    # back: said, not required.
    agents_rejoined(name, events, leaders[1], required=False)
    at = events.index(faults[0])
    after = first_commit_after(events, at)
    if after is None:
        fail(f"{name}: nothing committed after the kill")
    gap_ms = after["unix_ms"] - faults[0]["unix_ms"]
    print(f"{name}: first commit {gap_ms} ms after the kill (step {after['step']})", flush=True)
    if gap_ms > 3000:
        fail(f"{name}: the first commit after the kill came {gap_ms} ms later (limit 3000)")
    exact(name, tmp, ref_dir, rec_dir, reference, events)
    print(f"ok: {name}: exact, workers kept, takeover in {gap_ms} ms", flush=True)


def leadership_gauges(port):
    """(troupe_coordinator_leader, troupe_coordinator_epoch) as the coordinator with metrics on
    `port` exports them; None when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return None
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("troupe_coordinator_leader", "troupe_coordinator_epoch"):
            values[name] = float(value)
    return values.get("troupe_coordinator_leader"), values.get("troupe_coordinator_epoch")


def stopped(tmp, ref_dir, reference):
    name = "leader stopped for 3 leases"
    rec_dir = os.path.join(tmp, "stopped")
    # Both ranks computing 100 times slower (the same arithmetic) keeps the job running while
    # the leader is stopped, and for seconds after the takeover (for the agent's rejoin to be
    # seen); no rank is slower than the other, so no straggler either.
    slow = ["--fault", "slow:rank=0:factor=100:from=1", "--fault", "slow:rank=1:factor=100:from=1"]
    metrics = two_free_ports()
    with Job(BASE + HA + slow + ["--metrics-port", str(metrics)], run_dir=rec_dir) as job:
        def leaders():
            if job.proc.poll() is not None:
                fail(f"{name}: the job ended early:\n{job.output()}")
            return of(job.events(), "leader")
        wait_until(lambda: leaders() and of(job.events(), "step"), 120, "the first commit")
        first = leaders()[0]
        pid = leader_pid(first)
        # Every coordinator exports its part: the leader 1 and its epoch, the standby 0.
        gauges = {p: leadership_gauges(p) for p in (metrics, metrics + 1)}
        by_role = {g[0]: (p, g) for p, g in gauges.items() if g and g[0] is not None}
        if set(by_role) != {0.0, 1.0} or by_role[1.0][1][1] != first["epoch"]:
            fail(f"{name}: troupe_coordinator_leader/epoch of the two coordinators: {gauges}")
        standby_port = by_role[0.0][0]
        os.kill(pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            wait_until(lambda: len(leaders()) >= 2, 3 * LEASE_S + 10, "a second leader")
            now_leads = leadership_gauges(standby_port)
            if now_leads != (1.0, float(leaders()[1]["epoch"])):
                fail(f"{name}: the standby that took over exports {now_leads}, not leader 1 "
                     f"with epoch {leaders()[1]['epoch']}")
            left = 3 * LEASE_S - (time.monotonic() - stopped_at)
            if left > 0:
                time.sleep(left)  # the pause itself is the fault: three leases long
        finally:
            os.kill(pid, signal.SIGCONT)
        woke = len(job.events())
        wait_until(lambda: not pid_alive(pid), 30, "the deposed leader to exit")
        code = job.wait(300)
        events, output = job.events(), job.output()
    if code != 0:
        fail(f"{name}: exit {code}:\n{output}")
    second = of(events, "leader")[1]
    if second["id"] == first["id"] or second["epoch"] <= first["epoch"]:
        fail(f"{name}: the second leader {second} does not follow {first}")
    # The members look for a new leader once the old one is silent for a heartbeat timeout, so
    # they rejoin the standby soon after it is elected, not after the coordinator timeout.
    after = first_commit_after(events, events.index(second))
    if after is None or after["unix_ms"] - second["unix_ms"] > 3000:
        fail(f"{name}: the first commit under the new leader came "
             f"{after and after['unix_ms'] - second['unix_ms']} ms after it was elected "
             "(limit 3000)")
    # The agent's connection to the stopped leader stays open: it finds the new leader by the
    # leader's silence alone.
    agents_rejoined(name, events, second)
    same_workers(name, events)
    exact(name, tmp, ref_dir, rec_dir, reference, events)
    print(f"ok: {name}: the standby led, the woken leader stepped down, exact "
          f"({len(events) - woke} events after it woke)", flush=True)


def stalled_briefly(tmp, ref_dir, reference):
    """(2b) The leader stopped for 3 s: longer than the members' heartbeat timeout (they look
    for a leader), about as long as the leader can go without renewing its lease (it steps
    down 3.75 s after its last renewal, which may have come up to 1.25 s before the stop). Either
    the woken leader takes its members back and forms their generation again, or it has stepped
    down and the standby takes the job over; both must be exact with the same workers."""
    name = "leader stopped for 3 s"
    rec_dir = os.path.join(tmp, "stalled")
    slow = ["--fault", "slow:rank=0:factor=30:from=1", "--fault", "slow:rank=1:factor=30:from=1"]
    with Job(BASE + HA + slow, run_dir=rec_dir) as job:
        wait_until(lambda: of(job.events(), "step"), 120, "the first commit")
        pid = leader_pid(of(job.events(), "leader")[0])
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(3)  # the fault itself: a stall of 3 s
        finally:
            os.kill(pid, signal.SIGCONT)
        code = job.wait(300)
        events, output = job.events(), job.output()
    if code != 0:
        fail(f"{name}: exit {code}:\n{output}")
    leaders = of(events, "leader")
    epochs = [e["epoch"] for e in leaders]
    if epochs != sorted(set(epochs)):
        fail(f"{name}: epochs that do not increase: {leaders}")
    same_workers(name, events)
    ref = step_losses(reference)
    got = step_losses(events)
    if sorted(got) != list(range(1, STEPS + 1)) or any(
            relative_difference(got[k], ref[k]) > 1e-4 for k in got):
        fail(f"{name}: the committed steps or losses differ from the undisturbed run")
    diff = checkpoint_param_diff(ref_dir, rec_dir)
    if diff > 1e-4:
        fail(f"{name}: final parameters differ by {diff:.2e} relative")
    how = "the same leader took its members back" if len(leaders) == 1 else "a standby took over"
    print(f"ok: {name}: {how}, exact", flush=True)


def test():
    if not os.access(ETCD, os.X_OK):
        skip("etcd is not installed (/usr/bin/etcd: apt-get install etcd-server)")
        return
    with tempfile.TemporaryDirectory(prefix="troupe-takeover-") as tmp:
        ref_dir = os.path.join(tmp, "reference")
        reference = run_ok("undisturbed", BASE, ref_dir)
        killed(tmp, ref_dir, reference, "leader killed at step 10", "kill:coordinator:step=10")
        killed(tmp, ref_dir, reference, "leader killed mid-commit",
               "kill:coordinator:step=10:commits=1")
        stopped(tmp, ref_dir, reference)
        stalled_briefly(tmp, ref_dir, reference)


if __name__ == "__main__":
    main(test)
