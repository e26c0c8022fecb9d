"""A line of events.jsonl that a full disk cut short is taken back (README "Divergence and
failures that are never silent"): a job whose files may not grow past LIMIT bytes (RLIMIT_FSIZE
cuts a write short exactly as a full disk does, without filling one) trains to its last step,
says each time that a partial line was removed, and leaves an events.jsonl of whole JSON lines
only, ending in a newline. (event_log_test.cpp tests the same in one process.)"""

import json
import os
import resource
import signal
import subprocess
import tempfile

from harness import SMALL_MODEL, TROUPE, fail, job_pids, main, read_events

LIMIT = 20000  # ~60 events: the job's 200 steps need far more
STEPS = 200


def full_disk():
    """preexec_fn: files of the job stop growing at LIMIT bytes. SIGXFSZ, which a write that
    fits nothing would raise, is ignored so that the write fails instead (EFBIG)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, resource.RLIM_INFINITY))


def test():
    # TCP between the ranks: the shared-memory segments (memfds) obey the limit too.
    env = dict(os.environ, TROUPE_TRANSPORT="tcp")
    args = SMALL_MODEL + ["--world", "2", "--steps", str(STEPS), "--checkpoint-every", "0",
                          "--metrics-port", "0"]
    with tempfile.TemporaryDirectory(prefix="troupe-full-disk-") as tmp:
        run_dir = os.path.join(tmp, "run")
        # The output through a pipe: a file would stop growing at LIMIT too.
        job = subprocess.Popen([TROUPE, "run", "--run-dir", run_dir] + args, env=env,
                               preexec_fn=full_disk, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
        try:
            out, _ = job.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for pid in [job.pid] + job_pids(read_events(run_dir)):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            job.communicate()
            fail("the job did not end within 120 s")
        with open(os.path.join(run_dir, "events.jsonl"), "rb") as f:
            data = f.read()
    taken_back = out.count("the partial line was removed")
    if not taken_back:
        fail(f"no event write was cut short and taken back ({len(data)} bytes):\n{out[-3000:]}")
    if f"trained {STEPS} steps" not in out:
        fail(f"the job should train on to step {STEPS} while its events are lost:\n{out[-3000:]}")
    if not data.endswith(b"\n") or len(data) > LIMIT:
        fail(f"events.jsonl ({len(data)} bytes) should end with a whole line: {data[-200:]!r}")
    torn = []
    for number, line in enumerate(data.split(b"\n")[:-1], 1):
        try:
            if not isinstance(json.loads(line), dict):
                torn.append(number)
        except ValueError:
            torn.append(number)
    if torn:
        fail(f"events.jsonl holds torn lines {torn}")
    lines = data.count(b"\n")
    print(f"{taken_back} lines cut short and taken back; events.jsonl: {lines} whole lines, "
          f"{len(data)} bytes of {LIMIT}; the job trained {STEPS} steps")


if __name__ == "__main__":
    main(test)
