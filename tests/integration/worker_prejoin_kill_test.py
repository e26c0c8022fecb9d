"""A worker killed (kill -9) before it joined does not leave the job forming until the join
deadline: with the others enough for --min-ranks the job starts without it and trains to the
end; when they are not, the job fails at once (exit 1, far within --join-timeout-ms), naming the
member, how it died and what to do. Before, both waited out the deadline and failed with "only
1 of 2 workers joined"."""

import os
import signal
import time

from harness import SMALL_MODEL, Job, fail, main
from procfs import tagged_env, tagged_pids

JOIN_TIMEOUT_S = 30
ARGS = SMALL_MODEL + ["--world", "2", "--steps", "20", "--metrics-port", "0",
                      "--join-timeout-ms", str(JOIN_TIMEOUT_S * 1000)]


def worker_of(tag, member):
    """The pid of the tagged `troupe worker --member MEMBER` process, if it runs."""
    for pid in tagged_pids(tag):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"worker" in argv and b"--member" in argv:
            i = argv.index(b"--member")
            if i + 1 < len(argv) and argv[i + 1] == str(member).encode():
                return pid
    return None


def run_with_member_killed(extra, member=1):
    """Starts a job, kills `member`'s worker as soon as its agent starts it, and waits for the
    job's end: (exit code, seconds, events, output). None when the kill came too late (the
    worker had joined already), so the caller tries again."""
    env, tag = tagged_env()
    with Job(ARGS + extra, env=env) as job:
        started = time.monotonic()
        pid = None
        while pid is None:
            if time.monotonic() - started > 60:
                fail(f"member {member}'s worker never started:\n{job.output()}")
            if job.proc.poll() is not None:
                fail(f"the job ended before member {member} started:\n{job.output()}")
            pid = worker_of(tag, member)
            if pid is None:
                time.sleep(0.002)
        os.kill(pid, signal.SIGKILL)
        try:
            code = job.proc.wait(timeout=JOIN_TIMEOUT_S + 60)
        except Exception:
            job.kill_all()
            fail(f"the job did not end:\n{job.output()}")
        took = time.monotonic() - started
        events, output = job.events(), job.output()
        if any(e.get("event") == "rank_joined" and e.get("pid") == pid for e in events):
            print(f"member {member} (pid {pid}) joined before the kill; trying again", flush=True)
            return None
        print(f"killed member {member} (pid {pid}) before it joined: exit {code} after "
              f"{took:.1f}s", flush=True)
        return code, took, events, output


def killed_before_join(extra):
    for _ in range(3):
        if (result := run_with_member_killed(extra)) is not None:
            return result
    fail("could not kill a worker before it joined in 3 tries")


def test():
    # Enough without it (--min-ranks 1): the job starts on one rank and trains to the end.
    code, took, events, output = killed_before_join([])
    if code != 0:
        fail(f"the job should train without the dead worker, exited {code}:\n{output}")
    if took > JOIN_TIMEOUT_S / 2:
        fail(f"the job waited {took:.1f}s for a worker that was dead")
    steps = [e["step"] for e in events if e.get("event") == "step"]
    if max(steps, default=0) != 20:
        fail(f"trained to step {max(steps, default=0)}, not 20:\n{output}")
    starts = [e for e in events if e.get("event") == "state" and e.get("from") == "forming"]
    if not starts or "without member 1" not in starts[0].get("reason", ""):
        fail(f"the start does not say that member 1 is left out: {starts}")
    if "world 1, configured 2" not in output:
        fail(f"the summary does not name the world it trained on:\n{output}")

    # Not enough (--min-ranks 2): the job fails at once, naming the member and what to do.
    code, took, events, output = killed_before_join(["--min-ranks", "2"])
    if code != 1:
        fail(f"the job should fail with exit 1, exited {code}:\n{output}")
    if took > JOIN_TIMEOUT_S / 2:
        fail(f"the job failed only after {took:.1f}s, waiting for a worker that was dead")
    for words in ("member 1", "killed by signal 9", "--min-ranks 2", "--max-restarts"):
        if words not in output:
            fail(f"the failure does not say '{words}':\n{output}")


if __name__ == "__main__":
    main(test)
