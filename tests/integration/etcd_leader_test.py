"""A job's coordinator leads through etcd (--etcd): it is elected before it supervises, logs a
`leader` event with its epoch, and mirrors the job's config and state under /troupe/<job>/.

(a) --etcd local: the job starts an etcd member of its own and stops it when the job ends.
(b) an etcd started here over plain http: /troupe/<job>/state and /config read back with
    etcdctl after the job, the committed step the job's last checkpoint; a leader whose key
    is deleted while the job runs ends it with exit 1 naming etcd.
(c) the same over TLS with client certificates; a CA that did not sign etcd's certificate is
    exit 2 with a message naming the CA.
Skipped when /usr/bin/etcd (etcd-server) or openssl is not installed."""

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

from harness import SMALL_MODEL, Job, fail, main, skip, wait_until
from procfs import pids_with_args
from etcd_members import ETCD, ETCDCTL, EtcdCluster

JOB_ARGS = SMALL_MODEL + ["--steps", "6", "--checkpoint-every", "3", "--metrics-port", "0"]


def Etcd(root, tls=None):
    """One etcd member of the test's own (etcd_members.EtcdCluster)."""
    return EtcdCluster(root, 1, tls)


def make_tls(root):
    script = """set -e
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out $1; }
key ca.key; key other.key; key server.key; key client.key
openssl req -x509 -new -key ca.key -out ca.crt -days 2 -subj /CN=troupe-test-ca
openssl req -x509 -new -key other.key -out other.crt -days 2 -subj /CN=other-ca
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\nextendedKeyUsage=serverAuth,clientAuth\\n' > server.ext
printf 'extendedKeyUsage=clientAuth\\n' > client.ext
openssl req -new -key server.key -out server.csr -subj /CN=localhost
openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 2 -extfile server.ext
openssl req -new -key client.key -out client.csr -subj /CN=troupe-client
openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out client.crt -days 2 -extfile client.ext
"""
    p = subprocess.run(["bash", "-c", script], cwd=root, capture_output=True, text=True,
                       timeout=60)
    if p.returncode != 0:
        fail(f"openssl could not make the test certificates:\n{p.stdout}{p.stderr}")
    return {n: os.path.join(root, n) for n in
            ("ca.crt", "other.crt", "server.crt", "server.key", "client.crt", "client.key")}


def leader_event(events, output):
    leaders = [e for e in events if e.get("event") == "leader"]
    if len(leaders) != 1:
        fail(f"expected one leader event, got {leaders}:\n{output}")
    e = leaders[0]
    if not (isinstance(e.get("epoch"), int) and e["epoch"] > 0 and e.get("id")
            and e.get("address")):
        fail(f"the leader event lacks an epoch > 0, an id or an address: {e}")
    return e


def run_job(args, run_dir=None, timeout=180):
    with Job(JOB_ARGS + args, run_dir=run_dir) as job:
        code = job.wait(timeout)
        events, output = job.events(), job.output()
    return code, events, output


def local_etcd():
    """(a) --etcd local: the job's own etcd, gone when the job is."""
    with tempfile.TemporaryDirectory(prefix="troupe-etcd-") as tmp:
        run_dir = os.path.join(tmp, "run")
        code, events, output = run_job(["--etcd", "local"], run_dir=run_dir)
        if code != 0:
            fail(f"--etcd local exited {code}:\n{output}")
        leader_event(events, output)
        if not os.path.isdir(os.path.join(run_dir, "etcd")):
            fail("--etcd local left no data directory RUN_DIR/etcd")
        # Its etcd was a child of the job: any etcd still running on that data dir is a leak.
        data_dir = os.path.join(run_dir, "etcd")
        for pid in pids_with_args(data_dir):
            fail(f"the job's etcd (pid {pid}) still runs after the job ended")
    print("ok: --etcd local: elected, exit 0, its etcd stopped", flush=True)


def state_of(etcd, job):
    state = etcd.get(f"/troupe/{job}/state")
    config = etcd.get(f"/troupe/{job}/config")
    if not state or not config:
        fail(f"/troupe/{job}/state or /config is missing: {state!r} {config!r}")
    return json.loads(state), json.loads(config)


def check_mirror(etcd, job, events):
    state, config = state_of(etcd, job)
    checkpoints = [e["step"] for e in events if e.get("event") == "checkpoint"]
    if not checkpoints:
        fail("the job committed no checkpoint")
    if state.get("committed_step") != checkpoints[-1] or \
            state.get("checkpoint_step") != checkpoints[-1]:
        fail(f"/troupe/{job}/state {state} does not name the last checkpoint {checkpoints[-1]}")
    if state.get("world") != 2 or state.get("generation", 0) < 1:
        fail(f"/troupe/{job}/state has the wrong world or generation: {state}")
    if config.get("steps") != 6 or config.get("etcd", {}).get("endpoints") != etcd.url:
        fail(f"/troupe/{job}/config is not the job's config: {config}")


