"""--straggler-policy evict (README "Elastic training"): a rank whose compute is slowed 3x (an
injected `slow` fault on the last rank) is flagged and evicted while the job runs: lost with
cause "straggler", its process gone while the job trains on without it, in a generation one
rank smaller. (straggler_test.py: `warn` and `rebalance` keep the rank; healthy ranks are never
flagged.)"""

import os
import signal
import tempfile

from harness import SMALL_MODEL, Job, fail, main, pid_alive, wait_until

WORLD = 3
SLOW = WORLD - 1  # the last rank: the smaller world after the eviction has no rank it slows
SLOW_FROM = 10
ARGS = SMALL_MODEL + ["--d-model", "128", "--heads", "4", "--context", "64", "--batch", "24",
                      "--world", str(WORLD), "--min-ranks", "2", "--steps", "100000",
                      "--checkpoint-every", "0", "--metrics-port", "0",
                      "--straggler-policy", "evict",
                      # The fault triples the rank's compute (it scores 2.5-3); once it is gone,
                      # a healthy rank of the two left scored 1.31 under the other tests on
                      # these cores (CI).
                      "--straggler-factor", "1.9",
                      "--fault", f"slow:rank={SLOW}:factor=3:from={SLOW_FROM}"]


def of(events, name):
    return [e for e in events if e.get("event") == name]


def test():
    with tempfile.TemporaryDirectory(prefix="troupe-evict-") as tmp:
        with Job(ARGS, run_dir=os.path.join(tmp, "run")) as job:
            lost = wait_until(lambda: of(job.events(), "rank_lost") or job.proc.poll() is not None,
                              60, "a rank to be evicted")
            if job.proc.poll() is not None and not of(job.events(), "rank_lost"):
                fail(f"the job ended ({job.proc.returncode}) without evicting a rank:\n"
                     f"{job.output()}")
            lost = lost[0]
            flags = of(job.events(), "straggler")
            if not flags or flags[0]["rank"] != SLOW or flags[0]["policy"] != "evict":
                fail(f"the slowed rank {SLOW} was not flagged first: {flags}")
            if not SLOW_FROM <= flags[0]["step"] <= SLOW_FROM + 15:
                fail(f"flagged at step {flags[0]['step']}, expected within 15 steps of {SLOW_FROM}")
            if lost["cause"] != "straggler" or lost["member"] != flags[0]["member"]:
                fail(f"the flagged member should be lost as a straggler: {lost}, flag {flags[0]}")
            # Evicted means told to go while the job trains on: the process exits 0 saying why
            # (so that its agent does not restart it), not left to fence itself when the
            # coordinator stops speaking to it, nor kept until the end.
            exited = wait_until(
                lambda: [e for e in of(job.events(), "worker_exited") if e["pid"] == lost["pid"]]
                or job.proc.poll() is not None, 30, f"the evicted process {lost['pid']} to exit")
            if job.proc.poll() is not None:
                fail(f"the job ended ({job.proc.returncode}) before the evicted process "
                     f"{lost['pid']} was gone:\n{job.output()}")
            if exited[0]["exit_code"] != 0 or exited[0]["signal"] != 0:
                fail(f"the evicted worker should exit 0 when told to go: {exited[0]}\n"
                     f"{job.output()}")
            if "evicted: compute" not in job.output():
                fail(f"the evicted worker should say why it left:\n{job.output()}")
            if pid_alive(lost["pid"]):
                fail(f"the evicted process {lost['pid']} is still alive after its exit")

            def steps_after():
                return [e for e in of(job.events(), "step") if e["step"] > lost["step"]]
            gone_at = len(steps_after())
            wait_until(lambda: len(steps_after()) >= gone_at + 10 or job.proc.poll() is not None,
                       60, "10 more steps without the evicted rank")
            job.proc.send_signal(signal.SIGINT)
            if job.wait(60) != 130:
                fail(f"Ctrl-C should end the job with 130:\n{job.output()}")
            events = job.events()
            after = steps_after()
            if len(after) < gone_at + 10 or any(e["world"] != WORLD - 1 for e in after):
                fail(f"after the eviction at step {lost['step']} the job should train on "
                     f"{WORLD - 1} ranks: {[(e['step'], e['world']) for e in after][:5]}...")
            if len(of(events, "straggler")) != 1 or len(of(events, "rank_lost")) != 1:
                fail(f"one straggler, one eviction expected: {of(events, 'straggler')} "
                     f"{of(events, 'rank_lost')}")
            print(f"rank {SLOW} flagged at step {flags[0]['step']} (x{flags[0]['factor']:.2f}), "
                  f"evicted (pid {lost['pid']} gone after {gone_at} more steps), steps "
                  f"{after[0]['step']}..{after[-1]['step']} on {WORLD - 1} ranks")


if __name__ == "__main__":
    main(test)
