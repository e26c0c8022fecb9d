"""A real troupe job across a Cluster: `troupe coordinator` in the coordinator's namespace,
`troupe agent` in each node's namespace, their pids and logs kept for the test.

    from cluster import Cluster
    from troupe_job import TroupeJob
    with Cluster(nodes=2) as c:
        job = TroupeJob(c, troupe_bin, run_dir, ["--world", "4", "--steps", "30"],
                        agents={"n1": 2, "n2": 2})
        job.start()                 # coordinator up and its address known, agents started
        c.cut("n2")                 # ... faults ...
        rc = job.wait(300)          # the coordinator's exit code
        print(job.log("coord"), job.pids(), job.events()[-1])

What it runs (what a user runs by hand, with the namespaces' addresses):

    ip netns exec <coord ns> troupe coordinator --host <coord address> --port 0 \\
        --run-dir RUN_DIR <args> [-- PROGRAM ARGS]
    ip netns exec <node ns> troupe agent --coordinator <coord address>:<port> \\
        --join-token RUN_DIR/join.token [--ranks K] [-- PROGRAM ARGS]

The coordinator writes RUN_DIR/join.token and RUN_DIR/coordinator.addr (HOST:PORT) once it
listens; the agents start after both exist. Everything is in the cluster's processes, so
Cluster.close() ends it all, by pid, whatever happened.
"""

import json
import os
import signal
import time


class JobError(RuntimeError):
    pass


class TroupeJob:
    def __init__(self, cluster, troupe_bin, run_dir, args=(), agents=None, log_dir=None, env=None,
                 port=0, program=None):
        """args: options for `troupe coordinator` (every `troupe run` option). agents: node ->
        ranks for its `--ranks` (None: no --ranks); default one agent per node, no --ranks.
        program: the workers' program (`-- PROGRAM ARGS`, e.g. ["/usr/bin/python3", "train.py"]),
        appended to the coordinator's and every agent's command line; None: `troupe worker`."""
        self.cluster = cluster
        self.troupe = troupe_bin
        self.run_dir = os.path.abspath(run_dir)
        self.args = list(args)
        self.agents = dict(agents) if agents is not None else {n: None for n in cluster.nodes}
        self.log_dir = log_dir or os.path.join(self.run_dir, "netns-logs")
        self.env = env
        self.port = port
        self.program = list(program) if program else []
        self.coordinator = None
        self.agent_procs = {}
        self.endpoint = None
        self._logs = {}

    def _log_file(self, who):
        os.makedirs(self.log_dir, exist_ok=True)
        path = os.path.join(self.log_dir, f"{who}.log")
        self._logs[who] = path
        return open(path, "w")

    def start_coordinator(self, timeout=30):
        os.makedirs(self.run_dir, exist_ok=True)
        addr_file = os.path.join(self.run_dir, "coordinator.addr")
        started = time.time()
        argv = [self.troupe, "coordinator", "--host", self.cluster.address("coord"),
                "--port", str(self.port), "--run-dir", self.run_dir] + self.args
        if self.program:
            argv += ["--"] + self.program
        with self._log_file("coord") as out:
            self.coordinator = self.cluster.popen("coord", argv, stdout=out, stderr=out,
                                                  env=self.env)
        deadline = time.monotonic() + timeout
        while True:
            try:
                if os.stat(addr_file).st_mtime >= started - 1:
                    with open(addr_file) as f:
                        self.endpoint = f.read().strip()
                    if self.endpoint:
                        break
            except FileNotFoundError:
                pass
            if self.coordinator.poll() is not None:
                raise JobError(f"troupe coordinator exited {self.coordinator.returncode} before "
                               f"listening:\n{self.log('coord')}")
            if time.monotonic() > deadline:
                raise JobError(f"troupe coordinator wrote no {addr_file} within {timeout}s:\n"
                               f"{self.log('coord')}")
            time.sleep(0.05)
        return self.endpoint

    @property
    def token_path(self):
        return os.path.join(self.run_dir, "join.token")

    def start_agent(self, node, ranks=None):
        """Starts (or starts again) the agent of `node`."""
        node = self.cluster._canon(node)
        argv = [self.troupe, "agent", "--coordinator", self.endpoint, "--join-token",
                self.token_path]
        if ranks is not None:
            argv += ["--ranks", str(ranks)]
        if self.program:
            argv += ["--"] + self.program
        with self._log_file(f"agent-{node}") as out:
            p = self.cluster.popen(node, argv, stdout=out, stderr=out, env=self.env)
        self.agent_procs[node] = p
        return p

    def start(self, timeout=30):
        self.start_coordinator(timeout)
        for node, ranks in self.agents.items():
            self.start_agent(node, ranks)
        return self

    def wait(self, timeout):
        """The coordinator's exit code; JobError with its log if it runs past `timeout`."""
        try:
            return self.coordinator.wait(timeout=timeout)
        except Exception:
            raise JobError(f"troupe coordinator still running after {timeout}s:\n"
                           f"{self.log('coord')}")

    def stop(self, grace=10):
        """SIGTERM to the coordinator (it stops the job at a step boundary), then to the agents;
        SIGKILL after `grace` seconds."""
        procs = [self.coordinator] + list(self.agent_procs.values())
        for p in procs:
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in procs:
            if p is None:
                continue
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except Exception:
                p.kill()
                p.wait()

    def log(self, who):
        """The output of "coord" or "agent-<node>" so far."""
        try:
            with open(self._logs[who]) as f:
                return f.read()
        except (KeyError, OSError):
            return ""

    def logs(self):
        return {who: self.log(who) for who in self._logs}

    def events(self):
        """events.jsonl of the run directory (lines that are not JSON are skipped)."""
        out = []
        try:
            with open(os.path.join(self.run_dir, "events.jsonl")) as f:
                for line in f:
                    try:
                        e = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(e, dict):
                        out.append(e)
        except FileNotFoundError:
            pass
        return out

    def pids(self):
        """The coordinator's and agents' pids, the ranks' pids the job reported, and every
        process now in each namespace."""
        ranks = [e["pid"] for e in self.events() if e.get("event") == "rank_joined" and "pid" in e]
        return {"coordinator": self.coordinator.pid if self.coordinator else None,
                "agents": {n: p.pid for n, p in self.agent_procs.items()},
                "ranks": ranks,
                "in_namespaces": self.cluster.pids_in_namespaces()}
