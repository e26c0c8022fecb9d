"""A takeover after a rollback trains on the batches the job trains on (found by the soak,
issue 28): `troupe run --coordinators 2 --etcd local --on-divergence rollback`, the batch of
step 8 poisoned (the job rolls back to step 5 and skips it), then the leader killed as step 15
begins. The standby was started with the job, before the skip; taking over, it must use the
skipped batches as they are now (etcd's record of the job, and skipped_batches.json), or every
rank moves back to the poisoned batch's data position and trains another model. Every
committed step must have the loss of the same job without the kill, and the final parameters
its parameters. Skipped when etcd is not installed."""

import os
import tempfile

from coordinator_takeover_test import of
from harness import (SMALL_MODEL, checkpoint_param_diff, fail, main, relative_difference, run_ok,
                     skip, step_losses)

ETCD = "/usr/bin/etcd"
ARGS = SMALL_MODEL + ["--steps", "25", "--checkpoint-every", "5", "--metrics-port", "0",
                      "--on-divergence", "rollback", "--fault", "diverge:step=8"]


def test():
    if not os.access(ETCD, os.X_OK):
        skip("etcd is not installed (/usr/bin/etcd: apt-get install etcd-server)")
        return
    with tempfile.TemporaryDirectory(prefix="troupe-takeover-skips-") as tmp:
        ref_dir = os.path.join(tmp, "reference")
        reference = run_ok("without the kill", ARGS, ref_dir, timeout=300)
        run_dir = os.path.join(tmp, "killed")
        events = run_ok("the leader killed after a rollback",
                        ARGS + ["--coordinators", "2", "--etcd", "local",
                                "--fault", "kill:coordinator:step=15"], run_dir, timeout=300)
        leaders = of(events, "leader")
        diverged = of(events, "diverged")
        if len(leaders) < 2 or len(diverged) != 1 or diverged[0]["skipped_steps"] != [8]:
            fail(f"expected a rollback skipping step 8's batch and then a takeover, got leaders "
                 f"{leaders} and {diverged}")
        ref = step_losses(reference)
        after = [e for e in events if e.get("event") == "step" and
                 e["unix_ms"] >= leaders[1]["unix_ms"]]
        if not after:
            fail("no step was committed after the takeover")
        for e in of(events, "step"):
            if relative_difference(e["loss"], ref[e["step"]]) > 1e-6:
                fail(f"step {e['step']} (generation {e['generation']}) has loss {e['loss']}, "
                     f"the job without the kill {ref[e['step']]}: the new leader trains on "
                     "other batches")
        diff = checkpoint_param_diff(ref_dir, run_dir)
        if diff > 1e-6:
            fail(f"the final parameters differ by {diff:.2e}")
        print(f"rolled back at step 8, leader killed at step 15, {len(after)} steps committed "
              f"under the new leader with the losses of the job without the kill; parameters "
              f"{diff:.1e}", flush=True)


if __name__ == "__main__":
    main(test)
