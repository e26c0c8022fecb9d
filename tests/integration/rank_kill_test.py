"""A rank killed with kill -9 mid-run: the job notices at once, fails with exit code 1 and a
message naming the lost rank, leaves no process behind, and its last committed checkpoint
is intact (a --resume continues from it). Once data-parallel, once as a pipeline stage
(whose neighbour is blocked in a send/recv or waiting for the stage actor's notice)."""

import os
import signal
import time

from harness import SMALL_MODEL, Job, fail, last_job, main, run_to_end, wait_until


LAYOUTS = {"dp2": [], "pp2": ["--pp", "2", "--micro-batches", "4"]}


def test():
    for name, layout in LAYOUTS.items():
        kill_and_resume(name, layout)


def kill_and_resume(name, layout):
    # --min-ranks 2: the job cannot go on without the lost rank (elastic_recovery_test covers the
    # recovery); it fails at once with its checkpoint intact.
    args = SMALL_MODEL + ["--world", "2", "--min-ranks", "2", "--steps", "100000", "--checkpoint-every", "5", "--metrics-port", "0",
                          "--step-timeout-ms", "20000"] + layout
    with Job(args) as job:
        wait_until(lambda: any(e.get("event") == "checkpoint" and e["step"] >= 5 for e in job.events()), 120,
                   "the first checkpoint")
        victim = next(e["pid"] for e in job.events() if e.get("event") == "rank_joined" and e["rank"] == 1)
        killed_at = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        code = job.wait(60)
        took = time.monotonic() - killed_at
        out = job.output()
        if code != 1:
            fail(f"expected exit code 1 after losing a rank, got {code}:\n{out}")
        if "rank 1 lost" not in out:
            fail(f"the failure message does not name rank 1:\n{out}")
        if not any(e.get("event") == "rank_lost" and e.get("rank") == 1 for e in job.events()):
            fail("no rank_lost event for rank 1")
        print(f"{name}: job failed {took:.2f}s after the kill")
        job.assert_no_process_left()
        committed = max(e["step"] for e in job.events() if e.get("event") == "checkpoint")
        code, events, output = run_to_end(SMALL_MODEL + ["--world", "2", "--steps", str(committed + 3),
                                                         "--metrics-port", "0", "--resume"] + layout,
                                          timeout=300, run_dir=job.run_dir)
        if code != 0:
            fail(f"{name}: resume after the kill exited {code}:\n{output}")
        resumed = sorted(e["step"] for e in last_job(events) if e.get("event") == "step" and e["step"] > committed)
        if resumed != [committed + 1, committed + 2, committed + 3]:
            fail(f"resume should continue after step {committed}, trained {resumed}")


if __name__ == "__main__":
    main(test)