def lost_leadership(etcd):
    """A leader whose key is deleted under it pauses and, leading again under a new epoch, goes
    on; a leader that cannot reach etcd for --etcd-timeout-ms ends the job: exit 1 naming etcd,
    nothing left."""
    timeout_ms = 6000
    args = SMALL_MODEL + ["--steps", "1000000", "--checkpoint-every", "200", "--metrics-port",
                          "0", "--etcd", etcd.url, "--job-id", "lost-job", "--etcd-timeout-ms",
                          str(timeout_ms)]
    with Job(args) as job:
        def running():
            if job.proc.poll() is not None:
                fail(f"the job ended early:\n{job.output()}")
            return True

        def checkpointed():
            running()
            state = etcd.get("/troupe/lost-job/state")
            return state and json.loads(state).get("checkpoint_step", 0) > 0
        wait_until(checkpointed, 120, "the job's first checkpoint in etcd")
        if etcd.ctl("del", "/troupe/lost-job/leader").returncode != 0:
            fail("etcdctl could not delete the leader key")

        def leads_again():
            running()
            leaders = [e for e in job.events() if e.get("event") == "leader"]
            return len(leaders) >= 2 and leaders
        leaders = wait_until(leads_again, 30, "the coordinator to lead again")
        if leaders[1]["epoch"] <= leaders[0]["epoch"] or leaders[1]["id"] != leaders[0]["id"]:
            fail(f"expected the same coordinator under a newer epoch: {leaders}")
        at = len(job.events())
        wait_until(lambda: running() and any(e.get("event") == "step" for e in job.events()[at:]),
                   60, "a step committed after leading again")
        # etcd gone (stopped): the lease lapses, the job pauses, and after --etcd-timeout-ms ends.
        etcd.proc.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            code = job.wait(60)
        finally:
            etcd.proc.send_signal(signal.SIGCONT)
        took = time.monotonic() - stopped
        output = job.output()
        if code != 1 or "etcd" not in output or "--etcd-timeout-ms" not in output:
            fail(f"etcd out of reach: exit {code}, expected 1 naming etcd:\n{output}")
        if took < timeout_ms / 1000:
            fail(f"the job ended {took:.1f} s after etcd stopped, before --etcd-timeout-ms")
        job.assert_no_process_left()
    print(f"ok: a deleted leader key costs a pause; etcd out of reach ends the job after "
          f"{took:.1f} s, exit 1", flush=True)


def plain_etcd():
    """(b) an etcd of the test's own over http."""
    with tempfile.TemporaryDirectory(prefix="troupe-etcd-") as tmp:
        etcd = Etcd(tmp)
        try:
            code, events, output = run_job(["--etcd", etcd.url, "--job-id", "plain-job"])
            if code != 0:
                fail(f"--etcd {etcd.url} exited {code}:\n{output}")
            leader_event(events, output)
            check_mirror(etcd, "plain-job", events)
            # The coordinator stepped down as the job ended: nobody leads.
            if etcd.get("/troupe/plain-job/leader") != "":
                fail("the leader key outlived the job")
            lost_leadership(etcd)
        finally:
            etcd.stop()
    print("ok: --etcd http: leader event, state and config mirrored", flush=True)


def tls_etcd():
    """(c) TLS with client certificates, and a CA that does not verify etcd."""
    with tempfile.TemporaryDirectory(prefix="troupe-etcd-") as tmp:
        tls = make_tls(tmp)
        etcd = Etcd(tmp, tls=tls)
        try:
            certs = ["--etcd-cert", tls["client.crt"], "--etcd-key", tls["client.key"]]
            code, events, output = run_job(["--etcd", etcd.url, "--job-id", "tls-job",
                                            "--etcd-cacert", tls["ca.crt"]] + certs)
            if code != 0:
                fail(f"--etcd {etcd.url} over TLS exited {code}:\n{output}")
            leader_event(events, output)
            check_mirror(etcd, "tls-job", events)
            start = time.monotonic()
            code, events, output = run_job(["--etcd", etcd.url, "--job-id", "tls-job",
                                            "--etcd-cacert", tls["other.crt"]] + certs,
                                           timeout=60)
            if code != 2:
                fail(f"a CA that did not sign etcd's certificate: exit {code}, not 2:\n{output}")
            if "--etcd-cacert" not in output or "CA" not in output:
                fail(f"the TLS failure does not name the CA (--etcd-cacert):\n{output}")
            if any(e.get("event") == "leader" for e in events):
                fail("a coordinator that could not reach etcd logged a leader event")
            if time.monotonic() - start > 30:
                fail("a TLS failure took more than 30 s to be reported")
        finally:
            etcd.stop()
    print("ok: --etcd https: client certificates work; a wrong CA is exit 2 naming it",
          flush=True)


def test():
    if not os.access(ETCD, os.X_OK) or not os.access(ETCDCTL, os.X_OK):
        skip("etcd is not installed (/usr/bin/etcd, /usr/bin/etcdctl: apt-get install "
             "etcd-server etcd-client)")
        return
    local_etcd()
    plain_etcd()
    if shutil.which("openssl") is None:
        skip("openssl is not installed: the TLS part did not run")
        return
    tls_etcd()


if __name__ == "__main__":
    main(test)
