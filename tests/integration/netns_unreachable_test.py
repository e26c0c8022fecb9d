"""Issue 25, test 5: a node that advertises an address its peers cannot reach. The job fails
within 2 x the step timeout of the first failed connect, with exit code 1 and a message that
names the address and why, instead of retrying every generation until its recoveries run out.
Twice, over namespaces (chaos/netns/cluster.py): an address with no route to it from the other
node (`--advertise`, connect fails at once: network unreachable), and an interface whose
subnet the other node routes through a gateway that never answers (`--iface`, no route to
host after address resolution gives up, seconds later).

Before the jobs, the explicit choices an agent refuses with exit 2 and a message that names
them, before it starts anything: an interface that does not exist, is down or has no IPv4
address, an address this host does not hold, the wildcard address, both options at once, and
the same through the environment (TROUPE_IFACE, GLOO_SOCKET_IFNAME with a list).
Needs root; Skipped (exit 77) where namespaces cannot be made."""

import os
import sys
import tempfile
import time

from harness import SMALL_MODEL, TROUPE, fail, main

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "chaos", "netns"))
import cluster as netns  # noqa: E402
from troupe_job import JobError, TroupeJob  # noqa: E402

STEP_TIMEOUT_MS = 8000
ARGS = SMALL_MODEL + ["--world", "4", "--nodes", "2", "--steps", "20", "--metrics-port", "0",
                      "--step-timeout-ms", str(STEP_TIMEOUT_MS)]
# Below the cluster's subnets (10.200.0.0/13): of a pair, gloo's higher address connects, so
# the other node must connect to these.
UNROUTED = "10.199.0.1"
SIDE_NET, SIDE_ADDRESS, SIDE_DOWN = "10.199.1.0/24", "10.199.1.1", "10.199.2.1"


def refusals(c, job):
    """An agent refuses what cannot be honoured, with exit 2, before it connects."""
    token = job.token_path
    base = [TROUPE, "agent", "--coordinator", job.endpoint, "--join-token", token]
    cases = [
        (["--iface", "nosuch0"], {}, "no interface of that name"),
        (["--iface", "side1"], {}, "is down"),
        (["--iface", "side2"], {}, "has no IPv4 address"),
        (["--advertise", "10.1.2.3"], {}, "not an address of this host"),
        (["--advertise", "0.0.0.0"], {}, "wildcard"),
        (["--iface", "eth0", "--advertise", c.address("n2")], {}, "not both"),
        ([], {"TROUPE_IFACE": "nosuch0"}, "TROUPE_IFACE=nosuch0: no interface"),
        ([], {"GLOO_SOCKET_IFNAME": "eth0,eth1"}, "names several interfaces"),
    ]
    for extra, env, expected in cases:
        started = time.monotonic()
        r = c.run("n2", ["env"] + [f"{k}={v}" for k, v in env.items()] + base + extra, check=False,
                  timeout=30)
        took = time.monotonic() - started
        said = (r.stderr + r.stdout).strip()
        if r.returncode != 2 or expected not in said:
            fail(f"agent {extra} {env}: expected exit 2 saying '{expected}', got {r.returncode}: {said}")
        if took > 5:
            fail(f"agent {extra} {env}: refused only after {took:.1f}s")
        print(f"refused {extra or env}: {said}", flush=True)
    if any(e.get("event") == "agent_joined" for e in job.events()):
        fail("a refused agent joined the job")


def failing_job(c, tmp, name, agent_args, address, why):
    run_dir = os.path.join(tmp, name)
    job = TroupeJob(c, TROUPE, run_dir, ARGS, agents={})
    job.start_coordinator()
    if name == "advertise":
        refusals(c, job)
    started = time.time()
    job.start_agent("n1")
    n2_log = os.path.join(run_dir, "agent-n2.log")
    with open(n2_log, "w") as out:  # n2's agent with the address that n1 cannot reach
        c.popen("n2", [TROUPE, "agent", "--coordinator", job.endpoint, "--join-token",
                       job.token_path] + agent_args, stdout=out, stderr=out)
    try:
        code = job.wait(10 * STEP_TIMEOUT_MS / 1000)
    except JobError as e:
        fail(f"{name}: the job did not end: {e}")
    ended = time.time()
    log = job.log("coord")
    events = job.events()
    if code != 1:
        fail(f"{name}: expected exit 1, got {code}:\n{log}\n" + job.log("agent-n1")[-3000:])
    failed = [e for e in events if e.get("event") == "connect_failed"]
    if not failed:
        fail(f"{name}: no connect_failed event:\n{log}")
    first = failed[0]["unix_ms"] / 1000.0
    after_first = ended - first
    message = next((e["message"] for e in events if e.get("event") == "job_failed"), "")
    print(f"{name}: exit {code} {ended - started:.1f}s after the agents started, {after_first:.1f}s "
          f"after the first failed connect ({len(failed)} failed generations): {message}", flush=True)
    if after_first > 2 * STEP_TIMEOUT_MS / 1000:
        fail(f"{name}: the job ended {after_first:.1f}s after the first failed connect, more than "
             f"2 x the step timeout ({2 * STEP_TIMEOUT_MS / 1000:.0f}s)")
    for text, where in ((message, "the job_failed event"), (log, "the coordinator's output")):
        if address not in text or why not in text:
            fail(f"{name}: {where} does not name {address} and '{why}':\n{text}")
    if failed[0]["address"] != address or failed[0]["cause"] != "unreachable":
        fail(f"{name}: the first connect_failed event says {failed[0]}")
    deadline = time.monotonic() + 30
    while c.pids_in_namespaces() and time.monotonic() < deadline:
        time.sleep(0.05)
    if c.pids_in_namespaces():
        fail(f"{name}: processes left in the namespaces: {c.pids_in_namespaces()}")


def test():
    with tempfile.TemporaryDirectory(prefix="troupe-netns-unreachable-") as tmp, \
            netns.Cluster(nodes=2) as c:
        # n2 holds UNROUTED on its loopback, and a side interface pair: side0 up with
        # SIDE_ADDRESS, side1 down with SIDE_DOWN, side2 up without an IPv4 address.
        c.run("n2", ["ip", "addr", "add", f"{UNROUTED}/32", "dev", "lo"])
        c.run("n2", ["ip", "link", "add", "side0", "type", "veth", "peer", "name", "side2"])
        c.run("n2", ["ip", "link", "add", "side1", "type", "veth", "peer", "name", "side3"])
        c.run("n2", ["ip", "addr", "add", f"{SIDE_ADDRESS}/24", "dev", "side0"])
        c.run("n2", ["ip", "addr", "add", f"{SIDE_DOWN}/24", "dev", "side1"])
        c.run("n2", ["ip", "link", "set", "side0", "up"])
        c.run("n2", ["ip", "link", "set", "side2", "up"])
        # n1 sends SIDE_NET to a gateway on its subnet that nobody holds: no answer to ARP.
        gateway = c.address("n1").rsplit(".", 1)[0] + ".250"
        c.run("n1", ["ip", "route", "add", SIDE_NET, "via", gateway])
        failing_job(c, tmp, "advertise", ["--advertise", UNROUTED], UNROUTED, "Network is unreachable")
        failing_job(c, tmp, "iface", ["--iface", "side0"], SIDE_ADDRESS, "No route to host")


if __name__ == "__main__":
    netns.require_netns()  # exit 77 (Skipped) where namespaces cannot be made
    main(test)
