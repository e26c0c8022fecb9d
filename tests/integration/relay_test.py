"""Aggregation through the agents (--relay, issue 41): the workers of each node vote and beat
through their agent's relay, which carries a node's votes to the coordinator as one message
and hands out one commit per node.

- A 4-rank job on 2 nodes trains the same losses with the relay as without it (the relay
  changes only how the control plane's messages travel; the job's loss sums the ranks' float64
  shares in the order the votes arrive, so within 1e-12), and the coordinator counts the votes
  that came bundled (troupe_relayed_votes_total; none without --relay).
- A rank killed with kill -9 mid-run: the job regroups without it and keeps committing
  through the relays (the dead rank's votes are no longer waited for).
- The agents' listeners (the relay's among them) are not inherited by their workers.
- With standby coordinators on etcd (--coordinators 2 --etcd local) the leader is killed with
  kill -9: the relays follow the new leader, which goes on committing the workers' votes as
  they come bundled (its own troupe_relayed_votes_total), keeps every worker (their beats
  reach it through the relays: none is taken for hung) and commits every step once, in order.
  Skipped when etcd is not installed."""

import os
import re
import signal
import urllib.request

from harness import (SMALL_MODEL, Job, fail, free_port, listening_ports, main,
                     relative_difference, run_to_end, skip, step_losses, two_free_ports,
                     wait_until)

ETCD = "/usr/bin/etcd"

STEPS = 20
BASE = SMALL_MODEL + ["--world", "4", "--nodes", "2", "--checkpoint-every", "0"]


def metrics(port):
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()


def relayed_votes(port, body=None):
    body = body if body is not None else metrics(port)
    m = re.search(r"^troupe_relayed_votes_total (\S+)$", body, re.M)
    if not m:
        fail(f"troupe_relayed_votes_total missing from /metrics:\n{body[:2000]}")
    return float(m.group(1))


def leading(port):
    """The /metrics of the coordinator on `port` while it leads the job, else None."""
    try:
        body = metrics(port)
    except OSError:
        return None
    return body if re.search(r"^troupe_coordinator_leader 1$", body, re.M) else None


def same_losses_with_and_without():
    runs = {}
    for name, extra in (("direct", []), ("relay", ["--relay"])):
        code, events, output = run_to_end(BASE + ["--steps", str(STEPS), "--metrics-port", "0"]
                                          + extra, timeout=300)
        if code != 0:
            fail(f"{name}: exit {code}:\n{output}")
        runs[name] = step_losses(events)
        if sorted(runs[name]) != list(range(1, STEPS + 1)):
            fail(f"{name}: expected steps 1..{STEPS}, got {sorted(runs[name])}")
    worst = max(relative_difference(runs["direct"][s], runs["relay"][s]) for s in runs["direct"])
    if worst > 1e-12:
        diff = [s for s in runs["direct"]
                if relative_difference(runs["direct"][s], runs["relay"][s]) > 1e-12]
        fail(f"the losses differ with --relay at steps {diff[:5]}: "
             f"{[(runs['direct'][s], runs['relay'].get(s)) for s in diff[:3]]}")
    print(f"{STEPS} steps, the same losses with and without --relay (worst {worst:.1e})")


