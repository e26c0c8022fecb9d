"""A flooded metrics port cannot starve the job, and a job that does run out of descriptors
says so.

- reserve: the whole job runs under a hard descriptor limit of 256 (prlimit, inherited by the
  agent and the workers) while 500 connections that never send a byte and a request with a
  1 MiB header hit the metrics port. The endpoint caps its connections and keeps a reserve of
  descriptors free, so every checkpoint still commits, the job ends with exit 0, a normal
  scrape is answered during the flood, and the refusals are counted in
  troupe_rejected_connections_total{listener="metrics"}.
- exhaustion: while the port is flooded the same way, one worker's descriptor limit is cut
  below what it already holds, so its next checkpoint cannot open a file. The failure is on the
  console, a checkpoint_failed event and troupe_checkpoint_failures_total; training goes on;
  the job exits 4 (a checkpoint failed and none committed after it) and the summary names the
  checkpoint LATEST holds.
- inheritance: while a job trains, no process of it (agent, workers) holds a descriptor of its
  parent's or any ancestor's other than stdin, stdout and stderr: above all not the
  coordinator's listening sockets (control plane, store, metrics), which a child that outlives
  the coordinator would otherwise keep open."""

import os
import re
import resource
import socket
import threading
import time
import urllib.request

from harness import SMALL_MODEL, Job, fail, free_port, main, wait_until

ARGS = SMALL_MODEL + ["--world", "2"]


def of(events, name):
    return [e for e in events if e.get("event") == name]


def scrape(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return r.read().decode()
    except OSError:
        return None


def series(text, name):
    m = re.search(rf"^{re.escape(name)} (\S+)$", text or "", re.M)
    return float(m.group(1)) if m else None


class Flood:
    """`count` silent connections to `port`, plus one request with a 1 MiB header."""

    def __init__(self, port, count):
        self.port, self.count, self.held = port, count, []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run)
        self.thread.start()

    def run(self):
        for _ in range(self.count):
            try:
                self.held.append(socket.create_connection(("127.0.0.1", self.port), timeout=1))
            except OSError:
                pass
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Junk: " + b"a" * (1 << 20) + b"\r\n\r\n")
        except OSError:
            pass  # the endpoint hung up on it: that is its job
        self.done.set()

    def stop(self):
        self.thread.join()
        for s in self.held:
            s.close()


RESERVE_STEPS = 20000


def low_hard_limit():
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


def reserve():
    port = free_port()
    # Long enough (tens of seconds) to outlast the flood's silent connections, whose request
    # deadline (5 s) is what frees the endpoint's places for the scrape below.
    with Job(ARGS + ["--steps", str(RESERVE_STEPS), "--checkpoint-every", "250", "--metrics-port", str(port)],
             preexec_fn=low_hard_limit) as job:
        wait_until(lambda: scrape(port), 60, "the metrics endpoint")
        flood = Flood(port, 500)
        try:
            wait_until(flood.done.is_set, 60, "the flood to be sent")
            # The held connections fill the cap; once the silent ones reach their request
            # deadline, a real scrape gets through although the flood is still connected.
            text = wait_until(lambda: scrape(port), 30, "a scrape answered during the flood")
        finally:
            flood.stop()
        refused = series(text, 'troupe_rejected_connections_total{listener="metrics"}')
        if not refused or refused < 100:
            fail(f"reserve: the flood's refusals are not counted: {refused}")
        code = job.wait(300)
        out = job.output()
        if code != 0:
            fail(f"reserve: the job exited {code} under a flood:\n{out[-3000:]}")
        events = job.events()
        if of(events, "checkpoint_failed"):
            fail(f"reserve: a checkpoint failed under the flood: {of(events, 'checkpoint_failed')}")
        committed = [c["step"] for c in of(events, "checkpoint")]
        if not committed or committed[-1] != RESERVE_STEPS:
            fail(f"reserve: the last checkpoint should be step {RESERVE_STEPS}, got {committed[-3:]}")
        print(f"reserve: hard limit 256, 500 silent connections and a 1 MiB header: {refused:.0f} "
              f"refused, {len(committed)} checkpoints committed, exit 0")


