"""Standby coordinators over TLS to etcd: `troupe run --coordinators 2 --etcd https://...` with
--etcd-cacert, --etcd-cert and --etcd-key, against an etcd of the test's own that serves https
only and requires client certificates (etcd --client-cert-auth). Every coordinator the launcher
starts must speak TLS to etcd with the job's certificates, the standby included: a standby that
spoke plain http, or lacked the client certificate, could never take over.

(1) kill -9 of the leader as step 10 begins (--fault kill:coordinator:step=10): exit 0, two
    `leader` events with increasing epochs (the second from the other coordinator), every step
    committed once with the loss of an undisturbed run, the same final parameters, the workers
    keep their processes, the job's keys are in etcd and nobody leads after the job.
(2) the same launcher given a CA that did not sign etcd's certificate: exit 2 within 30 s with a
    message naming --etcd-cacert, no leader event, and no coordinator, agent or worker process
    left behind. Exit 2 whether a coordinator gives up before it publishes its address (the
    launcher is still waiting for the addresses) or after (the launcher supervises).
Skipped (exit 77) when etcd (etcd-server, etcd-client) or openssl is not installed."""

import glob
import json
import os
import shutil
import signal
import tempfile
import time

from harness import (SMALL_MODEL, Job, checkpoint_param_diff, fail, main, relative_difference,
                     run_ok, skip, step_losses, wait_until)
from procfs import tagged_env, tagged_pids
from etcd_members import ETCD, ETCDCTL, EtcdCluster
from etcd_leader_test import make_tls

STEPS = 16
KILL_STEP = 10
BASE = SMALL_MODEL + ["--steps", str(STEPS), "--checkpoint-every", "5", "--metrics-port", "0",
                      "--step-timeout-ms", "20000"]
JOB_ID = "tls-standby"
WRONG_CA_DEADLINE_S = 30


def of(events, name):
    return [e for e in events if e.get("event") == name]


def leader_pid(event):
    """The pid in a leader's id (HOST:PID)."""
    return int(event["id"].rsplit(":", 1)[1])


def ha_args(etcd, tls, cacert):
    return ["--coordinators", "2", "--etcd", etcd.url, "--job-id", JOB_ID,
            "--etcd-cacert", cacert, "--etcd-cert", tls["client.crt"],
            "--etcd-key", tls["client.key"]]


def kill_tagged(tag):
    """SIGKILLs what is left of a job (only processes this test started carry its tag)."""
    for pid in tagged_pids(tag):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def coordinator_pids(run_dir):
    """The coordinators that published an address (RUN_DIR/coordinators/PID.addr)."""
    pids = []
    for path in glob.glob(os.path.join(run_dir, "coordinators", "*.addr")):
        name = os.path.basename(path)[:-len(".addr")]
        if name.isdigit():
            pids.append(int(name))
    return sorted(pids)


def check_exact(name, events, reference):
    """Every step committed, each with the undisturbed run's loss; a step committed twice only
    when it is redone right after a takeover, with the same loss."""
    ref = step_losses(reference)
    seen = {}
    last = 0
    takeover = False
    for e in events:
        if e.get("event") == "leader":
            takeover = True
        if e.get("event") != "step":
            continue
        step, loss = e["step"], e["loss"]
        if step in seen:
            if not (takeover and step == last) or seen[step] != loss:
                fail(f"{name}: step {step} committed again ({seen[step]}, then {loss}) "
                     "without a takeover between")
        elif step != last + 1:
            fail(f"{name}: step {step} committed after step {last}")
        if relative_difference(loss, ref[step]) > 1e-4:
            fail(f"{name}: step {step} loss {loss} differs from the undisturbed {ref[step]}")
        seen[step] = loss
        last = step
        takeover = False
    if sorted(seen) != list(range(1, STEPS + 1)):
        fail(f"{name}: committed steps {sorted(seen)}, expected 1..{STEPS}")


