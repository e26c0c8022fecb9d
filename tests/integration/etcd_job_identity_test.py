#!/usr/bin/env python3
"""Jobs that share an etcd never meet by accident (issue 35):

(a) two jobs started at once with default options (the same run directory name, so once the
    same job id) against one etcd both finish, each under an id of its own that config.json
    keeps;
(b) a job started after another under the same explicit --job-id does not take the earlier
    job's committed step: it trains from step 0 and says the state was not its own;
(c) a job whose id another live job holds is refused at once (exit 2), naming --job-id and the
    other job's run directory;
(d) an ended job's keys are leased: they go by themselves.

Skipped when /usr/bin/etcd (etcd-server) is not installed."""

import json
import os
import subprocess
import tempfile

import harness
from harness import SMALL_MODEL, TROUPE, fail, wait_until
from etcd_members import ETCD, EtcdCluster

ARGS = SMALL_MODEL + ["--checkpoint-every", "5", "--metrics-port", "0"]


def job_id_of(run_dir):
    with open(os.path.join(run_dir, "config.json")) as f:
        return json.load(f)["job_id"]


def steps_of(run_dir):
    return [e["step"] for e in harness.read_events(run_dir) if e.get("event") == "step"]


def two_default_jobs(etcd, tmp):
    dirs = [os.path.join(tmp, side, "latest") for side in ("a", "b")]
    procs = [subprocess.Popen([TROUPE, "run", "--run-dir", d, "--steps", "20", "--etcd", etcd.url,
                               "--etcd-timeout-ms", "20000"] + ARGS,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for d in dirs]
    outputs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            fail("two jobs with default options against one etcd did not finish in 240 s")
        outputs.append(out)
    for p, out in zip(procs, outputs):
        if p.returncode != 0:
            fail(f"a job with default options exited {p.returncode}:\n{out}")
    ids = [job_id_of(d) for d in dirs]
    if ids[0] == ids[1] or not all(i.startswith("latest-") for i in ids):
        fail(f"two jobs in run directories named 'latest' got the ids {ids}")
    print(f"ok: two jobs with default options against one etcd both finished, as {ids}")


def same_explicit_id(etcd, tmp):
    first = os.path.join(tmp, "first")
    code, _, out = harness.run_to_end(["--steps", "25", "--etcd", etcd.url, "--job-id", "shared"]
                                      + ARGS, timeout=240, run_dir=first)
    if code != 0:
        fail(f"the first job under --job-id shared exited {code}:\n{out}")
    state = json.loads(etcd.get("/troupe/shared/state"))
    if state.get("committed_step") != 25 or state.get("ended") != 0:
        fail(f"the first job's state in etcd: {state}")
    second = os.path.join(tmp, "second")
    code, events, out = harness.run_to_end(["--steps", "10", "--etcd", etcd.url, "--job-id",
                                            "shared"] + ARGS, timeout=240, run_dir=second)
    if code != 0:
        fail(f"the second job under --job-id shared exited {code}:\n{out}")
    steps = steps_of(second)
    if steps != list(range(1, 11)):
        fail(f"the second job trained the steps {steps}, not 1..10 (it took the first job's?)")
    if "was used by an earlier job" not in out:
        fail(f"the second job did not say the state in etcd was another job's:\n{out}")
    state = json.loads(etcd.get("/troupe/shared/state"))
    if state.get("committed_step") != 10:
        fail(f"/troupe/shared/state after the second job: {state}")
    print("ok: a job under a used --job-id starts from step 0, not the earlier job's step 25")
    # (d) the ended job's keys carry a lease, so they go by themselves.
    out = etcd.ctl("get", "/troupe/shared/state", "-w", "json")
    kvs = json.loads(out.stdout).get("kvs") or []
    if not kvs or not int(kvs[0].get("lease", 0)):
        fail(f"the ended job's state carries no lease: {out.stdout}")
    print("ok: an ended job's keys are leased")


def live_collision(etcd, tmp):
    running = os.path.join(tmp, "running")
    with harness.Job(["--steps", "3000", "--etcd", etcd.url, "--job-id", "taken"] + ARGS,
                     run_dir=running) as job:
        wait_until(lambda: len(steps_of(running)) >= 2, 120, "the first job's steps")
        p = subprocess.run([TROUPE, "run", "--run-dir", os.path.join(tmp, "intruder"), "--steps",
                            "10", "--etcd", etcd.url, "--job-id", "taken"] + ARGS,
                           capture_output=True, text=True, timeout=60)
        out = p.stdout + p.stderr
        if p.returncode != 2 or "--job-id" not in out or running not in out:
            fail(f"a second job under a live job's id exited {p.returncode}, wanted 2 naming "
                 f"--job-id and {running}:\n{out}")
        job.kill_all()
    print("ok: a job whose id a live job holds is refused at once, naming --job-id")


def test():
    if not os.path.exists(ETCD):
        harness.skip(f"{ETCD} is not installed (apt-get install etcd-server)")
        return
    with tempfile.TemporaryDirectory(prefix="troupe-etcd-id-") as tmp:
        etcd = EtcdCluster(os.path.join(tmp, "etcd"))
        try:
            two_default_jobs(etcd, tmp)
            same_explicit_id(etcd, tmp)
            live_collision(etcd, tmp)
        finally:
            etcd.stop()


if __name__ == "__main__":
    harness.main(test)
