"""Goodput and MFU are true while a healthy job trains, not only at its end (issue 35).

They used to be set only by the "goodput" event, which the coordinator writes when a
generation forms and when the job ends: through a whole healthy run troupe_goodput_ratio and
troupe_mfu read 0, and `troupe status` showed 0 % goodput. A 2-rank job is scraped once it has
committed step 50 (still training: the job has many more steps to go) and must show
troupe_goodput_ratio, troupe_mfu_ratio and the deprecated troupe_mfu > 0, the same goodput in
the status document (`troupe status RUN_DIR --json`), and troupe_build_info and
troupe_job_info with their labels. When prometheus is installed, a real Prometheus server
scrapes the running job and must see the same series (the values > 0, the info series with
their labels). The job is then stopped with Ctrl-C, and no process is left behind."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request

from harness import SMALL_MODEL, TROUPE, Job, fail, free_port, main, skip, wait_until

HARNESS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools",
                       "prometheus_harness.py")
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def samples(body):
    """[(name, {label: value}, value)] of an exposition text."""
    out = []
    for line in body.splitlines():
        m = SAMPLE.match(line)
        if m:
            labels = {k: v.replace('\\"', '"').replace("\\\\", "\\")
                      for k, v in LABEL.findall(m.group(2) or "")}
            out.append((m.group(1), labels, float(m.group(3))))
    return out


def value(parsed, name):
    found = [v for n, labels, v in parsed if n == name and not labels]
    if len(found) != 1:
        fail(f"{name}: expected one unlabelled sample, found {len(found)}")
    return found[0]


def have_prometheus():
    return bool(os.environ.get("PROMETHEUS") or shutil.which("prometheus")
                or os.access("/usr/bin/prometheus", os.X_OK))  # where the harness looks


def check_info(parsed, run_dir):
    build = [labels for n, labels, v in parsed if n == "troupe_build_info" and v == 1]
    if len(build) != 1:
        fail(f"expected one troupe_build_info 1, found {build}")
    version = subprocess.run([TROUPE, "--version"], capture_output=True, text=True).stdout.split()
    if build[0].get("version") != version[-1] or not build[0].get("compiler"):
        fail(f"troupe_build_info labels {build[0]}: want version {version[-1]} and a compiler")
    job = [labels for n, labels, v in parsed if n == "troupe_job_info" and v == 1]
    if len(job) != 1:
        fail(f"expected one troupe_job_info 1, found {job}")
    with open(os.path.join(run_dir, "config.json")) as f:
        job_id = json.load(f)["job_id"]  # a new job's own id (the run directory's name + hex)
    want = {"job_id": job_id, "run_dir": os.path.abspath(run_dir),
            "layout": "dp2xtp1xpp1"}
    for key, expected in want.items():
        if job[0].get(key) != expected:
            fail(f"troupe_job_info {key}={job[0].get(key)!r}, expected {expected!r}: {job[0]}")
    if "n_layer=2" not in job[0].get("model", "") or "d_model=32" not in job[0]["model"]:
        fail(f"troupe_job_info model={job[0].get('model')!r} does not name the model")
    print(f"troupe_build_info {build[0]}; troupe_job_info {job[0]}", flush=True)


def test():
    port = free_port()
    # Steps take milliseconds here: the job has far more than it will train before the test
    # stops it, so step 50 is seen while it trains.
    args = SMALL_MODEL + ["--world", "2", "--steps", "100000", "--metrics-port", str(port),
                          "--checkpoint-every", "0"]
    url = f"http://127.0.0.1:{port}/metrics"
    with Job(args) as job:
        def at_step_50():
            try:
                body = urllib.request.urlopen(url, timeout=5).read().decode()
            except OSError:
                return None  # not listening yet
            parsed = samples(body)
            steps = [v for n, labels, v in parsed if n == "troupe_step"]
            return parsed if steps and steps[0] >= 50 else None
        try:
            parsed = wait_until(at_step_50, 120, "troupe_step >= 50 in a scrape")
        except SystemExit:
            print(f"the job's output:\n{job.output()}", flush=True)
            raise
        step, state = value(parsed, "troupe_step"), value(parsed, "troupe_job_state")
        if state != 1:
            fail(f"at step {step} the job is in state {state}, not training (1)")
        goodput = value(parsed, "troupe_goodput_ratio")
        print(f"step {step:.0f}: troupe_goodput_ratio {goodput}", flush=True)
        if not 0 < goodput < 1:
            fail(f"troupe_goodput_ratio is {goodput} at step {step} of a healthy run")
        mfu = value(parsed, "troupe_mfu_ratio")
        print(f"step {step:.0f}: troupe_mfu_ratio {mfu}", flush=True)
        if not 0 < mfu < 1:
            fail(f"troupe_mfu_ratio is {mfu} at step {step} of a healthy run")
        if value(parsed, "troupe_mfu") != mfu:
            fail("troupe_mfu (deprecated) differs from troupe_mfu_ratio in the same scrape")
        check_info(parsed, job.run_dir)

        status = subprocess.run([TROUPE, "status", job.run_dir, "--json"], capture_output=True,
                                text=True, timeout=30)
        if status.returncode != 0:
            fail(f"troupe status --json exited {status.returncode}:\n{status.stdout}"
                 f"{status.stderr}")
        doc = json.loads(status.stdout)
        if doc.get("state") != "training":
            fail(f"the status document says {doc.get('state')!r} mid-run")
        g = doc.get("goodput") or {}
        if not 0 < g.get("goodput", 0) < 1 or not 0 < g.get("mfu", 0) < 1 \
                or g.get("step", 0) < 50:
            fail(f"the status document's goodput mid-run: {g}")
        print(f"troupe status: goodput {g['goodput']}, MFU {g['mfu']} at step {g['step']}",
              flush=True)
        text = subprocess.run([TROUPE, "status", job.run_dir], capture_output=True, text=True,
                              timeout=30).stdout
        if not re.search(r"goodput (?!0\.0%)\d+\.\d%", text):
            fail(f"troupe status shows no goodput above 0 mid-run:\n{text}")

        if have_prometheus():
            expects = ["troupe_goodput_ratio > 0", "troupe_mfu_ratio > 0",
                       'troupe_build_info{version!="",compiler!=""} == 1',
                       'troupe_job_info{job_id=~"run-[0-9a-f]{8}",layout="dp2xtp1xpp1"} == 1']
            scrape = subprocess.run([sys.executable, HARNESS, "--target", f"127.0.0.1:{port}",
                                     "--timeout", "90"] + [a for q in expects
                                                           for a in ("--expect", q)],
                                    capture_output=True, text=True)
            print(scrape.stdout, scrape.stderr, flush=True)
            if scrape.returncode != 0:
                fail("a real Prometheus did not see goodput, MFU and the info series")
        else:
            skip("prometheus not found: no server scrapes the job")

        job.proc.send_signal(signal.SIGINT)
        code = job.wait(60)
        if code != 130:
            fail(f"Ctrl-C should end the job with exit code 130, got {code}:\n{job.output()}")
        job.assert_no_process_left()


if __name__ == "__main__":
    main(test)
