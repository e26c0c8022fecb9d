"""DP exactness: 2-rank and 4-rank jobs (separate processes, Gloo over TCP) give the same
loss at each of 20 steps as a 1-rank job with the same global batch, within 1e-5 relative.
An explicit --micro-batches is honoured: the plan runs that many micro-batches (of batch / M
sequences), which changes how gradients are accumulated but not the model."""

from harness import SMALL_MODEL, fail, main, relative_difference, run_to_end, step_losses

STEPS = 20


def losses_for(world, extra=(), want_plan=None):
    args = SMALL_MODEL + ["--world", str(world), "--steps", str(STEPS), "--metrics-port", "0",
                          "--checkpoint-every", "0"] + list(extra)
    code, events, output = run_to_end(args, timeout=300)
    if code != 0:
        fail(f"world {world} exited {code}:\n{output}")
    losses = step_losses(events)
    if sorted(losses) != list(range(1, STEPS + 1)):
        fail(f"world {world}: expected steps 1..{STEPS}, got {sorted(losses)}")
    if want_plan:
        plan = next(e["layout"] for e in events if e.get("event") == "training_started")
        got = {k: plan[k] for k in want_plan}
        if got != want_plan:
            fail(f"world {world} {list(extra)}: the plan has {got}, expected {want_plan}")
    return losses


def test():
    reference = losses_for(1)
    runs = {2: losses_for(2), 4: losses_for(4),
            "2 with --micro-batches 8": losses_for(2, ["--micro-batches", "8"],
                                                   {"micro_batches": 8, "micro_batch_size": 1,
                                                    "replica_micro_batches": [4, 4]}),
            # --micro-batches decides the split even where batch / micro_batch (8 / 8) would
            # not divide over the world (the config check used to refuse this).
            "2 with --micro-batch 8 --micro-batches 4":
                losses_for(2, ["--micro-batch", "8", "--micro-batches", "4"],
                           {"micro_batches": 4, "micro_batch_size": 2,
                            "replica_micro_batches": [2, 2]})}
    for world, losses in runs.items():
        worst = max(relative_difference(reference[s], losses[s]) for s in reference)
        print(f"world {world}: worst relative loss difference vs world 1 over {STEPS} steps: {worst:.2e}")
        if worst > 1e-5:
            for s in sorted(reference):
                print(f"  step {s}: world1 {reference[s]:.8f} world{world} {losses[s]:.8f}")
            fail(f"world {world} diverges from world 1 by {worst:.2e} (> 1e-5)")
    if reference[STEPS] >= reference[1]:
        fail("the loss did not fall over 20 steps; the comparison would be vacuous")


if __name__ == "__main__":
    main(test)
