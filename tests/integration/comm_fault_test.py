"""Chaos on the data plane of a real job: a rank whose collective fails, and a rank that
hangs inside one (a silent peer). Either way the faulty rank is evicted within the step
deadline (the one that failed on its own, or the one that stayed silent while its peer timed
out); with --min-ranks 2 the job cannot go on, so it fails with a message naming the rank and
leaves no process behind."""

import os
import time

from harness import SMALL_MODEL, Job, fail, main

TIMEOUT_MS = 3000


def attack(plan, expect):
    env = dict(os.environ, TROUPE_CHAOS_RANK1=plan)
    # --reduction fast: one all-reduce a step, so collective N is in step N (the exact sum makes
    # two calls a step: the tree sum and the loss's all-gather).
    args = SMALL_MODEL + ["--world", "2", "--min-ranks", "2", "--steps", "100000", "--metrics-port", "0", "--checkpoint-every", "0",
                          "--step-timeout-ms", str(TIMEOUT_MS), "--reduction", "fast"]
    with Job(args, env=env) as job:
        started = time.monotonic()
        code = job.wait(60)
        took = time.monotonic() - started
        out = job.output()
        if code != 1:
            fail(f"{plan}: expected exit code 1, got {code}:\n{out}")
        for needle in expect:
            if needle not in out:
                fail(f"{plan}: the failure should mention {needle!r}:\n{out}")
        steps = [e["step"] for e in job.events() if e.get("event") == "step"]
        if steps and max(steps) >= 5:
            fail(f"{plan}: step 5 should never commit, but steps up to {max(steps)} did")
        job.assert_no_process_left()
        print(f"{plan}: job failed after {took:.1f}s with steps 1..{max(steps) if steps else 0} committed")
        return took


def test():
    attack("fail@5", ["rank 1 lost (error)", "rank 1 failed step 5", "injected fault"])
    took = attack("hang@5", ["rank 1 lost (error)", "failed step 5", "timed out"])
    # Setup plus four quick steps plus one deadline; far less than the job's watchdog.
    if took > 3 * TIMEOUT_MS / 1000 + 20:
        fail(f"a hung rank took {took:.1f}s to fail the job")


if __name__ == "__main__":
    main(test)
