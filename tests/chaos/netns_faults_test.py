"""The netns cluster's partitions, judged by what crosses the links: reachability over TCP
among 3 nodes and the coordinator; a cut node unreachable within a deadline and reachable
again after heal; the coordinator isolated; two halves split; one direction dropped (UDP
counts both ways); a flapping link; and nothing left behind after close, after SIGTERM, and
(through the sweep) after SIGKILL. Needs root; exits 77 (Skipped) where namespaces cannot be
made."""

import os
import signal
import subprocess
import sys
import time

from netns_common import check, fail, measure, netns, step, wait_until

DEADLINE = 3.0   # a fault must show within this many seconds


def reachable_pairs(c, timeout=0.3):
    return {(a, b) for a in c.names for b in c.names if a != b and c.tcp_reachable(a, b, timeout)}


def all_pairs(names):
    return {(a, b) for a in names for b in names if a != b}


def link_is_up(dev):
    with open(f"/sys/class/net/{dev}/flags") as f:
        return int(f.read(), 16) & 1 == 1


def main():
    netns.require_netns()
    forwarder = netns.can_run_forwarder()[0]
    with netns.Cluster(nodes=3, forwarder=["n1"] if forwarder else []) as c:
        check(c.names == ["coord", "n1", "n2", "n3"], f"names: {c.names}")
        addresses = {n: c.address(n) for n in c.names}
        check(len(set(addresses.values())) == 4, f"addresses not distinct: {addresses}")
        for n in c.names:
            r = c.run(n, ["ip", "-o", "-4", "addr", "show", "dev", "eth0"])
            check(addresses[n] in r.stdout, f"{n}'s eth0 lacks {addresses[n]}: {r.stdout}")
            lo = c.run(n, ["ip", "-o", "link", "show", "dev", "lo"]).stdout
            check("UP" in lo, f"loopback of {n} is not up: {lo}")

        step("every namespace reaches every other over TCP")
        wait_until(lambda: reachable_pairs(c, 1.0) == all_pairs(c.names), DEADLINE,
                   "all 12 pairs reachable")

        step("cut n2: TCP to and from it fails within the deadline; heal: it works again")
        cut = c.cut("n2")
        check("down" in cut.mechanism, f"cut mechanism: {cut.mechanism}")
        t0 = time.monotonic()
        wait_until(lambda: not c.tcp_reachable("n1", "n2", 0.3)
                   and not c.tcp_reachable("n2", "coord", 0.3), DEADLINE,
                   "n2 unreachable after the cut")
        print(f"n2 unreachable {time.monotonic() - t0:.2f}s after the cut", flush=True)
        check(c.tcp_reachable("n1", "n3", 1.0) and c.tcp_reachable("n3", "coord", 1.0),
              "the others lost each other when only n2 was cut")
        c.heal("n2")
        check(not cut.active, "heal left the cut active")
        wait_until(lambda: c.tcp_reachable("n1", "n2", 0.5) and c.tcp_reachable("n2", "coord", 0.5),
                   DEADLINE, "n2 reachable after heal")

        step("an established connection stalls across a cut and resumes after heal")
        srv = c.socket("n3")
        srv.bind((c.address("n3"), 0))
        srv.listen(1)
        cli = c.socket("n1")
        cli.settimeout(2)
        cli.connect((c.address("n3"), srv.getsockname()[1]))
        conn, _ = srv.accept()
        conn.settimeout(0.5)
        cli.sendall(b"a")
        check(conn.recv(1) == b"a", "no byte before the cut")
        f = c.cut("n3")
        cli.sendall(b"b")
        try:
            got = conn.recv(1)
            fail(f"a byte crossed a cut link: {got!r}")
        except TimeoutError:
            pass
        f.revert()
        conn.settimeout(DEADLINE + 2)   # TCP retransmits on its own backoff
        check(conn.recv(1) == b"b", "the byte sent during the cut never arrived after heal")
        for s in (cli, conn, srv):
            s.close()

        step("isolate the coordinator: no node reaches it, the nodes still reach each other")
        iso = c.isolate_coordinator()
        wait_until(lambda: not any(c.tcp_reachable(n, "coord", 0.3) for n in c.nodes), DEADLINE,
                   "coordinator unreachable from every node")
        check(c.tcp_reachable("n1", "n2", 1.0) and c.tcp_reachable("n2", "n3", 1.0),
              "nodes lost each other when only the coordinator was isolated")
        iso.revert()
        wait_until(lambda: all(c.tcp_reachable(n, "coord", 0.5) for n in c.nodes), DEADLINE,
                   "coordinator reachable after revert")

        step("split {n1, coord} | {n2, n3}: each side whole, nothing across")
        sp = c.split(["n1", "coord"])
        check("cls_bpf" in sp.mechanism and "mirred" in sp.mechanism,
              f"split mechanism: {sp.mechanism}")
        want = {("n1", "coord"), ("coord", "n1"), ("n2", "n3"), ("n3", "n2")}
        got = wait_until(lambda: (lambda r: r if r == want else None)(reachable_pairs(c)), DEADLINE,
                         f"exactly {sorted(want)} reachable during the split")
        print(f"reachable during split: {sorted(got)}", flush=True)
        check(all(link_is_up(c.links[n].host_dev) for n in c.names), "split took a link down")
        c.heal()
        wait_until(lambda: reachable_pairs(c, 0.5) == all_pairs(c.names), DEADLINE,
                   "all pairs reachable after the split heals")

        step("drop one direction: toward n3 nothing arrives, from n3 everything does")
        d = c.drop("n3", direction="in")
        to_n3 = measure.udp_stream(c, "n2", "n3", count=500, pps=5000, drain=0.3)
        from_n3 = measure.udp_stream(c, "n3", "n2", count=500, pps=5000, drain=0.3)
        print(f"toward n3: {len(to_n3['received'])}/500, from n3: {len(from_n3['received'])}/500",
              flush=True)
        check(len(to_n3["received"]) == 0,
              f"{len(to_n3['received'])} datagrams reached n3 through a drop")
        check(len(from_n3["received"]) == 500, f"only {len(from_n3['received'])}/500 left n3")
        d.revert()
        d = c.drop("n3", direction="out")
        to_n3 = measure.udp_stream(c, "n2", "n3", count=500, pps=5000, drain=0.3)
        from_n3 = measure.udp_stream(c, "n3", "n2", count=500, pps=5000, drain=0.3)
        check(len(to_n3["received"]) == 500 and len(from_n3["received"]) == 0,
              f"drop out: toward n3 {len(to_n3['received'])}/500 (want 500), from n3 "
              f"{len(from_n3['received'])}/500 (want 0)")
        d.revert()
        check(c.tcp_reachable("n2", "n3", 1.0), "n3 unreachable after the drop was reverted")

        step("flap n3: its link goes down and up by itself, and stays up once reverted")
        dev = c.links["n3"].host_dev
        fl = c.flap("n3", period=0.6, down_for=0.3)
        wait_until(lambda: not link_is_up(dev), DEADLINE, "the flapping link down")
        wait_until(lambda: link_is_up(dev), DEADLINE, "the flapping link up again")
        wait_until(lambda: not link_is_up(dev), DEADLINE, "the flapping link down a second time")
        fl.revert()
        check(link_is_up(dev), "the link stayed down after the flap was reverted")
        wait_until(lambda: c.tcp_reachable("n1", "n3", 0.5), DEADLINE,
                   "n3 reachable after the flap")
        kinds = [(e["action"], e["fault"]) for e in c.log]
        check(("apply", "flap") in kinds and ("revert", "flap") in kinds, f"log: {kinds}")
        check(all(e["mechanism"] for e in c.log), "a log entry without its mechanism")

        step("processes: a session of our own and a stray child in another session")
        sleeper = c.popen("n2", ["sleep", "600"])
        stray = c.popen("n3", ["sh", "-c", "setsid sleep 600 & echo $!; wait"],
                        stdout=subprocess.PIPE, text=True)
        stray_pid = int(stray.stdout.readline())
        check(stray_pid in c.pids_in_namespaces(), "the stray child is not found in its namespace")
        made = {"netns": [l.netns for l in c.links.values()],
                "links": [l.host_dev for l in c.links.values()] + [c.bridge, c.ifb],
                "pids": [sleeper.pid, stray.pid, stray_pid] +
                        [l.forwarder.pid for l in c.links.values() if l.forwarder]}
    step("after close nothing of the cluster is left")
    assert_gone(made)
    check(not c.leftovers(), f"leftovers: {c.leftovers()}")

    step("a harness that gets SIGTERM removes its cluster; one that gets SIGKILL is swept")
    for sig in (signal.SIGTERM, signal.SIGKILL):
        child_made = run_child_and_signal(sig, forwarder)
        if sig == signal.SIGKILL:
            removed = netns.sweep_stale()
            print(f"swept after SIGKILL: {removed}", flush=True)
        assert_gone(child_made)
    print("PASS", flush=True)


