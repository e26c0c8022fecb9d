"""Scenarios played on a netns cluster: a timed cut takes effect at its time and heals at its
end; a seeded random schedule, saved and loaded, replays exactly (the same faults, targets,
parameters and mechanisms, in the same order, on time) on two fresh clusters; and every
example file in chaos/scenarios/ can be applied to a cluster of the size it asks for. Needs
root and the built tap_forwarder; exits 77 (Skipped) otherwise."""

import glob
import os
import tempfile
import time

from netns_common import SCENARIOS, check, netns, scenario, step, wait_until

KINDS = ("cut", "split", "drop", "loss", "rate", "flap", "isolate_coordinator", "delay")


def timed_cut():
    step("a scenario's cut takes effect at its time and heals at its end")
    s = scenario.Scenario([scenario.TimedFault(0.5, "cut", "n2", 1.0)], "timed-cut", nodes=2)
    with netns.Cluster(nodes=2) as c:
        check(c.tcp_reachable("n1", "n2", 1.0), "n2 unreachable before the scenario")
        run = c.play(s)
        def since_start():
            return time.monotonic() - run.t0
        t_down = wait_until(lambda: not c.tcp_reachable("n1", "n2", 0.1) and since_start(), 3,
                            "the cut")
        t_up = wait_until(lambda: c.tcp_reachable("n1", "n2", 0.1) and since_start(), 5,
                          "the heal")
        check(run.wait(5), "the scenario did not finish")
        print(f"cut seen at {t_down:.2f}s (planned 0.5), healed at {t_up:.2f}s (planned 1.5)",
              flush=True)
        # Never early; late by the probe's 0.1 s, a carrier's return (up to ~1 s) and the load.
        check(0.45 <= t_down <= 1.5, f"the cut showed at {t_down:.2f}s, planned 0.5s")
        check(1.45 <= t_up <= 3.0, f"the heal showed at {t_up:.2f}s, planned 1.5s")
        check(not run.errors, f"errors: {run.errors}")


def replay():
    step("a seeded random schedule replays exactly from its file")
    gen = dict(nodes=3, duration=3.0, kinds=KINDS, mean_gap=0.3, min_fault=0.2, max_fault=0.8,
               forwarder=["n1"])
    # The first seed whose schedule has every kind of partition and shaping in it (a
    # deterministic search: the generator is a pure function of its arguments).
    wanted = {"cut", "split", "delay", "flap", "loss", "drop"}
    seed = next(k for k in range(1, 10000)
                if wanted <= {f.fault for f in scenario.random_schedule(seed=k, **gen).faults})
    gen["seed"] = seed
    s = scenario.random_schedule(**gen)
    check(s == scenario.random_schedule(**gen), "the generator is not deterministic")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "schedule.json")
        s.save(path)
        loaded = scenario.Scenario.load(path)
    print(f"seed {seed}: {len(loaded.faults)} faults: {[f.fault for f in loaded.faults]}",
          flush=True)
    keys = []
    for attempt in range(2):
        with netns.Cluster(**loaded.cluster_options(), verbose=attempt == 0) as c:
            run = c.play(loaded)
            check(run.wait(loaded.end() + 10), "the schedule did not finish")
            check(not run.errors, f"run {attempt}: {run.errors}")
            # Each event waits for the tc/ip commands of the one before: dense schedules on a
            # loaded machine run a little late. Exact replay is about order and content.
            late = [(e["planned"], e["t"]) for e in run.log if e["t"] - e["planned"] > 2.0]
            check(not late, f"run {attempt}: events more than 2 s late: {late}")
            early = [(e["planned"], e["t"]) for e in run.log if e["t"] < e["planned"]]
            check(not early, f"run {attempt}: events before their time: {early}")
            check(len(run.log) == len(loaded.plan()), f"run {attempt}: {len(run.log)} of "
                                                       f"{len(loaded.plan())} events ran")
            check(all(e.get("method") and e.get("mechanism") for e in run.log),
                  "an event without its mechanism")
            keys.append(run.replay_key())
            c.clear()
            wait_until(lambda: all(c.tcp_reachable(a, b, 0.5)
                                   for a in c.names for b in c.names if a != b),
                       3, "every pair reachable after the schedule")
        check(not c.leftovers(), f"leftovers: {c.leftovers()}")
    check(keys[0] == keys[1], "two runs of one schedule differ:\n" +
          "\n".join(f"{a}\n{b}" for a, b in zip(*keys) if a != b))


def examples():
    step("every example scenario applies on a cluster of its size (time compressed)")
    for path in sorted(glob.glob(os.path.join(SCENARIOS, "*.json"))):
        s = scenario.Scenario.load(path)
        with netns.Cluster(**s.cluster_options(), verbose=False) as c:
            for f in s.faults:
                h = c.fault(f.fault, f.target, **f.params)
                check(h.active and h.mechanism, f"{path}: {f.fault} not applied")
            c.clear()
            check(not c.faults, f"{path}: faults left after clear(): {c.faults}")
            # A link that comes back up regains its carrier within about a second (linkwatch).
            wait_until(lambda: c.tcp_reachable("n1", "coord", 0.5), 3,
                       f"{path}: n1 reaching coord after clear()")
        print(f"{os.path.basename(path)}: {len(s.faults)} faults applied and reverted", flush=True)


def main():
    netns.require_netns(forwarder=True)
    timed_cut()
    replay()
    examples()
    print("PASS", flush=True)


if __name__ == "__main__":
    main()
