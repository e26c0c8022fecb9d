"""The metrics endpoint answers during a run, passes `promtool check metrics`, and a real
Prometheus server ingests the job's series. Then Ctrl-C (SIGINT) stops the whole job
cleanly: exit code 130, an "interrupted" event, and no process left behind."""

import os
import shutil
import signal
import subprocess
import sys
import urllib.request

from harness import SMALL_MODEL, Job, fail, free_port, main, skip, wait_until

HARNESS = os.path.join(os.path.dirname(__file__), "..", "tools", "prometheus_harness.py")
SERIES = ["troupe_steps_total", "troupe_loss", "troupe_tokens_per_second", "troupe_world_size",
          "troupe_generation", "troupe_step_seconds_bucket"]


def test():
    port = free_port()
    args = SMALL_MODEL + ["--world", "2", "--steps", "100000", "--metrics-port", str(port),
                          "--checkpoint-every", "0"]
    with Job(args) as job:
        wait_until(lambda: any(e.get("event") == "step" and e["step"] >= 3 for e in job.events()), 120,
                   "the job to commit 3 steps")
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        for name in SERIES:
            if name.encode() not in body:
                fail(f"{name} missing from /metrics:\n{body.decode()}")
        # Without the tools (the Debian package 'prometheus') these parts are Skipped, not passed.
        if shutil.which("promtool"):
            check = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True)
            if check.returncode != 0:
                fail(f"promtool check metrics failed:\n{check.stdout.decode()}{check.stderr.decode()}")
        else:
            skip("promtool not found: the exposition is not checked")
        if os.environ.get("PROMETHEUS") or shutil.which("prometheus") \
                or os.access("/usr/bin/prometheus", os.X_OK):  # where the harness looks
            scrape = subprocess.run([sys.executable, HARNESS, "--target", f"127.0.0.1:{port}", "--timeout", "90"]
                                    + [a for s in SERIES for a in ("--expect", s)], capture_output=True, text=True)
            print(scrape.stdout, scrape.stderr)
            if scrape.returncode != 0:
                fail("Prometheus did not ingest the job's series")
        else:
            skip("prometheus not found: no server scrapes the job")

        pids = job.all_pids()
        if len(pids) < 4:
            fail(f"expected the launcher, an agent and 2 ranks, saw pids {pids}")
        job.proc.send_signal(signal.SIGINT)
        code = job.wait(60)
        if code != 130:
            fail(f"Ctrl-C should end the job with exit code 130, got {code}:\n{job.output()}")
        if not any(e.get("event") == "interrupted" for e in job.events()):
            fail("no 'interrupted' event")
        job.assert_no_process_left()
        print(f"stopped cleanly; processes {pids} all gone")


if __name__ == "__main__":
    main(test)
