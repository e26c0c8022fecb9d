"""A cluster of N nodes on one machine, as network namespaces, with network faults by name.

Each node ("n1" .. "nN") and the coordinator ("coord") gets a network namespace of its own
with loopback up and one interface, eth0, on a /24 subnet chosen for this cluster. Each eth0
is linked to a bridge in the root namespace: by a veth pair, or, for links named in
`forwarder=`, through chaos/netns/tap_forwarder (two TAP devices and a process that holds
each frame for a delay and drops with a seeded generator). Neighbour (ARP) entries are
permanent, so a fault that drops frames never kills address resolution, and IPv6 is off so
that only the traffic a test makes crosses the links.

    import cluster as netns
    ok, why = netns.can_run()
    with netns.Cluster(nodes=3, forwarder=["n1"]) as c:
        p = c.popen("n2", ["python3", "-m", "http.server", "--bind", c.address("n2")])
        c.cut("n2")                       # partition: the link is down
        c.heal("n2")
        c.split(["n1"], ["n2", "n3", "coord"])
        c.drop("n3", direction="in")      # frames toward n3 die; n3's own frames pass
        c.loss("n2", 0.2)                 # kernel: classic BPF random match
        c.loss("n1", 0.2, seed=7)         # forwarder: seeded, replays exactly
        c.rate("n3", mbit=50)             # tbf on both ends of the link
        c.delay("n1", ms=50, jitter_ms=20, seed=3)
        c.flap("n3", period=2.0)
        c.isolate_coordinator()
        c.clear()                         # revert every fault

Which mechanism each fault uses, and why, is in faults.py; `c.play(scenario)` applies faults
by name and time from a scenario (scenario.py).

A real troupe job across the namespaces (troupe_job.py does this and keeps pids and logs):

    ip netns exec <coord ns> troupe coordinator --host <coord address> --port 29400 \\
        --world 4 --run-dir RUN_DIR
    ip netns exec <n1 ns> troupe agent --coordinator <coord address>:29400 \\
        --join-token RUN_DIR/join.token --ranks 2        # and the same in n2

    from troupe_job import TroupeJob
    job = TroupeJob(c, "build/cli/troupe", run_dir, ["--world", "4"], agents={"n1": 2, "n2": 2})
    job.start(); rc = job.wait(600); print(job.pids(), job.log("coord"))

Everything a cluster makes is recorded with its owner before it is made, so that what a
harness killed by SIGKILL leaves is swept later (host.py; `python3 cluster.py sweep`).

The harness is four modules, and `import cluster` reaches every name of them: cluster.py
builds a cluster, runs processes in it and removes it; faults.py makes and reverts the faults
(Cluster inherits its FaultInjector); bpf.py holds the classic-BPF programs some faults use;
host.py holds what the machine gives (commands, namespaces, processes, the registry of owners,
SIGTERM and atexit).
"""

import fcntl
import itertools
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

from faults import FaultInjector
from host import (COORDINATOR, LINK_PREFIX, LOCK_PATH, NETNS_PREFIX, REGISTRY, NetnsError,
                  _base36, _cmd, _counter, _disable_ipv6, _free_subnet, _install_handlers,
                  _killpg, _link_exists, _live, _live_lock, _netns_list, _owner, _pids_in,
                  _readline, _sigterm_deferred, default_forwarder_bin, pid_alive,
                  socket_in_netns, sweep_stale)

# Users reach the whole harness through this module (`import cluster as netns`): the tests
# use its classic-BPF pieces and _pid_alive too. __all__ lists them, so they count as used.
from bpf import (_JEQ_K, _JGE_K, _LD_H_ABS, _LD_W_ABS, _MATCH, _NO_MATCH, _RET_K,
                 _SKF_AD_OFF, _SKF_AD_PROTOCOL, _SKF_AD_RANDOM, _ancillary, _bytecode,
                 bpf_all_but_arp, bpf_random_ipv4, bpf_source_mac_in)