def kill_a_rank_under_the_relay():
    port = free_port()
    args = BASE + ["--steps", "100000", "--metrics-port", str(port), "--relay",
                   "--fault", "kill:rank=3:step=8"]
    with Job(args) as job:
        def trained_after_the_loss():
            ev = job.events()
            gens = [e for e in ev if e.get("event") == "generation" and e.get("number", 0) >= 2]
            return gens and any(e.get("event") == "step" and e.get("generation", 0) >= 2
                                and e["step"] >= gens[-1]["start_step"] + 5 for e in ev)
        try:
            wait_until(trained_after_the_loss, 180,
                       "the job to lose rank 3 and train 5 steps without it")
        except SystemExit:
            print(job.output(), flush=True)
            raise
        ev = job.events()
        agents = [e["pid"] for e in ev if e.get("event") == "agent_joined"]
        workers = [e["pid"] for e in ev if e.get("event") == "rank_joined" and e.get("rank") != 3]
        held = set(listening_ports(agents)) & set(listening_ports(workers))
        if len(agents) != 2 or not listening_ports(agents) or held:
            fail(f"agents {agents} listen on {listening_ports(agents)}; their workers {workers} "
                 f"hold the agents' listeners {sorted(held)} too (inherited, not close-on-exec)")
        gens = [e for e in ev if e.get("event") == "generation"]
        if gens[-1].get("world") != 3:
            fail(f"expected the job to go on at world 3, generations: "
                 f"{[(g.get('number'), g.get('world')) for g in gens]}")
        steps = max(e["step"] for e in ev if e.get("event") == "step")
        votes = relayed_votes(port)
        # Every rank's vote of every committed step came through a relay (and more: a step in
        # flight, the votes of the step the loss aborted).
        if votes < 3 * steps:
            fail(f"only {votes:.0f} votes came through the relays after {steps} steps")
        print(f"lost rank 3, went on at world 3; {votes:.0f} votes relayed over {steps} steps")
        job.proc.send_signal(signal.SIGINT)
        job.wait(60)
        job.assert_no_process_left()


def direct_job_relays_nothing():
    port = free_port()
    with Job(BASE + ["--steps", "100000", "--metrics-port", str(port)]) as job:
        wait_until(lambda: any(e.get("event") == "step" and e["step"] >= 3 for e in job.events()),
                   120, "3 steps")
        if relayed_votes(port) != 0:
            fail("votes came through a relay without --relay")


def takeover_under_the_relay():
    if not os.access(ETCD, os.X_OK):
        skip("etcd is not installed (/usr/bin/etcd: apt-get install etcd-server)")
        return
    port = two_free_ports()
    args = BASE + ["--steps", "100000", "--metrics-port", str(port), "--relay", "--coordinators",
                   "2", "--etcd", "local", "--fault", "kill:coordinator:step=10"]
    with Job(args) as job:
        def after_takeover():
            ev = job.events()
            leaders = [i for i, e in enumerate(ev) if e.get("event") == "leader"]
            if len(leaders) < 2:
                return None
            steps = [e["step"] for e in ev[leaders[1]:] if e.get("event") == "step"]
            return (ev, leaders[1], steps) if len(steps) >= 8 else None
        try:
            ev, at, steps_after = wait_until(after_takeover, 240,
                                             "a takeover and 8 steps committed after it")
        except SystemExit:
            print(job.output(), flush=True)
            raise
        leader = ev[at]
        # Coordinator i serves metrics on port + i; either may have led first.
        body = next((b for b in (leading(port), leading(port + 1)) if b), None)
        if body is None:
            fail("neither coordinator says it leads after the takeover")
        votes = relayed_votes(None, body)
        if votes < 4 * len(steps_after):
            fail(f"the new leader counted {votes:.0f} relayed votes over {len(steps_after)} "
                 f"steps of 4 ranks: the votes did not come through the relays")
        lost = [e for e in ev if e.get("event") == "rank_lost"]
        if lost:
            fail(f"ranks were lost across the takeover (their beats through the relays did not "
                 f"reach the new leader): {lost}")
        committed = [e["step"] for e in ev if e.get("event") == "step"]
        redone = [s for i, s in enumerate(committed) if i and s <= committed[i - 1]]
        # A step no rank applied may be committed again right after the takeover, once.
        if committed[0] != 1 or len(redone) > 1 or \
                sorted(set(committed)) != list(range(1, max(committed) + 1)):
            fail(f"steps committed out of order across the takeover: {committed}")
        print(f"takeover (epoch {leader.get('epoch')}) under --relay: {len(steps_after)} steps "
              f"after it, {votes:.0f} votes relayed to the new leader, no rank lost", flush=True)
        job.proc.send_signal(signal.SIGINT)
        job.wait(60)
        job.assert_no_process_left()


def test():
    same_losses_with_and_without()
    direct_job_relays_nothing()
    kill_a_rank_under_the_relay()
    takeover_under_the_relay()


if __name__ == "__main__":
    main(test)