def leader_killed(tmp, etcd, tls, ref_dir, reference):
    name = "TLS: leader killed at step 10"
    run_dir = os.path.join(tmp, "killed")
    env, tag = tagged_env()
    try:
        with Job(BASE + ha_args(etcd, tls, tls["ca.crt"]) +
                 ["--fault", f"kill:coordinator:step={KILL_STEP}"],
                 run_dir=run_dir, env=env) as job:
            code = job.wait(120)
            events, output = job.events(), job.output()
            if code != 0:
                fail(f"{name}: exit {code}:\n{output}")
            job.assert_no_process_left()
        wait_until(lambda: not tagged_pids(tag), 30, f"{name}: every process of the job to exit")
    finally:
        kill_tagged(tag)

    leaders = of(events, "leader")
    epochs = [e["epoch"] for e in leaders]
    # Two leaderships; a third is the survivor leading again after a lapse of its own lease.
    if len(leaders) < 2 or epochs != sorted(set(epochs)) or epochs[0] < 1:
        fail(f"{name}: expected two leader events or more with increasing epochs, got {leaders}")
    if leaders[0]["id"] == leaders[1]["id"]:
        fail(f"{name}: the same coordinator led twice; the standby never took over: {leaders}")
    faults = of(events, "fault")
    if len(faults) != 1 or faults[0].get("target") != "coordinator" or \
            faults[0].get("pids") != [leader_pid(leaders[0])]:
        fail(f"{name}: expected one kill of the first leader {leaders[0]['id']}, got {faults}")
    if events.index(leaders[1]) < events.index(faults[0]):
        fail(f"{name}: the second leader was elected before the kill: {events}")
    # The workers that trained under the first leader are the ones that finished the job.
    first = {}
    for e in of(events, "rank_joined"):
        if first.setdefault(e["member"], e["pid"]) != e["pid"]:
            fail(f"{name}: member {e['member']} came back as process {e['pid']} "
                 f"(was {first[e['member']]})")
    if of(events, "rank_lost"):
        fail(f"{name}: a member was lost: {of(events, 'rank_lost')}")
    check_exact(name, events, reference)
    diff = checkpoint_param_diff(ref_dir, run_dir)
    if diff > 1e-4:
        fail(f"{name}: final parameters differ from the undisturbed run by {diff:.2e} relative")
    # Both coordinators wrote through TLS: the job's keys are there, and nobody leads now.
    config = etcd.get(f"/troupe/{JOB_ID}/config")
    if not config or json.loads(config).get("etcd", {}).get("endpoints") != etcd.url:
        fail(f"{name}: /troupe/{JOB_ID}/config in etcd is not the job's: {config!r}")
    if etcd.get(f"/troupe/{JOB_ID}/leader") != "":
        fail(f"{name}: the leader key outlived the job")
    after = next((e for e in events[events.index(faults[0]):] if e.get("event") == "step"), None)
    print(f"ok: {name}: epochs {epochs}, the standby took over "
          f"({after['unix_ms'] - faults[0]['unix_ms']} ms from the kill to a commit), "
          f"{STEPS} steps exact, workers kept", flush=True)


def wrong_ca(tmp, etcd, tls):
    name = "TLS: a CA that did not sign etcd's certificate"
    run_dir = os.path.join(tmp, "wrong-ca")
    env, tag = tagged_env()
    try:
        started = time.monotonic()
        with Job(BASE + ha_args(etcd, tls, tls["other.crt"]), run_dir=run_dir, env=env) as job:
            # Job.wait fails (and kills the job) when it outlives the deadline.
            code = job.wait(WRONG_CA_DEADLINE_S)
            took = time.monotonic() - started
            events, output = job.events(), job.output()
            coordinators = coordinator_pids(run_dir)
            job.extra_pids += coordinators
            if code != 2:
                fail(f"{name}: exit {code}, not 2:\n{output}")
            if "--etcd-cacert" not in output:
                fail(f"{name}: the message does not name --etcd-cacert:\n{output}")
            if of(events, "leader"):
                fail(f"{name}: a coordinator that could not verify etcd led: "
                     f"{of(events, 'leader')}")
            # The launcher has exited: nothing it started may still run (coordinators, agents,
            # workers: every process carrying the job's tag). A coordinator may fail before or
            # after it published its address; the launcher must exit 2 either way.
            wait_until(lambda: not tagged_pids(tag), 10,
                       f"{name}: the job's processes to exit after the launcher "
                       f"(coordinators {coordinators})")
            job.assert_no_process_left(timeout=5)
    finally:
        kill_tagged(tag)
    print(f"ok: {name}: exit 2 in {took:.1f} s naming --etcd-cacert, no process left "
          f"({len(coordinators)} of 2 coordinators had published an address)", flush=True)


def test():
    if not os.access(ETCD, os.X_OK) or not os.access(ETCDCTL, os.X_OK):
        skip("etcd is not installed (/usr/bin/etcd, /usr/bin/etcdctl: apt-get install "
             "etcd-server etcd-client)")
        return
    if shutil.which("openssl") is None:
        skip("openssl is not installed: no certificates for a TLS etcd")
        return
    with tempfile.TemporaryDirectory(prefix="troupe-etcd-tls-") as tmp:
        ref_dir = os.path.join(tmp, "reference")
        reference = run_ok("undisturbed", BASE, ref_dir, timeout=120)
        tls = make_tls(tmp)
        etcd = EtcdCluster(os.path.join(tmp, "etcd"), 1, tls)
        try:
            leader_killed(tmp, etcd, tls, ref_dir, reference)
            wrong_ca(tmp, etcd, tls)
        finally:
            etcd.stop()


if __name__ == "__main__":
    main(test)
