"""Shared helpers for troupe's end-to-end tests: start real `troupe` processes on free
ports in temporary run directories, wait on conditions with deadlines, read events.jsonl,
and make sure every process a test started is gone afterwards (by pid)."""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import troupe_events  # noqa: E402  (one reader of events.jsonl for the tests and the benchmarks)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "chaos",
                                "netns"))
from host import pid_alive  # noqa: E402,F401  (the netns harness's; the tests import it from here)

TROUPE = os.environ.get("TROUPE_BIN", "")
SMALL_MODEL = ["--layers", "2", "--heads", "2", "--d-model", "32", "--context", "32",
               "--batch", "8", "--micro-batch", "2", "--eval-every", "0", "--no-progress"]


_failure = []  # the first line of what failed, repeated last (a CI log keeps the tail)


def fail(msg):
    print(f"FAIL: {msg}", flush=True)
    _failure.append(str(msg).splitlines()[0][:400] if str(msg) else "")
    raise SystemExit(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_free_ports():
    """A port P with P + 1 free too: coordinator i of --coordinators serves metrics on P + i."""
    while True:
        p = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p + 1))
                return p
            except OSError:
                continue


def wait_until(predicate, timeout, what):
    """Polls `predicate` until it returns a truthy value or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    pause = 0.01
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(pause)
        pause = min(pause * 2, 0.25)


def read_events_file(path):
    """The events of one events.jsonl ([] while it does not exist). A line that is not a JSON
    object is skipped with a warning on stderr (bench/troupe_events.py)."""
    if not os.path.exists(path):
        return []
    return troupe_events.read_events(path)


def read_events(run_dir):
    return read_events_file(os.path.join(run_dir, "events.jsonl"))


def last_job(events):
    """The events of the newest job in a run directory (resumed jobs append to the file)."""
    starts = [i for i, e in enumerate(events) if e.get("event") == "job_start"]
    return events[starts[-1]:] if starts else events


def step_losses(events):
    return {e["step"]: e["loss"] for e in events if e.get("event") == "step"}


def job_pids(events):
    """Every process the job reported: agents and ranks."""
    return [e["pid"] for e in events if e.get("event") in ("rank_joined", "agent_joined")]


class Job:
    """One `troupe` process (run or coordinator), its output, and cleanup of everything
    it and its children reported."""

    def __init__(self, args, run_dir=None, command="run", env=None, preexec_fn=None):
        if not TROUPE:
            fail("TROUPE_BIN is not set")
        self.tmp = tempfile.TemporaryDirectory(prefix="troupe-test-")
        self.run_dir = run_dir or os.path.join(self.tmp.name, "run")
        self.log_path = os.path.join(self.tmp.name, "output.log")
        self.log = open(self.log_path, "w")
        full = [TROUPE, command, "--run-dir", self.run_dir] + list(args)
        self.proc = subprocess.Popen(full, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=env or os.environ.copy(), preexec_fn=preexec_fn)
        self.extra_pids = []

    def events(self):
        return read_events(self.run_dir)

    def output(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_all()
            fail(f"troupe did not finish within {timeout}s; output:\n{self.output()}")

    def all_pids(self):
        return [self.proc.pid] + job_pids(self.events()) + self.extra_pids

    def kill_all(self):
        for pid in self.all_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def assert_no_process_left(self, timeout=20):
        pids = self.all_pids()
        wait_until(lambda: not any(pid_alive(p) for p in pids), timeout,
                   f"processes {[p for p in pids if pid_alive(p)]} to exit")

    def close(self):
        self.kill_all()
        self.log.close()
        try:
            verify_left_behind(self.run_dir)
        finally:
            self.tmp.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def verify_left_behind(run_dir):
    """Every committed checkpoint a job leaves behind must read back intact (issue 24): what a
    test damages on purpose is quarantined (checkpoints/damaged/) by the next job or scrub,
    never left committed. Called as each Job closes."""
    if not os.path.isdir(os.path.join(run_dir, "checkpoints")):
        return
    p = subprocess.run([TROUPE, "ckpt", "verify", run_dir], capture_output=True, text=True,
                       timeout=300)
    out = p.stdout + p.stderr
    damaged = [line for line in out.splitlines()
               if line.startswith("LATEST: damaged") or " problem" in line]
    if damaged:
        fail(f"a committed checkpoint left in {run_dir} does not verify:\n{out}")


def run_to_end(args, timeout, run_dir=None, env=None):
    """Runs a job to completion; returns (exit code, events, output)."""
    with Job(args, run_dir=run_dir, env=env) as job:
        code = job.wait(timeout)
        return code, job.events(), job.output()


def run_ok(name, args, run_dir, timeout=600):
    """Runs a job that must succeed; returns its events."""
    code, events, output = run_to_end(args, timeout=timeout, run_dir=run_dir)
    if code != 0:
        fail(f"{name} exited {code}:\n{output}")
    return events


def checkpoint_param_diff(a, b):
    """Relative L2 difference of the final parameters of two run directories (checkpoint_diff)."""
    tool = os.environ.get("CHECKPOINT_DIFF", "")
    if not tool:
        fail("CHECKPOINT_DIFF is not set")
    out = subprocess.run([tool, a, b], capture_output=True, text=True)
    if out.returncode != 0:
        fail(f"checkpoint_diff failed: {out.stderr}")
    return float(out.stdout.split()[1])


def relative_difference(a, b):
    return abs(a - b) / max(abs(a), abs(b), 1e-30)


SKIPPED = 77  # the SKIP_RETURN_CODE of every test in CMakeLists.txt: CTest says "Skipped"
_skipped = []


def skip(reason):
    """Records that a part of the test cannot run on this machine, and goes on: main() then
    exits 77 (Skipped, never Passed) unless something failed."""
    print(f"SKIP: {reason}", flush=True)
    _skipped.append(reason)


def main(test):
    """Runs `test()` and prints a plain closing line that CTest logs show."""
    try:
        test()
    except SystemExit as e:
        if e.code == SKIPPED:
            print("0 passed, 0 failed, 1 skipped", flush=True)
        elif e.code not in (0, None):
            said = f" (FAIL: {_failure[-1]})" if _failure else ""
            print(f"0 passed, 1 failed{said}", flush=True)
        raise
    if _skipped:
        print(f"0 passed, 0 failed, 1 skipped (not run here: {'; '.join(_skipped)})", flush=True)
        sys.exit(SKIPPED)
    print("1 passed, 0 failed", flush=True)
    sys.exit(0)


def socket_inodes(pid):
    """The inodes of the sockets `pid` holds, as /proc/net/tcp names them (none where its file
    descriptors cannot be read: it has exited)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def listening_ports(pids):
    """TCP ports in LISTEN state whose socket any of `pids` holds."""
    inodes = set()
    for pid in pids:
        inodes |= socket_inodes(pid)
    return sorted({int(cols[1].rsplit(":", 1)[1], 16) for cols in tcp_rows()
                   if cols[3] == "0A" and cols[9] in inodes})  # 0A: LISTEN


def tcp_rows():
    """The rows of this network namespace's /proc/net/tcp and tcp6, each split into columns
    (local address, remote address, state, ..., inode at 9)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            yield row.split()
