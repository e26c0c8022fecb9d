#!/usr/bin/env python3
"""What etcd holds and answers is input too (issue 36):

(1) The job's keys deleted from etcd mid-run (`etcdctl del --prefix`) while a standby waits:
    the job never starts over. It goes on from what the run directory and the members hold,
    every step is committed once, the losses equal an undisturbed run's, and the loss is an
    `etcd_state_lost` event.
(2) A second job under the id a running job holds (`--coordinators 2`) is refused within 5 s
    with exit 2 naming `--job-id`; the first job goes on untouched.
(3) An endpoint that answers every request with a 50 MB body, announced or not (a stand-in HTTP
    server): the job
    ends with exit 1 within --etcd-timeout-ms + 5 s naming the size, and the coordinator never
    holds more than the cap (its peak RSS stays below 64 MiB); one that answers garbage is
    reported as answering, not as silent.
(4) `troupe run --coordinators 2 --etcd local` whose launcher is killed (kill -9): no process of
    the job is left 5 s later.

Skipped when /usr/bin/etcd (etcd-server) is not installed (parts 1, 2 and 4)."""

import http.server
import os
import re
import signal
import subprocess
import tempfile
import threading
import time

import harness
from etcd_members import ETCD, EtcdCluster
from harness import SMALL_MODEL, TROUPE, Job, fail, pid_alive, wait_until
from procfs import kill_tagged, tagged_env, tagged_pids

BASE = SMALL_MODEL + ["--checkpoint-every", "5", "--metrics-port", "0", "--step-timeout-ms",
                      "30000"]
# Both ranks slower (the same arithmetic): long enough to act on the job while it trains.
SLOW = ["--fault", "slow:rank=0:factor=30:from=1", "--fault", "slow:rank=1:factor=30:from=1"]


def of(events, name):
    return [e for e in events if e.get("event") == name]


def step_events(run_dir):
    return of(harness.read_events(run_dir), "step")


def keys_deleted(tmp, etcd):
    steps = 60
    reference = os.path.join(tmp, "undisturbed")
    harness.run_ok("the undisturbed run", BASE + ["--steps", str(steps)], reference)
    ref = {e["step"]: e["loss"] for e in step_events(reference)}
    run_dir = os.path.join(tmp, "keys-deleted")
    args = BASE + SLOW + ["--steps", str(steps), "--coordinators", "2", "--etcd", etcd.url,
                          "--job-id", "deleted"]
    with Job(args, run_dir=run_dir) as job:
        wait_until(lambda: len(step_events(run_dir)) >= 12, 180, "12 steps")
        out = etcd.ctl("del", "--prefix", "/troupe/deleted/")
        if out.returncode != 0:
            fail(f"etcdctl del failed: {out.stderr}")
        code = job.wait(300)
        output = job.output()
    if code != 0:
        fail(f"the job whose keys were deleted exited {code}:\n{output[-4000:]}")
    events = harness.read_events(run_dir)
    committed = [e["step"] for e in of(events, "step")]
    twice = sorted({s for s in committed if committed.count(s) > 1})
    # A rollback never happens here, so a step committed twice is a restart.
    if twice:
        fail(f"steps committed twice after the keys were deleted: {twice[:10]}")
    if sorted(committed) != list(range(1, steps + 1)):
        fail(f"committed steps {sorted(set(committed))[:5]}..., not 1..{steps}")
    restored = [e for e in of(events, "restored") if e.get("source") == "init"]
    generations = of(events, "generation")
    if any(g.get("start_step") == 0 for g in generations[1:]):
        fail(f"a generation after the first started from step 0: {generations}")
    lost = of(events, "etcd_state_lost")
    if not lost:
        fail("no etcd_state_lost event was written; leaders "
             f"{of(events, 'leader')}, generations {generations}:\n{output[-3000:]}")
    worst = max(harness.relative_difference(ref[s], e["loss"])
                for e in of(events, "step") for s in [e["step"]])
    if worst > 1e-5:
        fail(f"losses differ from the undisturbed run's by up to {worst:.2e}")
    print(f"ok: keys deleted mid-run: taken over from step >= {lost[0]['checkpoint_step']}, every "
          f"step once, exact (worst {worst:.1e}); {len(restored)} restores from init")


def id_collision(tmp, etcd):
    first = os.path.join(tmp, "first")
    with Job(BASE + SLOW + ["--steps", "2000", "--coordinators", "2", "--etcd", etcd.url,
                            "--job-id", "taken"], run_dir=first) as job:
        wait_until(lambda: len(step_events(first)) >= 3, 180, "the first job's steps")
        started = time.monotonic()
        p = subprocess.run([TROUPE, "run", "--run-dir", os.path.join(tmp, "second"),
                            "--coordinators", "2", "--etcd", etcd.url, "--job-id", "taken",
                            "--steps", "20"] + BASE,
                           capture_output=True, text=True, timeout=60)
        took = time.monotonic() - started
        out = p.stdout + p.stderr
        if p.returncode != 2 or "--job-id" not in out or first not in out:
            fail(f"the second job under a live job's id exited {p.returncode} after {took:.1f} s, "
                 f"wanted 2 naming --job-id and {first}:\n{out}")
        if took > 5:
            fail(f"the collision was refused only after {took:.1f} s")
        seen = len(step_events(first))
        wait_until(lambda: len(step_events(first)) >= seen + 3, 120,
                   "the first job to go on after the refusal")
        if job.proc.poll() is not None:
            fail(f"the first job ended:\n{job.output()}")
        job.kill_all()
    print(f"ok: a second job under a live job's id refused in {took:.1f} s (exit 2); the first "
          "went on")


