"""The netns harness's job helper (chaos/netns/troupe_job.py): a real `troupe coordinator` in the
coordinator's namespace listening on that namespace's address, a `troupe agent --ranks 2` in
each of two node namespaces; both agents and their four ranks join, every process the job
reports runs in the namespace it belongs to, the logs are kept, and nothing is left once the
cluster closes. Whether the job then trains across the namespaces is the runtime's business
(tests/integration/netns_*_test.py). Needs root and TROUPE_BIN; exits 77 (Skipped) otherwise."""

import os
import tempfile

from netns_common import check, netns, step, wait_until

TROUPE = os.environ.get("TROUPE_BIN", "")
# Enough steps that the job still runs while its processes are examined; closing the cluster
# ends it (5 steps could finish before the pids were read).
SMALL = ["--world", "4", "--steps", "100000", "--layers", "2", "--heads", "2", "--d-model", "32",
         "--context", "32", "--batch", "8", "--micro-batch", "2", "--eval-every", "0",
         "--no-progress", "--metrics-port", "0"]


def netns_of(pid):
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def main():
    netns.require_netns()
    if not TROUPE or not os.access(TROUPE, os.X_OK):
        print(f"SKIP: TROUPE_BIN is not an executable troupe ({TROUPE!r})", flush=True)
        raise SystemExit(77)
    from troupe_job import TroupeJob
    with tempfile.TemporaryDirectory(prefix="netns-job-") as tmp, netns.Cluster(nodes=2) as c:
        step("coordinator in its namespace, an agent with 2 ranks in each node's")
        job = TroupeJob(c, TROUPE, os.path.join(tmp, "run"), SMALL, agents={"n1": 2, "n2": 2})
        job.start()
        host, port = job.endpoint.rsplit(":", 1)
        check(host == c.address("coord"), f"the coordinator listens on {job.endpoint}, not on "
                                          f"{c.address('coord')}")
        check(os.path.exists(job.token_path), "no join token")
        def joined():
            ev = job.events()
            return ev if sum(e.get("event") == "rank_joined" for e in ev) >= 4 else None
        events = wait_until(joined, 30, "two agents and four ranks joined")
        agents = [e for e in events if e.get("event") == "agent_joined"]
        check(len(agents) == 2, f"agents joined: {agents}")
        pids = job.pids()
        print(f"pids: {pids}", flush=True)
        ns = {n: os.stat(c.netns_path(n)).st_ino for n in c.names}
        check(netns_of(pids["coordinator"]) == ns["coord"],
              "the coordinator runs outside its namespace")
        for node, pid in pids["agents"].items():
            check(netns_of(pid) == ns[node], f"the agent of {node} runs outside its namespace")
        check(len(pids["ranks"]) == 4, f"ranks reported: {pids['ranks']}")
        for pid in pids["ranks"]:
            check(netns_of(pid) in (ns["n1"], ns["n2"]), f"rank pid {pid} runs outside the nodes")
        check(set(pids["ranks"]) <= set(pids["in_namespaces"]), "ranks missing from the namespaces")
        check("listening on" in job.log("coord"), f"coordinator log: {job.log('coord')!r}")
        everything = pids["in_namespaces"]
    step("after close no process of the job is left")
    wait_until(lambda: not any(netns._pid_alive(p) for p in everything), 5,
               f"pids {everything} gone")
    check(not c.leftovers(), f"leftovers: {c.leftovers()}")
    print("PASS", flush=True)


if __name__ == "__main__":
    main()
