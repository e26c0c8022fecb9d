"""A real Slurm across a netns Cluster: munged, slurmctld and one slurmd per node namespace,
all started and stopped by the caller, with nothing installed or changed on the machine
(no /etc/slurm, no /etc/munge, no /etc/hosts edits, no services).

    import cluster as netns, slurm_cluster
    ok, why = slurm_cluster.can_run()            # root, namespaces, slurm-wlm and munge
    with netns.Cluster(nodes=2) as c, slurm_cluster.Slurm(c, workdir) as s:
        job = s.sbatch(script_path, ["--nodes=2"])   # the job id
        s.wait_state(job, {"RUNNING"}, timeout=20)
        s.scontrol("show", "job", job)
        s.wait_done(job, timeout=300)            # sacct-free: scontrol's JobState and ExitCode
    # every daemon is gone here (by pid), and so is the cluster

How (checked facts: shared/notes/slurm-netns.md):

- munged runs with its own key, socket, pid and seed file in `workdir/munge/` (every directory
  above its socket world-executable, the key in a 0700 directory), in the coordinator's
  namespace like slurmctld, so that everything is swept with the cluster; Slurm finds it
  through `AuthInfo=socket=PATH` (cred/munge honours the same).
- slurmctld runs in the cluster's coordinator namespace ("coord") with a UTS namespace of its
  own (hostname "ctld", which must match `SlurmctldHost`) and listens on that namespace's
  address only (`CommunicationParameters=NoCtldInAddrAny`).
- node i ("n<i>") runs `slurmd -N node<i>` entered with `nsenter --net` + `unshare --uts
  --mount --propagation private` (not `ip netns exec`: its remount of /sys hides the cgroup
  tree that slurmd 22.05 always loads), with hostname node<i> and `workdir/hosts`
  bind-mounted over /etc/hosts in its private mount namespace; the jobs' tasks inherit both.
- Clients (sbatch, srun, scontrol, scancel) read `SLURM_CONF=workdir/slurm.conf` from the
  environment; `self.env()` is an environment that has it.

A node's link cut (`c.cut("n2")`) is seen by Slurm after `SlurmdTimeout` (10 s here: DOWN
14-17 s after the cut); the tests rely on troupe's own heartbeat, not on that.
"""

import os
import re
import signal
import socket
import subprocess
import time

SLURM_PACKAGES = {"slurmctld": "slurmctld", "slurmd": "slurmd", "sbatch": "slurm-client",
                  "munged": "munge"}


class SlurmError(RuntimeError):
    pass


def _which(tool):
    for d in os.environ.get("PATH", "/usr/bin").split(":") + ["/usr/sbin", "/sbin", "/usr/bin"]:
        path = os.path.join(d, tool)
        if os.access(path, os.X_OK):
            return path
    return None


def can_run():
    """(True, "") where a Slurm can be started here (root, namespaces, the packages)."""
    import cluster as netns
    ok, why = netns.can_run()
    if not ok:
        return ok, why
    missing = [pkg for tool, pkg in SLURM_PACKAGES.items() if not _which(tool)]
    if missing:
        return False, ("Slurm is not installed (apt-get install " + " ".join(sorted(set(missing)))
                       + ")")
    for tool in ("nsenter", "unshare", "mungekey"):
        if not _which(tool):
            return False, f"`{tool}` is not installed"
    return True, ""


def require_slurm():
    """For tests: exits 77 (ctest SKIP_RETURN_CODE) where a Slurm cannot be started here."""
    ok, why = can_run()
    if not ok:
        print(f"SKIP: {why}", flush=True)
        raise SystemExit(77)


def _free_port(host):
    s = socket.socket()
    try:
        s.bind((host, 0))
        return s.getsockname()[1]
    finally:
        s.close()


