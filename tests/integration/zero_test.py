"""ZeRO-1 in a real job: with the optimizer state sharded over the data-parallel ranks,
2- and 4-rank jobs give the same loss at every one of 20 steps as a 1-rank job (within
1e-4 relative, issue 3's bound for every layout); each rank's optimizer state, as
allocated, falls as 1/dp; and a ZeRO checkpoint resumes on another world size."""

import os
import shutil
import tempfile

from harness import SMALL_MODEL, fail, last_job, main, relative_difference, run_to_end, step_losses

STEPS = 20
COMMON = SMALL_MODEL + ["--steps", str(STEPS), "--metrics-port", "0", "--checkpoint-every", "10"]


def run(world, zero, run_dir=None, extra=()):
    code, events, output = run_to_end(COMMON + ["--world", str(world), "--zero", str(zero)] + list(extra),
                                      timeout=300, run_dir=run_dir)
    if code != 0:
        fail(f"world {world} zero {zero} exited {code}:\n{output}")
    return events


def state_bytes(events):
    return {e["rank"]: e["optimizer_state_bytes"] for e in last_job(events) if e.get("event") == "memory"}


def test():
    reference_events = run(1, 0)
    reference = step_losses(reference_events)
    full_state = state_bytes(reference_events)[0]
    for world in (2, 4):
        events = run(world, 1)
        losses = step_losses(events)
        worst = max(relative_difference(reference[s], losses[s]) for s in reference)
        print(f"zero-1 on {world} ranks: worst relative loss difference vs 1 rank: {worst:.2e}")
        if worst > 1e-4:
            fail(f"zero-1 on {world} ranks diverges by {worst:.2e}")
        per_rank = state_bytes(events)
        if sorted(per_rank) != list(range(world)):
            fail(f"expected a memory report from every rank, got {per_rank}")
        biggest = max(per_rank.values())
        print(f"  optimizer state per rank: {biggest} bytes vs {full_state} replicated "
              f"(ratio {biggest / full_state:.3f}, ideal {1 / world:.3f})")
        # The exact reduction (the default) starts each shard at a multiple of its 1,024-float
        # norm blocks: up to one block more per moment.
        if biggest > full_state / world * 1.02 + 64 + 2 * 1024 * 4:
            fail(f"zero-1 on {world} ranks holds {biggest} bytes of optimizer state per rank, "
                 f"not ~1/{world} of {full_state}")

    with tempfile.TemporaryDirectory(prefix="troupe-zero-") as tmp:
        run_dir = os.path.join(tmp, "run")
        run(2, 1, run_dir, ["--exit-after-step", "10"])
        events = run(4, 1, run_dir, ["--resume"])
        resumed = step_losses(last_job(events))
        if sorted(resumed) != list(range(11, STEPS + 1)):
            fail(f"resume should train steps 11..{STEPS}, trained {sorted(resumed)}")
        worst = max(relative_difference(reference[s], resumed[s]) for s in resumed)
        print(f"zero-1 checkpoint from 2 ranks resumed on 4: worst relative difference {worst:.2e}")
        if worst > 1e-4:
            fail(f"resumed zero-1 run diverges by {worst:.2e}")


if __name__ == "__main__":
    main(test)
