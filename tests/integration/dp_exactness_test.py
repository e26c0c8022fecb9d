"""DP exactness: 2-rank and 4-rank jobs (separate processes, Gloo over TCP) give the same
loss at each of 20 steps as a 1-rank job with the same global batch, within 1e-5 relative."""

from harness import SMALL_MODEL, fail, main, relative_difference, run_to_end, step_losses

STEPS = 20


def losses_for(world):
    args = SMALL_MODEL + ["--world", str(world), "--steps", str(STEPS), "--metrics-port", "0",
                          "--checkpoint-every", "0"]
    code, events, output = run_to_end(args, timeout=300)
    if code != 0:
        fail(f"world {world} exited {code}:\n{output}")
    losses = step_losses(events)
    if sorted(losses) != list(range(1, STEPS + 1)):
        fail(f"world {world}: expected steps 1..{STEPS}, got {sorted(losses)}")
    return losses


def test():
    reference = losses_for(1)
    for world in (2, 4):
        losses = losses_for(world)
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
