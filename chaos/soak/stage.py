"""The soak's stage: a real troupe job across network namespaces (chaos/netns), with etcd in a
namespace of its own, two coordinators (one leads, one stands by) and two nodes of two ranks.

    n4     etcd (the coordinators' leader election and fence)
    coord  coordinator A, port 29400          n3  coordinator B, port 29400 (standing by)
    n1     agent + 2 workers                  n2  agent + 2 workers
           (both links through a forwarder: a standing delay, and the delay and loss faults)

A killed coordinator is started again at the same address, as a standby (the agents were given
both addresses once), and a killed or fenced node gets a new agent: the soak plays the part of
the launcher or the scheduler that would do the same on a cluster."""

import base64
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "netns"))
import cluster as netns  # noqa: E402
from troupe_job import TroupeJob  # noqa: E402

from job_view import SoakFailure, pid_alive  # noqa: E402

ETCD = "/usr/bin/etcd"
ETCDCTL = "/usr/bin/etcdctl"
PORT = 29400
COORDINATOR_NODES = ("coord", "n3")
AGENT_NODES = ("n1", "n2")
ETCD_NODE = "n4"
RANKS_PER_NODE = 2


class Stage:
    def __init__(self, troupe, root, run_dir, job_args, link_delay_ms):
        self.troupe = troupe
        self.root = root
        self.run_dir = run_dir
        self.job_args = list(job_args)
        self.log_dir = os.path.join(root, "logs")
        os.makedirs(self.log_dir, exist_ok=True)
        self.cluster = None
        self.job = None
        self.url = None
        self.coordinators = {}   # namespace -> Popen
        self.restarts = {}       # log name -> count
        self.link_delay_ms = link_delay_ms

    # ------------------------------------------------------------------ start and stop

    def __enter__(self):
        self.cluster = netns.Cluster(nodes=4, forwarder=list(AGENT_NODES)).__enter__()
        try:
            self._start()
        except BaseException:
            self.cluster.__exit__(*sys.exc_info())
            raise
        return self

    def __exit__(self, *exc):
        self.cluster.__exit__(*exc)
        return False

    def _start(self):
        c = self.cluster
        # The nodes' standing link delay: a step waits for a few round trips, as across racks,
        # instead of the microseconds of a bridge (the delay and loss faults stack on it).
        if self.link_delay_ms:
            for node in AGENT_NODES:
                c.delay(node, ms=self.link_delay_ms)
        self.url = self._start_etcd()
        self.job = TroupeJob(c, self.troupe, self.run_dir, self.job_args + ["--etcd", self.url],
                             agents={}, log_dir=self.log_dir, port=PORT)
        self.job.start_coordinator(timeout=60)
        self.coordinators["coord"] = self.job.coordinator
        # The standby starts once the first coordinator leads: started at once, it raced the
        # first's campaign and, on a loaded machine, sometimes won it, leaving the first to
        # give up after --etcd-timeout-ms and the soak with one coordinator.
        deadline = time.monotonic() + 60
        while self.leader_key()[1] is None:
            if self.job.coordinator.poll() is not None or time.monotonic() > deadline:
                raise SoakFailure(f"the first coordinator did not lead within 60s (exit "
                                  f"{self.job.coordinator.poll()}); see {self.log_dir}")
            time.sleep(0.05)
        self.coordinators["n3"] = self.start_standby("n3")
        self.job.endpoint = ",".join(f"{c.address(n)}:{PORT}" for n in COORDINATOR_NODES)
        for node in AGENT_NODES:
            self.job.start_agent(node, RANKS_PER_NODE)

    def _start_etcd(self):
        c = self.cluster
        address = c.address(ETCD_NODE)
        url, peer = f"http://{address}:2379", f"http://{address}:2380"
        with open(os.path.join(self.log_dir, "etcd.log"), "w") as log:
            c.popen(ETCD_NODE, [ETCD, "--name", "m0", "--data-dir",
                                os.path.join(self.root, "etcd-data"),
                                "--listen-client-urls", url, "--advertise-client-urls", url,
                                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                                "--initial-cluster", f"m0={peer}",
                                "--initial-cluster-token", "troupe-soak"],
                    stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            if self.etcdctl(["endpoint", "health"], url=url, check=False).returncode == 0:
                return url
            if time.monotonic() > deadline:
                raise SoakFailure(f"etcd at {url} did not answer within 30s; see "
                                  f"{self.log_dir}/etcd.log")
            time.sleep(0.2)

    def etcdctl(self, args, url=None, check=True):
        env = dict(os.environ, ETCDCTL_API="3")
        r = subprocess.run(["ip", "netns", "exec", self.cluster.netns("n3"), ETCDCTL,
                            "--endpoints", url or self.url, "--command-timeout", "3s"] + args,
                           capture_output=True, text=True, env=env, timeout=20)
        if check and r.returncode != 0:
            raise SoakFailure(f"etcdctl {' '.join(args)}: {r.stderr.strip()}")
        return r

    def start_standby(self, node):
        """A coordinator of the job in `node`'s namespace at its fixed address, standing by."""
        c = self.cluster
        argv = [self.troupe, "coordinator", "--config", os.path.join(self.run_dir, "config.json"),
                "--etcd", self.url, "--join-token", self.job.token_path, "--run-dir",
                self.run_dir, "--host", c.address(node), "--port", str(PORT),
                "--metrics-port", "0"] + self._ha_args()
        n = self.restarts.get(f"coord-{node}", 0)
        self.restarts[f"coord-{node}"] = n + 1
        with open(os.path.join(self.log_dir, f"coord-{node}.{n}.log"), "w") as out:
            p = c.popen(node, argv, stdout=out, stderr=out)
        addr_file = os.path.join(self.run_dir, "coordinators", f"{p.pid}.addr")
        deadline = time.monotonic() + 30
        while not os.path.exists(addr_file):
            if p.poll() is not None or time.monotonic() > deadline:
                raise SoakFailure(f"the coordinator started in {node} did not publish "
                                  f"{addr_file} (exit {p.poll()}); see {self.log_dir}")
            time.sleep(0.02)
        self.coordinators[node] = p
        return p

    def _ha_args(self):
        out, args = [], self.job_args
        for flag in ("--etcd-timeout-ms",):
            if flag in args:
                out += [flag, args[args.index(flag) + 1]]
        return out

    def restart_agent(self, node):
        n = self.restarts.get(f"agent-{node}", 0)
        self.restarts[f"agent-{node}"] = n + 1
        old = self.job.agent_procs.get(node)
        if old is not None:
            try:
                old.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self.job.start_agent(node, RANKS_PER_NODE)

    # ------------------------------------------------------------------ who is where

    def pids_in(self, node):
        target = os.stat(self.cluster.netns_path(node))
        out = []
        for pid in self.cluster.pids_in_namespaces():
            try:
                st = os.stat(f"/proc/{pid}/ns/net")
            except OSError:
                continue
            if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino) and pid_alive(pid):
                out.append(pid)
        return out

    def troupe_pids_in(self, node):
        """The troupe processes (agents, workers) in `node`'s namespace, by executable."""
        exe = os.path.realpath(self.troupe)
        out = []
        for pid in self.pids_in(node):
            try:
                if os.path.realpath(f"/proc/{pid}/exe") == exe:
                    out.append(pid)
            except OSError:
                continue
        return out

    def coordinator_node(self, pid):
        for node, p in self.coordinators.items():
            if p.pid == pid:
                return node
        return None

    def leader_key(self):
        """(lease id, value) of the job's leader key in etcd, or (0, None)."""
        # The job's id in etcd: unique to the run, kept in its config.json.
        with open(os.path.join(self.run_dir, "config.json")) as f:
            job_id = json.load(f)["job_id"]
        r = self.etcdctl(["get", f"/troupe/{job_id}/leader", "-w", "json"], check=False)
        if r.returncode != 0:
            return 0, None
        kvs = json.loads(r.stdout).get("kvs") or []
        if not kvs:
            return 0, None
        return int(kvs[0].get("lease", 0)), base64.b64decode(kvs[0]["value"]).decode()

    def logs_tail(self, chars=3000):
        out = []
        for name in sorted(os.listdir(self.log_dir)):
            try:
                with open(os.path.join(self.log_dir, name), errors="replace") as f:
                    text = f.read()
            except OSError:
                continue
            out.append(f"--- {name}\n{text[-chars:]}")
        return "\n".join(out)
