"""Which transport a real job's data plane uses (README "Libraries", "Elastic training"), seen
from /proc (procfs.py), not from what the job says about itself:

- ranks on one host train over shared memory: each holds its group's segment (the memfd
  "troupe-g1-..."), and no TCP connection joins two ranks;
- a rank lost in the middle of training: the survivors shrink the group of before, the
  `generation` event says `shrunk`, and they go on in generation 1's segment (no new segment
  is made for generation 2);
- TROUPE_TRANSPORT=tcp: the ranks hold no segment, are connected to each other over TCP, and a
  loss makes a new group (`shrunk` false).

The job's own word is checked as well: each generation's `transport` event names the backend
the coordinator expects the ranks to pick, and it must agree with what /proc shows."""

import os
import signal

from harness import SMALL_MODEL, Job, fail, main, pid_alive, wait_until
from procfs import segments, tcp_pairs

WORLD = 3
ARGS = SMALL_MODEL + ["--batch", "12", "--world", str(WORLD), "--min-ranks", "2",
                      "--steps", "100000", "--checkpoint-every", "0", "--metrics-port", "0"]


def of(events, name):
    return [e for e in events if e.get("event") == name]


def rank_pids(job):
    return [e["pid"] for e in of(job.events(), "rank_joined")]


def generation_segments(pids, generation):
    return {pid: sorted(n for n in segments(pid) if n.startswith(f"troupe-g{generation}-"))
            for pid in pids}


def trained_in(job, generation, steps):
    """Waits until `steps` steps of `generation` are committed; returns its event."""
    def ready():
        if job.proc.poll() is not None:
            fail(f"the job ended early ({job.proc.returncode}):\n{job.output()}")
        events = job.events()
        done = [e for e in of(events, "step") if e.get("generation") == generation]
        gens = [g for g in of(events, "generation") if g["number"] == generation]
        return gens[0] if len(done) >= steps and gens else None
    return wait_until(ready, 60, f"{steps} steps of generation {generation}")


def said_transport(job, name, generation, backend, world, shrunk):
    """The generation's `transport` event, checked against what /proc showed."""
    said = [t for t in of(job.events(), "transport") if t["generation"] == generation]
    if len(said) != 1:
        fail(f"{name}: expected one transport event for generation {generation}, saw {said}")
    t = said[0]
    expected = {"backend": backend, "world": world, "nodes": 1, "ranks_per_node": world,
                "shrunk": shrunk}
    if {k: t.get(k) for k in expected} != expected:
        fail(f"{name}: generation {generation}'s transport event {t}, expected {expected}")
    print(f"{name}: generation {generation} says transport {t['backend']} "
          f"(shrunk={t['shrunk']})")


def scenario(name, env, expect_shm):
    with Job(ARGS, env=env) as job:
        trained_in(job, 1, 3)
        pids = rank_pids(job)
        if len(pids) != WORLD:
            fail(f"{name}: expected {WORLD} ranks, saw pids {pids}")
        held = generation_segments(pids, 1)
        connected = tcp_pairs(pids)
        if expect_shm and (not all(held.values()) or connected):
            fail(f"{name}: ranks on one host should share a segment and have no TCP link: "
                 f"segments {held}, TCP pairs {connected}")
        if not expect_shm and (any(held.values()) or len(connected) < WORLD - 1):
            fail(f"{name}: ranks should be connected over TCP and hold no segment: "
                 f"segments {held}, TCP pairs {connected}")
        print(f"{name}: generation 1 segments {held}, TCP pairs between ranks {sorted(connected)}")
        backend = "shm" if expect_shm else "tcp"
        said_transport(job, name, 1, backend, WORLD, False)

        # A rank lost in the middle of training (the chaos of rank_kill_test.py, by hand so
        # that generation 1 is seen first).
        os.kill(pids[-1], signal.SIGKILL)
        second = trained_in(job, 2, 3)
        survivors = [p for p in pids[:-1] if pid_alive(p)]
        if second["world"] != WORLD - 1 or len(survivors) != WORLD - 1:
            fail(f"{name}: expected {WORLD - 1} survivors in generation 2: {second}, {survivors}")
        if second["shrunk"] != expect_shm:
            fail(f"{name}: generation 2 says shrunk={second['shrunk']}, expected {expect_shm}")
        old, new = generation_segments(survivors, 1), generation_segments(survivors, 2)
        if expect_shm and (not all(old.values()) or any(new.values())):
            fail(f"{name}: the shrunk group should stay in generation 1's segment: "
                 f"generation 1 {old}, generation 2 {new}")
        if not expect_shm and (any(old.values()) or any(new.values())
                               or not tcp_pairs(survivors)):
            fail(f"{name}: the survivors should be connected over TCP only: generation 1 {old}, "
                 f"generation 2 {new}, TCP pairs {tcp_pairs(survivors)}")
        print(f"{name}: generation 2 shrunk={second['shrunk']}, survivors' segments "
              f"{old} (generation 1), {new} (generation 2)")
        said_transport(job, name, 2, backend, WORLD - 1, expect_shm)
        job.proc.send_signal(signal.SIGINT)
        if job.wait(60) != 130:
            fail(f"{name}: Ctrl-C should end the job with 130:\n{job.output()}")


def test():
    env = {k: v for k, v in os.environ.items() if k != "TROUPE_TRANSPORT"}
    scenario("one host", env, expect_shm=True)
    scenario("TROUPE_TRANSPORT=tcp", dict(env, TROUPE_TRANSPORT="tcp"), expect_shm=False)


if __name__ == "__main__":
    main(test)
