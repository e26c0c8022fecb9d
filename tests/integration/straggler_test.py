"""Stragglers: a rank whose compute is slowed 3x (an injected `slow` fault) is flagged within
10 steps (at --straggler-factor 1.8); with --straggler-policy rebalance its replica gets fewer micro-batches (the global
batch and the model stay the same: the losses match a run without the fault); and 4 healthy ranks oversubscribed on this machine's cores run 300 steps with
the strictest policy (evict) without a single flag or eviction."""

import os
import statistics
import tempfile

from harness import SMALL_MODEL, fail, main, relative_difference, run_ok, step_losses

SLOW_FROM = 30


def of(events, name):
    return [e for e in events if e.get("event") == name]


def slowed(tmp, policy):
    args = SMALL_MODEL[:] + ["--d-model", "128", "--heads", "4", "--context", "64", "--batch", "32",
                             "--lr", "1e-3", "--world", "2", "--steps", "100", "--metrics-port", "0",
                             "--checkpoint-every", "0",
                             # The fault triples the rank's compute (a 2x one scored only 1.7
                             # here at times); the other tests on these cores slowed a healthy
                             # rank's by up to 1.5x (CI, 2026-12-07): 1.8 lies between.
                             "--straggler-factor", "1.8", "--straggler-policy", policy]
    events = run_ok(policy, args + ["--fault", f"slow:rank=1:factor=3:from={SLOW_FROM}"], os.path.join(tmp, policy))
    flags = of(events, "straggler")
    if not flags or flags[0]["rank"] != 1:
        fail(f"{policy}: the slowed rank 1 was not flagged: {flags}")
    if not SLOW_FROM <= flags[0]["step"] <= SLOW_FROM + 10:
        fail(f"{policy}: flagged at step {flags[0]['step']}, expected within 10 steps of {SLOW_FROM}")
    step_s = {e["step"]: e["step_s"] for e in of(events, "step")}
    healthy = statistics.median(step_s[s] for s in range(10, SLOW_FROM))
    late = statistics.median(step_s[s] for s in range(70, 101))
    print(f"{policy}: flagged rank 1 at step {flags[0]['step']} (x{flags[0]['factor']:.2f}); "
          f"step time {healthy * 1e3:.1f} ms healthy, {late * 1e3:.1f} ms at the end ({late / healthy:.2f}x)")
    return events, healthy, late, args


def test():
    with tempfile.TemporaryDirectory(prefix="troupe-straggler-") as tmp:
        _, _, warn_late, args = slowed(tmp, "warn")
        events, healthy, late, _ = slowed(tmp, "rebalance")
        plans = [g["plan"]["replica_micro_batches"] for g in of(events, "generation")]
        final = plans[-1]
        if len(plans) < 2 or not final[1] < final[0]:
            fail(f"rebalance: the slowed replica should end with fewer micro-batches: {plans}")
        # Step times are printed, not asserted: other tests share the cores
        # (docs/benchmarks/recovery.md records the figure from a quiet run).
        print(f"rebalance: end step time {late * 1e3:.1f} ms against {warn_late * 1e3:.1f} ms unbalanced")
        reference = run_ok("no fault", args[:-1] + ["warn"], os.path.join(tmp, "reference"))
        ref, got = step_losses(reference), step_losses(events)
        worst = max(relative_difference(ref[s], got[s]) for s in ref)
        if worst > 1e-4:
            fail(f"rebalance changed the math: losses differ by {worst:.2e}")
        print(f"rebalance: micro-batches {plans}; losses match the unfaulted run ({worst:.1e})")

        healthy_args = SMALL_MODEL + ["--world", "4", "--steps", "300", "--metrics-port", "0",
                                      "--checkpoint-every", "0", "--straggler-policy", "evict"]
        events = run_ok("healthy", healthy_args, os.path.join(tmp, "healthy"))
        if of(events, "straggler") or of(events, "rank_lost"):
            fail(f"healthy ranks were flagged: {of(events, 'straggler')} {of(events, 'rank_lost')}")
        if len(of(events, "generation")) != 1:
            fail("a healthy job changed generation")
        print("healthy: 4 ranks, 300 steps, no flag and no eviction")


if __name__ == "__main__":
    main(test)
