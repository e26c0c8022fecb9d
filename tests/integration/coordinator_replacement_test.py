"""`troupe run --coordinators 2` keeps two coordinators however many die (issue 28): a
coordinator killed while the job goes on is started again by the launcher, standing by, at the
dead one's address (the one the agents and workers were given). The leader is killed as step 10
begins and its successor as step 25 begins: with only the two first coordinators the second kill
would leave none and end the job; with the replacement the job ends with exit 0 under a third
leader (the first one's replacement), with every step's loss and the final parameters of the
job without kills and the same worker processes. Skipped when etcd is not installed."""

import os
import tempfile

from coordinator_takeover_test import leader_pid, of, same_workers
from harness import (SMALL_MODEL, Job, checkpoint_param_diff, fail, main, relative_difference,
                     run_ok, skip, step_losses)

ETCD = "/usr/bin/etcd"
ARGS = SMALL_MODEL + ["--steps", "40", "--checkpoint-every", "5", "--metrics-port", "0",
                      "--step-timeout-ms", "20000"]


def test():
    if not os.access(ETCD, os.X_OK):
        skip("etcd is not installed (/usr/bin/etcd: apt-get install etcd-server)")
        return
    with tempfile.TemporaryDirectory(prefix="troupe-replacement-") as tmp:
        ref_dir = os.path.join(tmp, "reference")
        reference = run_ok("without kills", ARGS, ref_dir, timeout=300)
        run_dir = os.path.join(tmp, "killed")
        with Job(ARGS + ["--coordinators", "2", "--etcd", "local",
                         "--fault", "kill:coordinator:step=10",
                         "--fault", "kill:coordinator:step=25"], run_dir=run_dir) as job:
            code = job.wait(300)
            events, output = job.events(), job.output()
            job.assert_no_process_left()
        if code != 0:
            fail(f"two leaders killed one after the other: exit {code}:\n{output}")
        leaders = of(events, "leader")
        pids = [leader_pid(e) for e in leaders]
        epochs = [e["epoch"] for e in leaders]
        if len(leaders) != 3 or len(set(pids)) != 3 or epochs != sorted(set(epochs)):
            fail(f"expected three leaders, each a new process under a higher epoch: {leaders}")
        replaced = [line for line in output.splitlines() if "in place of" in line]
        if len(replaced) < 1 or str(pids[2]) not in "".join(replaced):
            fail(f"the third leader ({pids[2]}) should be a coordinator the launcher started "
                 f"in a dead one's place: {replaced}\n{output}")
        ref = step_losses(reference)
        for e in of(events, "step"):
            if relative_difference(e["loss"], ref[e["step"]]) > 1e-6:
                fail(f"step {e['step']} has loss {e['loss']}, the job without kills "
                     f"{ref[e['step']]}")
        if sorted(step_losses(events)) != list(range(1, 41)):
            fail(f"committed steps {sorted(step_losses(events))}")
        same_workers("two takeovers", events)
        diff = checkpoint_param_diff(ref_dir, run_dir)
        if diff > 1e-6:
            fail(f"the final parameters differ by {diff:.2e}")
        print(f"leaders {pids} (epochs {epochs}); {replaced[0].strip()}; every step exact, "
              f"parameters {diff:.1e}, workers kept", flush=True)


if __name__ == "__main__":
    main(test)