from faults import PARTITION_KINDS, Fault, stable_seed
from host import (HERE, REPO, SUBNET_POOL, Terminated, _CLONE_NEWNET, _libc, _on_sigterm,
                  _owner_gone, _proc_start_time, _remove_recorded, can_run, can_run_forwarder,
                  close_all, netem_available, require_netns)

_pid_alive = pid_alive

__all__ = [
    # this module
    "Cluster", "_Link", "_AcceptLoop",
    # faults.py
    "Fault", "FaultInjector", "PARTITION_KINDS", "stable_seed",
    # bpf.py
    "_JEQ_K", "_JGE_K", "_LD_H_ABS", "_LD_W_ABS", "_MATCH", "_NO_MATCH", "_RET_K",
    "_SKF_AD_OFF", "_SKF_AD_PROTOCOL", "_SKF_AD_RANDOM", "_ancillary", "_bytecode",
    "bpf_all_but_arp", "bpf_random_ipv4", "bpf_source_mac_in",
    # host.py
    "COORDINATOR", "HERE", "LINK_PREFIX", "LOCK_PATH", "NETNS_PREFIX", "REGISTRY", "REPO",
    "SUBNET_POOL", "NetnsError", "Terminated", "_CLONE_NEWNET", "_base36", "_cmd", "_counter",
    "_disable_ipv6", "_free_subnet", "_install_handlers", "_killpg", "_libc", "_link_exists",
    "_live", "_live_lock", "_netns_list", "_on_sigterm", "_owner", "_owner_gone", "_pid_alive",
    "_pids_in", "_proc_start_time", "_readline", "_remove_recorded", "_sigterm_deferred",
    "can_run", "can_run_forwarder", "close_all", "default_forwarder_bin", "netem_available",
    "pid_alive", "require_netns", "socket_in_netns", "sweep_stale",
]


class _Link:
    """One namespace's link to the bridge."""

    def __init__(self, name, index, netns, address, mac, host_dev, kind):
        self.name = name
        self.index = index
        self.netns = netns
        self.address = address
        self.mac = mac
        self.host_dev = host_dev      # the bridge port in the root namespace
        self.inner_dev = "eth0"       # the node's interface, in its namespace
        self.kind = kind              # "veth" or "tap"
        self.forwarder = None         # Popen of tap_forwarder for a "tap" link
        self.down_reasons = set()
        self.egress = {"in": [], "out": []}   # (token, key, value): tbf/netem at each end's egress
        self.shaping = {}                     # (kind, direction) -> [(token, args)]: forwarder
        self.last_octet = 0