class Slurm:
    """munged + slurmctld (in the coordinator's namespace) + one slurmd per node namespace of
    `cluster`, configured under `workdir`. A context manager; close() stops every daemon by
    pid and waits for it, also when the caller failed."""

    def __init__(self, cluster, workdir, *, cpus=4, slurmd_timeout=10, kill_wait=5,
                 extra_conf=(), verbose=True):
        self.c = cluster
        self.workdir = os.path.abspath(workdir)
        self.cpus = cpus
        self.slurmd_timeout = slurmd_timeout
        self.kill_wait = kill_wait
        self.extra_conf = list(extra_conf)
        self.verbose = verbose
        self.node_names = {n: "node" + n[1:] for n in cluster.nodes}   # n1 -> node1
        self.conf = os.path.join(self.workdir, "slurm.conf")
        self.munge_socket = os.path.join(self.workdir, "munge", "munge.socket")
        self.hosts = os.path.join(self.workdir, "hosts")
        self.munged = None
        self.slurmctld = None
        self.slurmd = {}
        self._logs = []
        self._t0 = time.monotonic()

    # ------------------------------------------------------------ lifecycle

    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _note(self, text):
        if self.verbose:
            print(f"[slurm {time.monotonic() - self._t0:8.3f}s] {text}", flush=True)

    def env(self, extra=None):
        """An environment for Slurm's clients (and for sbatch: the job gets it too)."""
        env = dict(os.environ)
        env["SLURM_CONF"] = self.conf
        for k in list(env):   # a Slurm job around the test must not leak into this one's
            if k.startswith("SLURM_") and k != "SLURM_CONF":
                del env[k]
        env.update(extra or {})
        return env

    def start(self):
        t0 = time.monotonic()
        os.makedirs(self.workdir, exist_ok=True)
        # munged wants every directory above its socket world-executable. The workdir and its
        # parent (a test's temporary directory, 0700) are made so; anything higher is not
        # touched: a workdir below a private directory is refused.
        d = self.workdir
        while d != "/":
            st = os.stat(d)
            if not st.st_mode & 0o001:
                if d not in (self.workdir, os.path.dirname(self.workdir)):
                    raise SlurmError(f"munged needs every directory above its socket "
                                     f"world-executable, and {d} is not; put the workdir "
                                     "elsewhere (under /tmp)")
                os.chmod(d, st.st_mode | 0o011)
            d = os.path.dirname(d)
        for sub in ("munge", "state", "spool", "log"):
            os.makedirs(os.path.join(self.workdir, sub), exist_ok=True)
        os.chmod(os.path.join(self.workdir, "munge"), 0o755)
        keydir = os.path.join(self.workdir, "munge", "key")
        os.makedirs(keydir, exist_ok=True)
        os.chmod(keydir, 0o700)
        key = os.path.join(keydir, "munge.key")
        if not os.path.exists(key):
            self._run(["mungekey", "--create", f"--keyfile={key}"])
        os.chmod(key, 0o400)
        self._write_hosts()
        self._write_conf()
        munge_dir = os.path.join(self.workdir, "munge")
        # In the coordinator's namespace too (its socket is a file every namespace reaches), so
        # that the cluster's sweep by namespace ends it even if this process is killed.
        self.munged = self.c.popen(
            "coord",
            ["munged", "--foreground", "--force", f"--socket={self.munge_socket}",
             f"--key-file={key}", f"--pid-file={munge_dir}/munged.pid",
             f"--seed-file={munge_dir}/munged.seed", f"--log-file={munge_dir}/munged.log"],
            via="nsenter", stdout=self._log("munged"), stderr=subprocess.STDOUT)
        self._wait_for(lambda: os.path.exists(self.munge_socket), 10, "munged's socket",
                       self.munged)
        ctld = self._wrapped("ctld", ["slurmctld", "-D", "-i", "-f", self.conf])
        self.slurmctld = self.c.popen("coord", ctld, via="nsenter", stdout=self._log("slurmctld"),
                                      stderr=subprocess.STDOUT, env=self.env())
        for node, name in self.node_names.items():
            argv = self._wrapped(name, ["slurmd", "-D", "-N", name, "-f", self.conf])
            self.slurmd[node] = self.c.popen(node, argv, via="nsenter",
                                             stdout=self._log(f"slurmd-{name}"),
                                             stderr=subprocess.STDOUT, env=self.env())
        self.wait_nodes_idle(timeout=30)
        self._note(f"up in {time.monotonic() - t0:.2f} s: slurmctld on "
                   f"{self.c.address('coord')}:{self.ctld_port}, nodes "
                   f"{', '.join(self.node_names.values())}")
        return self

    def close(self):
        """Stops slurmd's, slurmctld and munged (SIGTERM, SIGKILL after a grace), by pid."""
        t0 = time.monotonic()
        procs = [p for p in list(self.slurmd.values()) + [self.slurmctld] if p is not None]
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 8
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(timeout=5)
        if self.munged is not None and self.munged.poll() is None:
            self.munged.terminate()
            try:
                self.munged.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.munged.kill()
                self.munged.wait(timeout=5)
        for f in self._logs:
            f.close()
        self._logs = []
        self._note(f"down in {time.monotonic() - t0:.2f} s")

    # ------------------------------------------------------------ configuration

    def _write_hosts(self):
        lines = ["127.0.0.1 localhost", f"{self.c.address('coord')} ctld"]
        lines += [f"{self.c.address(n)} {name}" for n, name in self.node_names.items()]
        with open(self.hosts, "w") as f:
            f.write("\n".join(lines) + "\n")
        os.chmod(self.hosts, 0o644)

    def _write_conf(self):
        ctld_addr = self.c.address("coord")
        self.ctld_port = _free_port("0.0.0.0")
        self.slurmd_port = _free_port("0.0.0.0")
        w = self.workdir
        conf = [
            "ClusterName=troupetest",
            f"SlurmctldHost=ctld({ctld_addr})",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={self.slurmd_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "CommunicationParameters=NoCtldInAddrAny",
            f"StateSaveLocation={w}/state",
            f"SlurmdSpoolDir={w}/spool/%n",
            f"SlurmctldPidFile={w}/slurmctld.pid",
            f"SlurmdPidFile={w}/slurmd-%n.pid",
            f"SlurmctldLogFile={w}/log/slurmctld.log",
            f"SlurmdLogFile={w}/log/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/builtin",
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            f"SlurmdTimeout={self.slurmd_timeout}",
            f"KillWait={self.kill_wait}",
            "MailProg=/bin/true",
            "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "InactiveLimit=0",
            "MinJobAge=300",
        ] + self.extra_conf
        for n, name in self.node_names.items():
            conf.append(f"NodeName={name} NodeAddr={self.c.address(n)} CPUs={self.cpus} "
                        "State=UNKNOWN")
        conf.append("PartitionName=troupe Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        with open(self.conf, "w") as f:
            f.write("\n".join(conf) + "\n")
        os.chmod(self.conf, 0o644)

    def _wrapped(self, hostname, argv):
        """argv in a UTS and private mount namespace of its own, with `hostname` and the
        cluster's hosts file over /etc/hosts (cluster.popen(via="nsenter") adds the netns)."""
        script = ('hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"')
        return ["unshare", "--uts", "--mount", "--propagation", "private", "sh", "-c", script,
                "slurm-daemon", hostname, self.hosts] + list(argv)

    def _log(self, name):
        f = open(os.path.join(self.workdir, "log", f"{name}.out"), "w")
        self._logs.append(f)
        return f

    def _run(self, argv, timeout=30, check=True, env=None):
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                           env=env or self.env())
        if check and r.returncode != 0:
            raise SlurmError(f"`{' '.join(argv)}` failed (exit {r.returncode}): "
                             f"{(r.stderr or r.stdout).strip()}")
        return r

    def _wait_for(self, cond, timeout, what, proc=None):
        deadline = time.monotonic() + timeout
        while not cond():
            if proc is not None and proc.poll() is not None:
                raise SlurmError(f"{what}: the daemon exited ({proc.returncode}); "
                                 f"logs in {self.workdir}/log")
            if time.monotonic() > deadline:
                raise SlurmError(f"{what}: not within {timeout} s; logs in {self.workdir}/log")
            time.sleep(0.05)

    def log(self, name):
        """A daemon's log: "slurmctld", "slurmd-node1", ..."""
        out = ""
        for path in (os.path.join(self.workdir, "log", f"{name}.log"),
                     os.path.join(self.workdir, "log", f"{name}.out")):
            try:
                with open(path) as f:
                    out += f.read()
            except OSError:
                pass
        return out

    # ------------------------------------------------------------ clients

    def scontrol(self, *args, check=True):
        return self._run(["scontrol"] + list(args), check=check).stdout

    def node_states(self):
        out = self._run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False).stdout
        return dict(line.split()[:2] for line in out.splitlines() if len(line.split()) >= 2)

    def wait_nodes_idle(self, timeout=30):
        want = set(self.node_names.values())

        def idle():
            for p in [self.slurmctld] + list(self.slurmd.values()):
                if p.poll() is not None:
                    raise SlurmError(f"a Slurm daemon exited ({p.returncode}) while starting:\n"
                                     + self.log("slurmctld")[-3000:])
            states = self.node_states()
            return all(states.get(n, "").startswith("idle") for n in want)
        self._wait_for(idle, timeout, "nodes idle")

    def sbatch(self, script, args=(), script_args=(), env=None):
        """Submits `script` (sbatch options `args`, the script's own `script_args`) with the
        environment `env` added to Slurm's; returns the job id (a string)."""
        r = self._run(["sbatch", "--parsable"] + list(args) + [script] + list(script_args),
                      env=self.env(env))
        return r.stdout.strip().split(";")[0]

    def job(self, job_id):
        """scontrol show job, as a dict (JobState, ExitCode, NodeList, Restarts, ...); {} once
        Slurm forgot it."""
        r = self._run(["scontrol", "show", "job", "-o", str(job_id)], check=False)
        if r.returncode != 0:
            return {}
        out = {}
        for m in re.finditer(r"(\S+?)=(\S*)", r.stdout):
            out.setdefault(m.group(1), m.group(2))
        return out

    def wait_state(self, job_id, states, timeout):
        deadline = time.monotonic() + timeout
        while True:
            info = self.job(job_id)
            if info.get("JobState") in states:
                return info
            if time.monotonic() > deadline:
                raise SlurmError(f"job {job_id} not in {sorted(states)} within {timeout} s: "
                                 f"{info.get('JobState')} ({info.get('Reason')})")
            time.sleep(0.1)

    def wait_done(self, job_id, timeout):
        return self.wait_state(job_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
                                        "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED"}, timeout)