def exhaustion():
    port = free_port()
    with Job(ARGS + ["--steps", "100000", "--checkpoint-every", "50", "--metrics-port", str(port),
                     "--exit-after-step", "8000"]) as job:
        wait_until(lambda: len(of(job.events(), "checkpoint")) >= 2, 120, "two committed checkpoints")
        flood = Flood(port, 500)
        try:
            worker = next(e["pid"] for e in of(job.events(), "rank_joined") if e["rank"] == 1)
            held = len(os.listdir(f"/proc/{worker}/fd"))
            # Below what it holds: what is open stays open, but nothing new can be opened (a
            # limit equal to the count would let a file the writer closes be reopened).
            resource.prlimit(worker, resource.RLIMIT_NOFILE, (3, 3))

            # The flood holds every connection the endpoint serves until the silent ones reach
            # their deadline, so the failure is first seen where it is written down: the
            # events. Then the flood lets go and the metric must count it.
            def ended():
                if job.proc.poll() is not None:
                    fail(f"exhaustion: the job ended ({job.proc.returncode}) before a failed "
                         f"checkpoint was counted:\n{job.output()[-3000:]}")

            wait_until(lambda: ended() or of(job.events(), "checkpoint_failed"), 120,
                       "a failed checkpoint in events.jsonl")
        finally:
            flood.stop()

        def failure_counted():
            ended()
            text = scrape(port)
            return text if (series(text, "troupe_checkpoint_failures_total") or 0) >= 1 else None

        text = wait_until(failure_counted, 60, "the failed checkpoint in the metrics")
        code = job.wait(300)
        out = job.output()
        events = job.events()
        failed = of(events, "checkpoint_failed")
        committed = [c["step"] for c in of(events, "checkpoint")]
        if code != 4:
            fail(f"exhaustion: expected exit 4 (a checkpoint failed, none later), got {code}:\n{out[-3000:]}")
        if not failed:
            fail("exhaustion: no checkpoint_failed event")
        if not re.search(rf"checkpoint of step {failed[0]['step']} failed", out):
            fail(f"exhaustion: the failure is not on the console:\n{out[-3000:]}")
        if not re.search(r"[Tt]oo many open files|descriptor", failed[0]["error"]):
            fail(f"exhaustion: the failure does not say what ran out: {failed[0]}")
        latest = open(os.path.join(job.run_dir, "checkpoints", "LATEST")).read()
        if str(committed[-1]) not in latest.lstrip("step-0") and f"{committed[-1]:08d}" not in latest:
            fail(f"exhaustion: LATEST ({latest.strip()}) is not the last committed step {committed[-1]}")
        if f"  checkpoint        step {committed[-1]} (LATEST" not in out:
            fail(f"exhaustion: the summary does not name LATEST's step {committed[-1]}:\n{out[-2000:]}")
        print(f"exhaustion: worker holding {held} descriptors limited to 3; {len(failed)} failed checkpoints "
              f"on the console, in events and metrics ({series(text, 'troupe_checkpoint_failures_total'):.0f}); "
              f"exit 4; the summary names step {committed[-1]}")


def listening_inodes():
    """Inodes of every listening TCP socket on this machine (state 0A in /proc/net/tcp{,6})."""
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    cols = line.split()
                    if cols[3] == "0A":
                        out.add(cols[9])
        except OSError:
            pass
    return out


def descriptors(pid):
    """fd number -> what it points to ('socket:[123]', 'pipe:[45]', a path), for one process."""
    out = {}
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                out[int(fd)] = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                pass  # closed while we looked
    except OSError:
        pass
    return out


def parent_of(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def inheritance():
    port = free_port()
    with Job(ARGS + ["--steps", "100000", "--checkpoint-every", "50", "--metrics-port", str(port)]) as job:
        wait_until(lambda: len(of(job.events(), "checkpoint")) >= 1, 120, "a committed checkpoint")
        root = job.proc.pid
        tree = {root: None}  # pid -> parent, for the job's processes
        for _ in range(3):  # agent, then its workers
            for entry in os.listdir("/proc"):
                if entry.isdigit() and parent_of(int(entry)) in tree and int(entry) not in tree:
                    tree[int(entry)] = parent_of(int(entry))
        workers = [e["pid"] for e in of(job.events(), "rank_joined")]
        if not all(w in tree for w in workers):
            fail(f"inheritance: workers {workers} are not all below the coordinator {root}: {tree}")
        listening = listening_inodes()
        fds = {pid: descriptors(pid) for pid in tree}
        coordinator_listeners = {t for t in fds[root].values()
                                 if t.startswith("socket:[") and t[8:-1] in listening}
        if len(coordinator_listeners) < 3:
            fail(f"inheritance: expected the coordinator's control plane, store and metrics "
                 f"listeners, found {coordinator_listeners}")
        leaks = []
        for child, parent in tree.items():
            ancestor = parent
            while ancestor is not None:
                theirs = set(fds[ancestor].values())
                for fd, target in fds[child].items():
                    # Every epoll, eventfd and timerfd links to the one shared anonymous
                    # inode ("anon_inode:[eventpoll]"), so such names say nothing about sharing.
                    if (fd > 2 and target in theirs and not target.startswith("/dev/")
                            and not target.startswith("anon_inode:")):
                        leaks.append(f"pid {child} fd {fd} -> {target} (also open in {ancestor})")
                ancestor = tree.get(ancestor)
        if leaks:
            fail("inheritance: descriptors leaked into children:\n  " + "\n  ".join(leaks))
        print(f"inheritance: {len(tree) - 1} children of the coordinator hold none of its "
              f"{len(coordinator_listeners)} listening sockets nor any other descriptor of an "
              f"ancestor")


def test():
    inheritance()
    reserve()
    exhaustion()


if __name__ == "__main__":
    main(test)