class StandIn(http.server.BaseHTTPRequestHandler):
    """Answers every request like a broken proxy would: `mode` says how."""
    mode = "huge"
    answers = 0

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(length)
        StandIn.answers += 1
        if StandIn.mode in ("huge", "stream"):
            # "stream": no length, the body ends when the connection closes (HTTP/1.0 style)
            size = 50_000_000
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            if StandIn.mode == "huge":
                self.send_header("Content-Length", str(size))
            else:
                self.send_header("Connection", "close")
            self.end_headers()
            chunk = b"[" * (1 << 20)
            try:
                for _ in range(size // len(chunk)):
                    self.wfile.write(chunk)
            except (BrokenPipeError, ConnectionResetError):
                pass
        else:
            body = b"<html>not etcd</html>"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def log_message(self, *args):
        pass


def peak_rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def bad_answers(tmp):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    timeout_ms = 4000
    try:
        for mode, words in (("huge", r"50000000 bytes"), ("stream", r"more than 4 MiB"),
                            ("garbage", r"not JSON")):
            StandIn.mode = mode
            run_dir = os.path.join(tmp, f"stand-in-{mode}")
            log_path = os.path.join(tmp, f"stand-in-{mode}.log")
            with open(log_path, "w") as log:
                started = time.monotonic()
                proc = subprocess.Popen([TROUPE, "run", "--run-dir", run_dir, "--steps", "10",
                                         "--etcd", url, "--etcd-timeout-ms", str(timeout_ms)]
                                        + BASE, stdout=log, stderr=subprocess.STDOUT)
                peak = 0
                while proc.poll() is None and time.monotonic() - started < timeout_ms / 1000 + 5:
                    peak = max(peak, peak_rss_kib(proc.pid) or 0)
                    time.sleep(0.05)
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                    fail(f"{mode}: the job did not end within --etcd-timeout-ms + 5 s")
                took = time.monotonic() - started
            with open(log_path) as f:
                out = f.read()
            if proc.returncode != 1 or not re.search(words, out) or "answered" not in out:
                fail(f"{mode}: exit {proc.returncode}, wanted 1 saying the endpoint answered "
                     f"({words}):\n{out}")
            if "did not answer" in out:
                fail(f"{mode}: an endpoint that answered is reported as silent:\n{out}")
            if peak > 64 * 1024:
                fail(f"{mode}: the coordinator's resident memory reached {peak // 1024} MiB")
            print(f"ok: an endpoint answering {mode}: exit 1 in {took:.1f} s naming it, peak RSS "
                  f"{peak // 1024} MiB")
    finally:
        server.shutdown()


def launcher_killed(tmp):
    run_dir = os.path.join(tmp, "launcher-killed")
    env, tag = tagged_env()  # every process the job starts inherits the tag
    with Job(BASE + SLOW + ["--steps", "2000", "--coordinators", "2", "--etcd", "local"],
             run_dir=run_dir, env=env) as job:
        wait_until(lambda: len(step_events(run_dir)) >= 3, 180, "3 steps")
        before = [p for p in tagged_pids(tag) if p != job.proc.pid]
        job.extra_pids += before
        os.kill(job.proc.pid, signal.SIGKILL)
        job.proc.wait()
        killed_at = time.monotonic()
        deadline = killed_at + 5
        left = []
        while time.monotonic() < deadline:
            left = [p for p in before if pid_alive(p)]
            if not left:
                break
            time.sleep(0.1)
        if left:
            words = []
            for p in left:
                try:
                    with open(f"/proc/{p}/cmdline", "rb") as f:
                        cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
                    words.append(f"{p}: {cmd[:160]}")
                except OSError:
                    pass
            kill_tagged(tag)
            fail("5 s after the launcher's kill -9, processes of the job remain:\n" +
                 "\n".join(words))
        print(f"ok: launcher killed: all {len(before)} processes of the job gone in "
              f"{time.monotonic() - killed_at:.1f} s")


def test():
    with tempfile.TemporaryDirectory(prefix="troupe-etcd-untrusted-") as tmp:
        bad_answers(tmp)
        if not os.path.exists(ETCD):
            harness.skip(f"{ETCD} is not installed (apt-get install etcd-server)")
            return
        etcd = EtcdCluster(os.path.join(tmp, "etcd"))
        try:
            keys_deleted(tmp, etcd)
            id_collision(tmp, etcd)
        finally:
            etcd.stop()
        launcher_killed(tmp)


if __name__ == "__main__":
    harness.main(test)