def assert_gone(made):
    ns = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
    left_ns = [n for n in made["netns"] if n in ns]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    left_links = [d for d in made["links"] if f" {d}:" in links or f" {d}@" in links]
    wait_until(lambda: not any(netns._pid_alive(p) for p in made["pids"]), 5,
               f"pids {made['pids']} gone")
    check(not left_ns and not left_links, f"left behind: namespaces {left_ns}, links {left_links}")


CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import cluster as netns
c = netns.Cluster(nodes=2, forwarder=["n1"] if sys.argv[2] == "1" else [], verbose=False).start()
p = c.popen("n2", ["sleep", "600"])
made = {"netns": [l.netns for l in c.links.values()],
        "links": [l.host_dev for l in c.links.values()] + [c.bridge, c.ifb],
        "pids": [p.pid] + [l.forwarder.pid for l in c.links.values() if l.forwarder]}
print(json.dumps(made), flush=True)
time.sleep(600)
"""


def run_child_and_signal(sig, forwarder):
    import json
    harness = os.path.join(os.path.dirname(netns.__file__))
    child = subprocess.Popen([sys.executable, "-c", CHILD, harness, "1" if forwarder else "0"],
                             stdout=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        if not line:
            fail("the child harness did not build its cluster")
        made = json.loads(line)
        child.send_signal(sig)
        rc = child.wait(timeout=20)
        print(f"child harness exited {rc} on signal {sig.name}", flush=True)
        return made
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


if __name__ == "__main__":
    main()