class Cluster(FaultInjector):
    """N node namespaces and a coordinator namespace on one bridge. Use as a context manager;
    `close()` removes everything it made, also on failure, atexit and SIGTERM."""

    def __init__(self, nodes=3, *, forwarder=(), mtu=1500, seed=0, verbose=True,
                 forwarder_bin=None, log_path=None):
        if not 1 <= nodes <= 200:
            raise ValueError(f"nodes must be 1..200, got {nodes}")
        self.n = nodes
        self.nodes = [f"n{i}" for i in range(1, nodes + 1)]
        self.names = [COORDINATOR] + self.nodes
        if forwarder is True:
            forwarder = self.names
        forwarder = [self._canon(x) for x in (forwarder or ())]
        self._forwarded = set(forwarder)
        self.mtu = mtu
        self.seed = seed
        self.verbose = verbose
        self.forwarder_bin = forwarder_bin or default_forwarder_bin()
        self.pid = os.getpid()
        self._owner = _owner()
        self.k = next(_counter)
        self.tag = f"{_base36(self.pid)}-{_base36(self.k)}"
        self.bridge = f"{LINK_PREFIX}{self.tag}b"
        self.ifb = f"{LINK_PREFIX}{self.tag}d"
        self._registry_path = os.path.join(REGISTRY, f"{self.tag}.json")
        self.links = {}
        self.procs = []
        self.faults = []
        self.log = []
        self.subnet = None
        self.host_address = None
        self._lock = threading.RLock()
        self._pref = itertools.count(10)
        self._clsact = set()
        self._ifb_made = False
        self._listeners = {}
        self._runs = []
        self._closed = False
        self._built = False
        self._t0 = time.monotonic()
        self._log_file = open(log_path, "a") if log_path else None
        if len(self.bridge) > 15 or len(f"{LINK_PREFIX}{self.tag}h{nodes + 10}") > 15:
            raise NetnsError(f"interface names for cluster {self.tag} would pass 15 characters")

    # ------------------------------------------------------------ lifecycle

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.close(raise_errors=exc[0] is None)
        return False

    def start(self):
        """Builds the namespaces, links and bridge."""
        if self._built:
            return self
        with _live_lock:
            _live.add(self)
        _install_handlers()
        try:
            self._build()
        except BaseException:
            self.close(raise_errors=False)
            raise
        self._built = True
        self._t0 = time.monotonic()
        self._note(f"cluster {self.tag}: {self.n} nodes + coordinator on {self.subnet} "
                   f"(bridge {self.bridge}; forwarder links: {sorted(self._forwarded) or 'none'})")
        return self

    def _plan(self):
        """Names every namespace and link before any is made."""
        for index, name in enumerate(self.names):
            kind = "tap" if name in self._forwarded else "veth"
            last = 2 if name == COORDINATOR else 10 + index
            netns = f"{NETNS_PREFIX}-{self.pid}-{self.k}-{name}"
            host_dev = f"{LINK_PREFIX}{self.tag}{'t' if kind == 'tap' else 'h'}{index}"
            self.links[name] = _Link(name, index, netns, None, None, host_dev, kind)
            self.links[name].last_octet = last

    def _record(self):
        """Writes what this cluster makes to REGISTRY, so a sweep can remove it if this process
        dies without cleaning up."""
        os.makedirs(REGISTRY, exist_ok=True)
        record = {"owner": self._owner, "tag": self.tag,
                  "netns": [link.netns for link in self.links.values()],
                  "links": [link.host_dev for link in self.links.values()] + [self.ifb,
                                                                               self.bridge],
                  "forwarders": [link.forwarder.pid for link in self.links.values()
                                 if link.forwarder]}
        tmp = self._registry_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(record, f)
        os.replace(tmp, self._registry_path)

    def _build(self):
        self._plan()
        with open(LOCK_PATH, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)   # subnets are picked one cluster at a time
            sweep_stale()
            self._record()
            self.subnet = _free_subnet(self.pid + self.k)
            hosts = list(self.subnet.hosts())
            self.host_address = str(hosts[0])
            octets = self.subnet.network_address.packed
            bridge_mac = "02:7e:%02x:%02x:%02x:fe" % (octets[1], octets[2], 0)
            _cmd(["ip", "link", "add", self.bridge, "address", bridge_mac, "type", "bridge"])
            _disable_ipv6(self.bridge)
            _cmd(["ip", "addr", "add", f"{self.host_address}/{self.subnet.prefixlen}", "dev",
                  self.bridge])
            _cmd(["ip", "link", "set", self.bridge, "up"])
        for link in self.links.values():
            netns, host_dev, kind = link.netns, link.host_dev, link.kind
            address = link.address = str(self.subnet.network_address + link.last_octet)
            mac = link.mac = "02:7e:%02x:%02x:00:%02x" % (octets[1], octets[2], link.last_octet)
            _cmd(["ip", "netns", "add", netns])
            _cmd(["ip", "netns", "exec", netns, "sysctl", "-q", "-w",
                  "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"])
            _cmd(["ip", "-n", netns, "link", "set", "lo", "up"])
            if kind == "tap":
                self._start_forwarder(link)
                self._record()
            else:
                _cmd(["ip", "link", "add", host_dev, "type", "veth", "peer", "name", "eth0",
                      "netns", netns])
            _disable_ipv6(host_dev)
            # A long transmit queue: a TAP whose forwarder is briefly off the CPU queues frames
            # rather than dropping them (its default is 500), so seeded loss stays exact.
            _cmd(["ip", "-n", netns, "link", "set", "eth0", "address", mac, "mtu", str(self.mtu),
                  "txqueuelen", "10000", "up"])
            _cmd(["ip", "-n", netns, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev",
                  "eth0"])
            _cmd(["ip", "link", "set", host_dev, "mtu", str(self.mtu), "txqueuelen", "10000",
                  "master", self.bridge, "up"])
        _cmd(["ip", "link", "set", self.bridge, "mtu", str(self.mtu)])
        # Permanent neighbours everywhere: a fault that drops frames never starves ARP.
        root = []
        for link in self.links.values():
            batch = [f"neigh replace {other.address} lladdr {other.mac} dev eth0 nud permanent"
                     for other in self.links.values() if other is not link]
            batch.append(f"neigh replace {self.host_address} lladdr {bridge_mac} dev eth0 "
                         "nud permanent")
            _cmd(["ip", "-n", link.netns, "-batch", "-"], input="\n".join(batch) + "\n")
            root.append(f"neigh replace {link.address} lladdr {link.mac} dev {self.bridge} "
                        "nud permanent")
        _cmd(["ip", "-batch", "-"], input="\n".join(root) + "\n")

    def _start_forwarder(self, link):
        if not os.access(self.forwarder_bin, os.X_OK):
            raise NetnsError(f"link {link.name} needs the forwarder, but {self.forwarder_bin} "
                             "is not built (cmake --build build --target tap_forwarder)")
        argv = [self.forwarder_bin, "--netns", f"/run/netns/{link.netns}", "--inner", "eth0",
                "--outer", link.host_dev]
        p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, bufsize=1)
        link.forwarder = p
        line = _readline(p.stdout, 10.0)
        if not line.startswith("ready"):
            p.kill()
            p.wait()
            err = p.stderr.read()
            why = (line + err).strip() or "no output in 10 s"
            raise NetnsError(f"`{' '.join(argv)}` did not start: {why}")

    def _forwarder_command(self, link, command):
        p = link.forwarder
        if p is None or p.poll() is not None:
            raise NetnsError(f"the forwarder of {link.name} is not running")
        p.stdin.write(command + "\n")
        p.stdin.flush()
        reply = _readline(p.stdout, 5.0)
        if not reply.startswith(("ok", "stats")):
            why = reply.strip() or "no reply in 5 s"
            raise NetnsError(f"forwarder of {link.name}: `{command}` failed: {why}")
        return reply.strip()

    def forwarder_stats(self, node):
        """Counters of a forwarder link: {"in": {"rx":..,"tx":..,"lost":..,...}, "out": {...}}."""
        link = self._link(node)
        words = self._forwarder_command(link, "stats").split()[1:]
        out, current = {}, None
        for w in words:
            if "=" in w:
                k, v = w.split("=")
                out[current][k] = int(v)
            else:
                current = w
                out[current] = {}
        return out

    def close(self, raise_errors=True):
        """Removes everything this cluster made: its processes (by pid), forwarders,
        namespaces, bridge and ifb. Errors are collected; with raise_errors they are raised
        once everything was tried. A SIGTERM that arrives meanwhile waits until it is done."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        with _sigterm_deferred():
            errors = self._teardown()
        if errors and raise_errors:
            raise NetnsError("closing cluster %s: %s" % (self.tag, "; ".join(errors)))

    def _teardown(self):
        errors = []
        for run in list(self._runs):
            run.stop(revert=False)
        for f in list(self.faults):
            if f.kind == "flap":
                try:
                    f.revert()          # stops its thread
                except Exception as e:
                    errors.append(str(e))
        for lst in self._listeners.values():
            lst.close()
        # Our processes: each leads its own session; terminate the group, then kill.
        for p in self.procs:
            if p.poll() is None:
                _killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 3.0
        for p in self.procs:
            try:
                p.wait(timeout=max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _killpg(p.pid, signal.SIGKILL)
                try:
                    p.wait(timeout=3)
                except subprocess.TimeoutExpired:
                    errors.append(f"pid {p.pid} did not die on SIGKILL")
        # Anything else still in our namespaces (a worker an agent started in a group of its
        # own): found by namespace, killed by pid.
        for pid in self.pids_in_namespaces():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5.0
        while self.pids_in_namespaces() and time.monotonic() < deadline:
            time.sleep(0.02)
        left = self.pids_in_namespaces()
        if left:
            errors.append(f"processes still in the cluster's namespaces: {left}")
        for link in self.links.values():
            p = link.forwarder
            if p is not None and p.poll() is None:
                try:
                    p.stdin.close()
                except OSError:
                    pass
                p.terminate()
                try:
                    p.wait(timeout=3)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            if p is not None:
                for stream in (p.stdin, p.stdout, p.stderr):
                    try:
                        stream.close()
                    except OSError:
                        pass
        for link in self.links.values():
            r = _cmd(["ip", "netns", "del", link.netns], check=False)
            if r.returncode != 0 and "No such file" not in r.stderr:
                errors.append(f"`ip netns del {link.netns}` failed: {r.stderr.strip()}")
        for dev in [link.host_dev for link in self.links.values()] + [self.ifb, self.bridge]:
            if _link_exists(dev):
                r = _cmd(["ip", "link", "del", dev], check=False)
                if r.returncode != 0 and _link_exists(dev):
                    errors.append(f"`ip link del {dev}` failed: {r.stderr.strip()}")
        if not errors and not self.leftovers():
            try:
                os.unlink(self._registry_path)
            except FileNotFoundError:
                pass
        elif not errors:
            errors.append(f"left behind: {self.leftovers()}")
        with _live_lock:
            _live.discard(self)
        self._note(f"cluster {self.tag}: removed" if not errors else
                   f"cluster {self.tag}: removing failed: {'; '.join(errors)}")
        if self._log_file:
            self._log_file.close()
        return errors

    def leftovers(self):
        """What of this cluster still exists: namespaces, links, processes (empty when clean)."""
        out = []
        existing = set(_netns_list())
        out += [f"netns {link.netns}" for link in self.links.values() if link.netns in existing]
        devs = [link.host_dev for link in self.links.values()] + [self.ifb, self.bridge]
        out += [f"link {d}" for d in devs if _link_exists(d)]
        out += [f"pid {p.pid}" for p in self.procs if _pid_alive(p.pid)]
        out += [f"forwarder pid {link.forwarder.pid}" for link in self.links.values()
                if link.forwarder is not None and _pid_alive(link.forwarder.pid)]
        return out

    # ------------------------------------------------------------ addresses and processes

    def _canon(self, node):
        if node in ("coordinator", COORDINATOR):
            return COORDINATOR
        if isinstance(node, int):
            node = f"n{node}"
        if node not in self.names:
            raise NetnsError(f"no node '{node}' in this cluster (nodes: {', '.join(self.names)})")
        return node

    def _link(self, node):
        return self.links[self._canon(node)]

    def address(self, node):
        """The node's address on the cluster's subnet."""
        return self._link(node).address

    def netns(self, node):
        """The node's network namespace name (`ip netns exec NAME ...`)."""
        return self._link(node).netns

    def netns_path(self, node):
        return f"/run/netns/{self.netns(node)}"

    def elapsed(self):
        return time.monotonic() - self._t0

    def popen(self, node, argv, *, env=None, stdout=None, stderr=None, stdin=subprocess.DEVNULL,
              cwd=None, via="ip-netns-exec", **kwargs):
        """Starts `argv` in the node's namespace (`ip netns exec`, which also gives it a /sys of
        that namespace; via="nsenter" keeps the mount namespace). The process leads a session
        of its own; close() ends it and anything left in the namespace, by pid."""
        link = self._link(node)
        if via == "nsenter":
            prefix = ["nsenter", f"--net=/run/netns/{link.netns}", "--"]
        else:
            prefix = ["ip", "netns", "exec", link.netns]
        p = subprocess.Popen(prefix + list(argv), env=env, stdout=stdout, stderr=stderr,
                             stdin=stdin, cwd=cwd, start_new_session=True, **kwargs)
        with self._lock:
            self.procs.append(p)
        # Returns once the process is inside the namespace, so that from here on a sweep by
        # namespace finds it (until then it is `ip` or `nsenter` in the root namespace).
        try:
            target = os.stat(f"/run/netns/{link.netns}")
            deadline = time.monotonic() + 10
            while p.poll() is None and time.monotonic() < deadline:
                try:
                    st = os.stat(f"/proc/{p.pid}/ns/net")
                except OSError:
                    break
                if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
                    break
                time.sleep(0.001)
        except OSError:
            pass
        return p

    def run(self, node, argv, timeout=30, check=True):
        """Runs `argv` in the node's namespace to completion; returns CompletedProcess."""
        r = subprocess.run(["ip", "netns", "exec", self.netns(node)] + list(argv),
                           capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise NetnsError(f"`{' '.join(argv)}` in {node} failed (exit {r.returncode}): "
                             f"{(r.stderr or r.stdout).strip()}")
        return r

    def socket(self, node, family=socket.AF_INET, type=socket.SOCK_STREAM, proto=0):
        """A socket of this process that lives in the node's namespace."""
        return socket_in_netns(self.netns_path(node), family, type, proto)

    def pids_in_namespaces(self):
        """Every live process whose network namespace is one of this cluster's."""
        inodes = set()
        for link in self.links.values():
            try:
                st = os.stat(f"/run/netns/{link.netns}")
                inodes.add((st.st_dev, st.st_ino))
            except OSError:
                pass
        return _pids_in(inodes)

    # ------------------------------------------------------------ logging

    def _note(self, text):
        line = f"[netns {self.elapsed():8.3f}s] {text}"
        if self.verbose:
            print(line, file=sys.stderr, flush=True)
        if self._log_file:
            self._log_file.write(line + "\n")
            self._log_file.flush()

    # ------------------------------------------------------------ small network helpers

    def listener(self, node, port=0):
        """A TCP listener in the node's namespace that accepts and closes connections (for
        reachability checks); one per node, kept until close()."""
        node = self._canon(node)
        with self._lock:
            if node not in self._listeners:
                self._listeners[node] = _AcceptLoop(self.socket(node), self.address(node), port)
            return self._listeners[node]

    def tcp_reachable(self, src, dst, timeout=1.0):
        """Whether a TCP connection from src to dst's listener completes within timeout."""
        lst = self.listener(dst)
        s = self.socket(src)
        try:
            s.settimeout(timeout)
            s.connect((self.address(dst), lst.port))
            return True
        except OSError:
            return False
        finally:
            s.close()


class _AcceptLoop:
    def __init__(self, sock, address, port):
        self.sock = sock
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(128)
        self.port = sock.getsockname()[1]
        self._stop = False
        self.thread = threading.Thread(target=self._loop, daemon=True, name="netns-accept")
        self.thread.start()

    def _loop(self):
        while not self._stop:
            r, _, _ = select.select([self.sock], [], [], 0.1)
            if r:
                try:
                    c, _ = self.sock.accept()
                    c.close()
                except OSError:
                    pass

    def close(self):
        self._stop = True
        self.thread.join(timeout=2)
        self.sock.close()


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "sweep":
        gone = sweep_stale(everything="--all" in sys.argv)
        print("\n".join(gone) if gone else "nothing to remove")
    elif len(sys.argv) >= 2 and sys.argv[1] == "can-run":
        ok, why = can_run()
        print("yes" if ok else f"no: {why}")
        raise SystemExit(0 if ok else 77)
    else:
        print("usage: cluster.py sweep [--all] | can-run", file=sys.stderr)
        raise SystemExit(2)
