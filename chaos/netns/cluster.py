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

Which mechanism each fault uses (each application is logged with it; see README.md):

    cut, isolate_coordinator, flap   the root-namespace end of the link set down (veth/TAP)
    split                            cls_bpf (classic BPF) on each bridge port's egress that
                                     matches the other side's source MACs -> mirred to a
                                     downed ifb (no gact here to drop with)
    drop (one direction)             cls_bpf matching every frame but ARP on the bridge port's
                                     egress (toward the node, "in") or ingress (from it, "out")
                                     -> mirred to a downed ifb
    loss                             a forwarder link: seeded loss in the forwarder; else netem
                                     where the kernel has it; else cls_bpf with a classic-BPF
                                     random match (prandom: NOT seeded, not replayable)
    rate                             tbf at the root of both ends' egress
    delay (+ jitter)                 a forwarder link: the forwarder (seeded, FIFO per
                                     direction); else netem where the kernel has it; else an
                                     error that says to give the node a forwarder link

Faults can also be applied by name and time from a scenario (scenario.py):
`c.play(scenario)`.

A real troupe job across the namespaces (troupe_job.py does this and keeps pids and logs):

    ip netns exec <coord ns> troupe coordinator --host <coord address> --port 29400 \\
        --world 4 --run-dir RUN_DIR
    ip netns exec <n1 ns> troupe agent --coordinator <coord address>:29400 \\
        --join-token RUN_DIR/join.token --ranks 2        # and the same in n2

    from troupe_job import TroupeJob
    job = TroupeJob(c, "build/cli/troupe", run_dir, ["--world", "4"], agents={"n1": 2, "n2": 2})
    job.start(); rc = job.wait(600); print(job.pids(), job.log("coord"))

Everything a cluster makes is recorded first in /run/troupe-netns/ with its owner (pid,
start time); a harness killed by SIGKILL cannot clean up, so the next cluster made on the
machine removes what owners that are gone left, as does `python3 cluster.py sweep`.
"""

import atexit
import ctypes
import fcntl
import ipaddress
import itertools
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))

COORDINATOR = "coord"
NETNS_PREFIX = "troupe"     # namespaces: troupe-<pid>-<k>-<node>
LINK_PREFIX = "tq"          # root-namespace links: tq<pid base36>-<k base36><kind><index>
LOCK_PATH = ("/run/lock/troupe-netns.lock" if os.path.isdir("/run/lock")
             else "/tmp/troupe-netns.lock")
REGISTRY = "/run/troupe-netns"   # one record per live cluster: its owner and what it made
SUBNET_POOL = ipaddress.ip_network("10.200.0.0/13")  # 10.200.0.0 - 10.207.255.255, in /24s

_counter = itertools.count(1)
_live = set()            # clusters not yet closed, for atexit and signals
_live_lock = threading.RLock()
_netem = None            # cached probe result: True / False / None (not probed)


class NetnsError(RuntimeError):
    """A step of building, faulting or removing a cluster failed; the message names the
    command and why."""


# ---------------------------------------------------------------- commands

def _cmd(argv, input=None, check=True, timeout=30):
    """Runs one command; on failure raises NetnsError naming the command and its stderr."""
    try:
        r = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as e:
        raise NetnsError(f"`{' '.join(argv)}` failed: {e.strerror} ({argv[0]} not installed?)")
    except subprocess.TimeoutExpired:
        raise NetnsError(f"`{' '.join(argv)}` did not finish within {timeout}s")
    if check and r.returncode != 0:
        why = (r.stderr or r.stdout).strip() or "no output"
        raise NetnsError(f"`{' '.join(argv)}` failed (exit {r.returncode}): {why}")
    return r


def _base36(n):
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    s = ""
    while True:
        n, r = divmod(n, 36)
        s = digits[r] + s
        if n == 0:
            return s


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def stable_seed(*parts):
    """A 32-bit seed from strings and numbers, the same in every run and Python version."""
    return zlib.crc32("/".join(str(p) for p in parts).encode())


# ---------------------------------------------------------------- can I run?

def can_run():
    """(True, "") where namespaces can be made here, else (False, the reason)."""
    if os.geteuid() != 0:
        return False, "network namespaces need root (euid is %d)" % os.geteuid()
    for tool in ("ip", "tc"):
        path = os.environ.get("PATH", "/usr/bin").split(":") + ["/usr/sbin", "/sbin"]
        if not any(os.access(os.path.join(d, tool), os.X_OK) for d in path):
            return False, f"`{tool}` (iproute2) is not installed"
    name = f"{NETNS_PREFIX}-{os.getpid()}-probe{next(_counter)}"
    r = _cmd(["ip", "netns", "add", name], check=False)
    if r.returncode != 0:
        return False, f"`ip netns add` failed: {(r.stderr or r.stdout).strip()}"
    _cmd(["ip", "netns", "del", name], check=False)
    return True, ""


def can_run_forwarder(forwarder_bin=None):
    """(True, "") where forwarder links can be made: /dev/net/tun and the built forwarder."""
    ok, why = can_run()
    if not ok:
        return ok, why
    if not os.path.exists("/dev/net/tun"):
        return False, "/dev/net/tun is missing (no TUN/TAP in this kernel)"
    path = forwarder_bin or default_forwarder_bin()
    if not path or not os.access(path, os.X_OK):
        return False, f"the forwarder is not built ({path}); build target tap_forwarder"
    return True, ""


def default_forwarder_bin():
    return (os.environ.get("TROUPE_TAP_FORWARDER")
            or os.path.join(REPO, "build", "chaos", "tap_forwarder"))


def netem_available():
    """Whether this kernel has sch_netem (probed once, in a throwaway namespace)."""
    global _netem
    if _netem is None:
        name = f"{NETNS_PREFIX}-{os.getpid()}-probe{next(_counter)}"
        if _cmd(["ip", "netns", "add", name], check=False).returncode != 0:
            return False
        try:
            r = _cmd(["tc", "-n", name, "qdisc", "add", "dev", "lo", "root", "netem", "delay",
                      "1ms"], check=False)
            _netem = r.returncode == 0
        finally:
            _cmd(["ip", "netns", "del", name], check=False)
    return _netem


def require_netns(forwarder=False):
    """For tests: exits 77 (ctest SKIP_RETURN_CODE) with the reason where a cluster cannot be
    made here."""
    ok, why = can_run_forwarder() if forwarder else can_run()
    if not ok:
        print(f"SKIP: {why}", flush=True)
        raise SystemExit(77)


# ---------------------------------------------------------------- classic BPF for cls_bpf

_LD_W_ABS, _LD_H_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x28, 0x15, 0x35, 0x06
_SKF_AD_OFF = -0x1000
_SKF_AD_PROTOCOL, _SKF_AD_RANDOM = 0, 56
_MATCH, _NO_MATCH = 0xFFFFFFFF, 0   # cls_bpf: -1 = the filter matches (its action runs)


def _ancillary(off):
    return (_SKF_AD_OFF + off) & 0xFFFFFFFF


def _bytecode(prog):
    """tc's `bytecode` argument: "N,code jt jf k,..." ."""
    return ",".join([str(len(prog))] + [f"{c} {jt} {jf} {k & 0xFFFFFFFF}" for c, jt, jf, k in prog])


def bpf_all_but_arp():
    """Matches every frame but ARP (one-way drop)."""
    return [(_LD_W_ABS, 0, 0, _ancillary(_SKF_AD_PROTOCOL)),
            (_JEQ_K, 0, 1, 0x0806),
            (_RET_K, 0, 0, _NO_MATCH),
            (_RET_K, 0, 0, _MATCH)]


def bpf_random_ipv4(probability):
    """Matches an IPv4 frame with `probability` (the kernel's prandom: not seeded)."""
    threshold = int(round(probability * 2 ** 32))
    if threshold >= 2 ** 32:
        return [(_LD_W_ABS, 0, 0, _ancillary(_SKF_AD_PROTOCOL)),
                (_JEQ_K, 0, 1, 0x0800),
                (_RET_K, 0, 0, _MATCH),
                (_RET_K, 0, 0, _NO_MATCH)]
    return [(_LD_W_ABS, 0, 0, _ancillary(_SKF_AD_PROTOCOL)),
            (_JEQ_K, 0, 3, 0x0800),                          # not IPv4 -> no match
            (_LD_W_ABS, 0, 0, _ancillary(_SKF_AD_RANDOM)),
            (_JGE_K, 1, 0, threshold),                       # rand >= p * 2^32 -> no match
            (_RET_K, 0, 0, _MATCH),
            (_RET_K, 0, 0, _NO_MATCH)]


def bpf_source_mac_in(macs):
    """Matches a frame whose Ethernet source is one of `macs` (cls_bpf sees the frame from its
    MAC header on egress and, pushed back by cls_bpf, on ingress)."""
    prog = []
    n = len(macs)
    for i, mac in enumerate(macs):
        b = bytes(int(x, 16) for x in mac.split(":"))
        hi, lo = int.from_bytes(b[:4], "big"), int.from_bytes(b[4:], "big")
        left = n - i - 1                       # MAC blocks after this one (4 instructions each)
        to_match = 4 * left + 1                # from this block's last jump to the match return
        prog += [(_LD_W_ABS, 0, 0, 6),
                 (_JEQ_K, 0, 2, hi),           # no: skip to the next block
                 (_LD_H_ABS, 0, 0, 10),
                 (_JEQ_K, to_match, 0, lo)]
    prog += [(_RET_K, 0, 0, _NO_MATCH), (_RET_K, 0, 0, _MATCH)]
    return prog


# ---------------------------------------------------------------- namespaces as sockets

_libc = ctypes.CDLL(None, use_errno=True)
_CLONE_NEWNET = 0x40000000


def socket_in_netns(netns_path, family=socket.AF_INET, type=socket.SOCK_STREAM, proto=0):
    """A socket created inside the network namespace at `netns_path` (a socket belongs to
    the namespace it was made in, whoever uses it later). A short-lived thread enters the
    namespace, so this process stays where it is."""
    out = {}

    def body():
        try:
            fd = os.open(netns_path, os.O_RDONLY)
            try:
                if _libc.setns(fd, _CLONE_NEWNET) != 0:
                    e = ctypes.get_errno()
                    raise NetnsError(f"setns({netns_path}) failed: {os.strerror(e)}")
            finally:
                os.close(fd)
            out["sock"] = socket.socket(family, type, proto)
        except BaseException as e:  # handed to the caller's thread
            out["error"] = e

    t = threading.Thread(target=body, name="netns-socket")
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["sock"]


# ---------------------------------------------------------------- faults

class Fault:
    """One applied fault. `revert()` undoes it (idempotent); `method` names the mechanism that
    made it (link-down, cls_bpf-mirred, cls_bpf-random, tbf, forwarder, netem) and `mechanism`
    says it in words, with the devices."""

    def __init__(self, cluster, kind, target, params, method, mechanism, undo):
        self.cluster = cluster
        self.kind = kind
        self.target = target
        self.params = dict(params)
        self.method = method          # short and the same in every cluster: "link-down", "tbf", ...
        self.mechanism = mechanism    # the words for a person, with this cluster's devices
        self._undo = undo
        self.active = True
        self.applied_at = cluster.elapsed()

    def revert(self):
        with self.cluster._lock:
            if not self.active:
                return
            self.active = False
            if self.cluster._closed and self.kind != "flap":
                return      # its devices are gone with the cluster (a flap still has a thread)
            try:
                self._undo()
            finally:
                if self in self.cluster.faults:
                    self.cluster.faults.remove(self)
                self.cluster._log("revert", self.kind, self.target, self.params, self.method,
                                  self.mechanism)

    def __repr__(self):
        return f"Fault({self.kind} {self.target} {self.params} via {self.mechanism})"


PARTITION_KINDS = ("cut", "isolate_coordinator", "split", "drop", "flap")


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


class Cluster:
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
        global _closing
        with self._lock:
            if self._closed:
                return
            self._closed = True
        _closing += 1
        try:
            errors = self._teardown()
        finally:
            _closing -= 1
        main = threading.current_thread() is threading.main_thread()
        if _pending_sigterm and _closing == 0 and main:
            raise Terminated(128 + signal.SIGTERM)
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

    def _log(self, action, kind, target, params, method, mechanism):
        entry = {"t": round(self.elapsed(), 4), "action": action, "fault": kind, "target": target,
                 "params": params, "method": method, "mechanism": mechanism}
        self.log.append(entry)
        shown = " ".join(f"{k}={v}" for k, v in params.items())
        self._note(f"{action} {kind} {target} {shown} via {mechanism}".replace("  ", " "))

    # ------------------------------------------------------------ building blocks

    def _set_link(self, link, reason, down):
        """Adds or removes a reason for the link to be down; the link is down while any remains."""
        was_down = bool(link.down_reasons)
        if down:
            link.down_reasons.add(reason)
        else:
            link.down_reasons.discard(reason)
        now_down = bool(link.down_reasons)
        if now_down != was_down:
            _cmd(["ip", "link", "set", link.host_dev, "down" if now_down else "up"])

    def _ensure_ifb(self):
        if not self._ifb_made:
            # Left down on purpose: mirred into a device that is down drops the frame (there
            # is no gact action in this kernel to drop with).
            _cmd(["ip", "link", "add", self.ifb, "type", "ifb"])
            self._ifb_made = True

    def _drop_filter(self, dev, hook, prog):
        """Frames matching `prog` at `hook` (ingress/egress) of root-namespace `dev` are
        redirected to the downed ifb, i.e. dropped. Returns the undo."""
        self._ensure_ifb()
        if dev not in self._clsact:
            _cmd(["tc", "qdisc", "add", "dev", dev, "clsact"])
            self._clsact.add(dev)
        pref = str(next(self._pref))
        _cmd(["tc", "filter", "add", "dev", dev, hook, "pref", pref, "protocol", "all", "bpf",
              "bytecode", _bytecode(prog), "action", "mirred", "egress", "redirect", "dev",
              self.ifb])

        def undo():
            if _link_exists(dev):
                _cmd(["tc", "filter", "del", "dev", dev, hook, "pref", pref, "protocol", "all"])
        return undo

    def _egress_end(self, link, direction):
        """(namespace or None, device) whose egress carries `direction` ("in": toward the node)."""
        return (None, link.host_dev) if direction == "in" else (link.netns, link.inner_dev)

    def _render_egress(self, link, direction):
        """Puts the wanted tbf / netem at the root of one end's egress. Faults of one kind that
        overlap stack: the latest wins until it is reverted."""
        netns, dev = self._egress_end(link, direction)
        tc = ["tc"] + (["-n", netns] if netns else [])
        want = {}
        for _, key, value in link.egress[direction]:
            want[key] = value
        _cmd(tc + ["qdisc", "del", "dev", dev, "root"], check=False)
        tbf = None
        if "rate" in want:
            mbit = want["rate"]
            rate_bytes = mbit * 1e6 / 8
            burst = max(int(rate_bytes * 0.004), 4 * (self.mtu + 14), 32 * 1024)
            tbf = ["tbf", "rate", f"{mbit}mbit", "burst", str(burst), "latency", "200ms"]
        netem = want.get("netem_delay", []) + want.get("netem_loss", [])
        if tbf and netem:
            _cmd(tc + ["qdisc", "add", "dev", dev, "root", "handle", "1:"] + tbf)
            _cmd(tc + ["qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", "netem"]
                 + netem)
        elif tbf:
            _cmd(tc + ["qdisc", "add", "dev", dev, "root"] + tbf)
        elif netem:
            _cmd(tc + ["qdisc", "add", "dev", dev, "root", "netem"] + netem)

    def _egress_fault(self, link, directions, key, value):
        token = object()
        for d in directions:
            link.egress[d].append((token, key, value))
            self._render_egress(link, d)

        def undo():
            for d in directions:
                link.egress[d] = [e for e in link.egress[d] if e[0] is not token]
                if self._ns_alive(link):
                    self._render_egress(link, d)
        return undo

    def _shaping_fault(self, link, kind, directions, args):
        """Sets the forwarder's `kind` (delay or loss) for each direction; overlapping faults
        stack, and a revert restores the one below (or none)."""
        token = object()

        def send(d):
            stack = link.shaping.get((kind, d), [])
            top = stack[-1][1] if stack else ("0 0 0" if kind == "delay" else "0 0")
            if link.forwarder is not None and link.forwarder.poll() is None:
                self._forwarder_command(link, f"{kind} {d} {top}")

        for d in directions:
            link.shaping.setdefault((kind, d), []).append((token, args))
            send(d)

        def undo():
            for d in directions:
                link.shaping[(kind, d)] = [e for e in link.shaping[(kind, d)] if e[0] is not token]
                send(d)
        return undo

    def _ns_alive(self, link):
        return os.path.exists(f"/run/netns/{link.netns}")

    def _add(self, kind, target, params, method, mechanism, undo):
        f = Fault(self, kind, target, params, method, mechanism, undo)
        self.faults.append(f)
        self._log("apply", kind, target, params, method, mechanism)
        return f

    @staticmethod
    def _directions(direction):
        if direction not in ("in", "out", "both"):
            raise NetnsError(f"direction must be in, out or both, got '{direction}'")
        return ["in", "out"] if direction == "both" else [direction]

    # ------------------------------------------------------------ faults

    def cut(self, node):
        """Partition: the node's link goes down (its bridge port, veth or TAP)."""
        with self._lock:
            link = self._link(node)
            reason = object()
            self._set_link(link, reason, True)
            return self._add("cut", link.name, {}, "link-down",
                             f"{link.kind} down (ip link set {link.host_dev} down)",
                             lambda: self._set_link(link, reason, False))

    def isolate_coordinator(self):
        """The coordinator's namespace loses its link: no node reaches it, it reaches none."""
        with self._lock:
            link = self._link(COORDINATOR)
            reason = object()
            self._set_link(link, reason, True)
            return self._add("isolate_coordinator", COORDINATOR, {}, "link-down",
                             f"{link.kind} down (ip link set {link.host_dev} down)",
                             lambda: self._set_link(link, reason, False))

    def split(self, side_a, side_b=None):
        """Two halves that keep their links but cannot reach each other. side_b defaults to
        every other namespace (the coordinator included)."""
        with self._lock:
            a = [self._canon(x) for x in side_a]
            b = [self._canon(x) for x in side_b] if side_b is not None else \
                [x for x in self.names if x not in a]
            if not a or not b or set(a) & set(b):
                raise NetnsError(f"split needs two disjoint, non-empty sides, got {a} and {b}")
            undos = []
            try:
                for mine, theirs in ((a, b), (b, a)):
                    macs = [self.links[x].mac for x in theirs]
                    for x in mine:
                        undos.append(self._drop_filter(self.links[x].host_dev, "egress",
                                                       bpf_source_mac_in(macs)))
            except Exception:
                for u in undos:
                    u()
                raise

            def undo():
                for u in undos:
                    u()
            return self._add("split", a, {"side_b": b}, "cls_bpf-mirred",
                             "cls_bpf source-MAC match on each bridge port's egress -> mirred to "
                             f"downed ifb {self.ifb}", undo)

    def drop(self, node, direction="in"):
        """One direction only: "in" drops every frame toward the node, "out" every frame from
        it (ARP passes; neighbours are permanent anyway)."""
        with self._lock:
            link = self._link(node)
            if direction not in ("in", "out"):
                raise NetnsError(f"drop: direction must be in or out, got '{direction}'")
            hook = "egress" if direction == "in" else "ingress"
            undo = self._drop_filter(link.host_dev, hook, bpf_all_but_arp())
            return self._add("drop", link.name, {"direction": direction}, "cls_bpf-mirred",
                             f"cls_bpf match-all-but-ARP on {link.host_dev} {hook} -> mirred to "
                             f"downed ifb {self.ifb}", undo)

    def loss(self, node, probability, direction="both", seed=None, mechanism=None):
        """Drops IPv4 frames on the node's link with `probability`. A forwarder link draws from
        `seed` (replayable); netem where the kernel has it; else a classic-BPF random match
        (not seeded). mechanism= "forwarder" | "netem" | "bpf" forces one."""
        if not 0 <= probability <= 1:
            raise NetnsError(f"loss probability must be in [0, 1], got {probability}")
        with self._lock:
            link = self._link(node)
            dirs = self._directions(direction)
            mech = mechanism or ("forwarder" if link.kind == "tap" else
                                 "netem" if netem_available() else "bpf")
            params = {"probability": probability, "direction": direction}
            if mech == "forwarder":
                if link.kind != "tap":
                    raise NetnsError(f"loss via forwarder: {link.name} has no forwarder link "
                                     "(Cluster(forwarder=[...]))")
                seed = stable_seed(self.seed, link.name, "loss") if seed is None else int(seed)
                params["seed"] = seed
                undo = self._shaping_fault(link, "loss", dirs, f"{probability} {seed}")
                return self._add("loss", link.name, params, "forwarder",
                                 f"tap_forwarder seeded loss of IPv4 frames (seed {seed}, "
                                 "replayable)",
                                 undo)
            if mech == "netem":
                undo = self._egress_fault(link, dirs, "netem_loss",
                                          ["loss", f"{probability * 100}%"])
                return self._add("loss", link.name, params, "netem",
                                 "netem loss on the link's egress", undo)
            if mech != "bpf":
                raise NetnsError(f"loss: unknown mechanism '{mech}' (forwarder, netem, bpf)")
            undos = [self._drop_filter(link.host_dev, "egress" if d == "in" else "ingress",
                                       bpf_random_ipv4(probability)) for d in dirs]

            def undo():
                for u in undos:
                    u()
            return self._add("loss", link.name, params, "cls_bpf-random",
                             f"cls_bpf classic-BPF random match (kernel prandom, not seeded) on "
                             f"{link.host_dev} -> mirred to downed ifb {self.ifb}", undo)

    def rate(self, node, mbit, direction="both"):
        """A bandwidth cap of `mbit` Mbit/s: tbf at the egress of both ends of the link."""
        if mbit <= 0:
            raise NetnsError(f"rate must be positive, got {mbit} mbit")
        with self._lock:
            link = self._link(node)
            undo = self._egress_fault(link, self._directions(direction), "rate", mbit)
            return self._add("rate", link.name, {"mbit": mbit, "direction": direction}, "tbf",
                             f"tbf on {link.host_dev} (toward the node) and {link.inner_dev} in "
                             f"{link.netns} (from it)" if direction == "both" else "tbf", undo)

    def delay(self, node, ms, jitter_ms=0, direction="both", seed=None):
        """Holds each frame ms ± jitter_ms (uniform) on the node's link, in FIFO order per
        direction (so TCP sees no reordering): the forwarder on a forwarder link, netem where
        the kernel has it. A round trip over one delayed link takes about 2 × ms."""
        if ms < 0 or jitter_ms < 0 or jitter_ms > ms:
            raise NetnsError(f"delay needs 0 <= jitter_ms <= ms, got {ms} ± {jitter_ms}")
        with self._lock:
            link = self._link(node)
            dirs = self._directions(direction)
            params = {"ms": ms, "jitter_ms": jitter_ms, "direction": direction}
            if link.kind == "tap":
                seed = stable_seed(self.seed, link.name, "delay") if seed is None else int(seed)
                params["seed"] = seed
                undo = self._shaping_fault(link, "delay", dirs,
                                           f"{int(ms * 1000)} {int(jitter_ms * 1000)} {seed}")
                return self._add("delay", link.name, params, "forwarder",
                                 f"tap_forwarder (user space, seed {seed}, FIFO per direction)",
                                 undo)
            if netem_available():
                netem = ["delay", f"{ms}ms"] + ([f"{jitter_ms}ms"] if jitter_ms else [])
                undo = self._egress_fault(link, dirs, "netem_delay", netem)
                return self._add("delay", link.name, params, "netem",
                                 "netem delay on the link's egress", undo)
            raise NetnsError(f"delay on {link.name}: this kernel has no netem; give the node a "
                             f"forwarder link (Cluster(..., forwarder=['{link.name}']))")

    def flap(self, node, period=2.0, down_for=None):
        """The link goes down for `down_for` (default half the period) at the start of every
        period, until reverted."""
        if period <= 0:
            raise NetnsError(f"flap period must be positive, got {period}")
        down_for = period / 2 if down_for is None else down_for
        with self._lock:
            link = self._link(node)
            stop = threading.Event()
            reason = object()

            def toggle(down):
                # The lock is taken in short tries: undo() holds it while it waits for this
                # thread to end.
                while not stop.is_set():
                    if self._lock.acquire(timeout=0.05):
                        try:
                            if not stop.is_set():
                                self._set_link(link, reason, down)
                                word = "down" if down else "up"
                                self._note(f"flap {link.name}: {word} "
                                           f"(ip link set {link.host_dev} {word})")
                        finally:
                            self._lock.release()
                        return

            def loop():
                start = time.monotonic()
                k = 0
                while not stop.is_set():
                    t = start + k * period
                    if stop.wait(max(0.0, t - time.monotonic())):
                        break
                    toggle(True)
                    if stop.wait(max(0.0, t + down_for - time.monotonic())):
                        break
                    toggle(False)
                    k += 1

            thread = threading.Thread(target=loop, name=f"flap-{link.name}", daemon=True)

            def undo():
                stop.set()
                if thread is not threading.current_thread():
                    thread.join(timeout=5)
                if self._ns_alive(link):
                    self._set_link(link, reason, False)
            f = self._add("flap", link.name, {"period": period, "down_for": down_for}, "link-down",
                          f"{link.kind} down/up every {period}s (ip link set {link.host_dev})",
                          undo)
            thread.start()
            return f

    def heal(self, node=None):
        """Ends partitions (cut, isolation, split, one-way drop, flap) that involve `node`, or
        all of them; delay, loss and rate stay."""
        with self._lock:
            name = self._canon(node) if node is not None else None
            for f in list(self.faults):
                sides = (f.target if isinstance(f.target, list) else []) + \
                    list(f.params.get("side_b", []))
                involved = name is None or f.target == name or name in sides
                if f.kind in PARTITION_KINDS and involved:
                    f.revert()

    def clear(self):
        """Reverts every active fault."""
        with self._lock:
            for f in list(reversed(self.faults)):
                f.revert()

    def fault(self, kind, target=None, **params):
        """Applies a fault by name (as scenarios name them); returns its Fault."""
        if kind == "cut":
            return self.cut(target)
        if kind == "isolate_coordinator":
            return self.isolate_coordinator()
        if kind == "split":
            side_a = target if isinstance(target, list) else [target]
            return self.split(side_a, params.get("side_b"))
        if kind == "drop":
            return self.drop(target, params.get("direction", "in"))
        if kind == "loss":
            return self.loss(target, params["probability"], params.get("direction", "both"),
                             params.get("seed"), params.get("mechanism"))
        if kind == "rate":
            return self.rate(target, params["mbit"], params.get("direction", "both"))
        if kind == "delay":
            return self.delay(target, params["ms"], params.get("jitter_ms", 0),
                              params.get("direction", "both"), params.get("seed"))
        if kind == "flap":
            return self.flap(target, params.get("period", 2.0), params.get("down_for"))
        raise NetnsError(f"unknown fault '{kind}' (cut, isolate_coordinator, split, drop, loss, "
                         "rate, delay, flap)")

    def play(self, scenario, start=True):
        """Runs a scenario's timed faults in a background thread (scenario.ScenarioRun)."""
        import scenario as scenario_mod
        run = scenario_mod.ScenarioRun(self, scenario)
        self._runs.append(run)
        if start:
            run.start()
        return run

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


# ---------------------------------------------------------------- helpers

def _readline(stream, timeout):
    r, _, _ = select.select([stream], [], [], timeout)
    return stream.readline() if r else ""


def _disable_ipv6(dev):
    try:
        with open(f"/proc/sys/net/ipv6/conf/{dev}/disable_ipv6", "w") as f:
            f.write("1")
    except OSError:
        pass    # no IPv6 at all: nothing to silence


def _link_exists(dev):
    return os.path.exists(f"/sys/class/net/{dev}")


def _killpg(pid, sig):
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _pids_in(inodes):
    if not inodes:
        return []
    me = os.getpid()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            st = os.stat(f"/proc/{entry}/ns/net")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in inodes and _pid_alive(int(entry)):
            out.append(int(entry))
    return out


def _netns_list():
    try:
        return sorted(os.listdir("/run/netns"))
    except FileNotFoundError:
        return []


def _free_subnet(start):
    """A /24 of SUBNET_POOL that no address or route of the root namespace overlaps (the
    caller holds LOCK_PATH until its bridge has the address)."""
    used = []
    for argv in (["ip", "-4", "-o", "addr", "show"], ["ip", "-4", "route", "show", "table", "all"]):
        for line in _cmd(argv).stdout.splitlines():
            for word in line.split():
                if re.fullmatch(r"\d+\.\d+\.\d+\.\d+(/\d+)?", word):
                    try:
                        used.append(ipaddress.ip_network(word, strict=False))
                    except ValueError:
                        pass
    subnets = list(SUBNET_POOL.subnets(new_prefix=24))
    for i in range(len(subnets)):
        candidate = subnets[(start + i) % len(subnets)]
        if not any(candidate.overlaps(u) for u in used if u.prefixlen > 0):
            return candidate
    raise NetnsError(f"no free /24 left in {SUBNET_POOL}")


def _proc_start_time(pid):
    """The start time of a process (clock ticks since boot): with the pid, it names one process
    even where pids are reused."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[-1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _owner():
    return {"pid": os.getpid(), "pidns": os.stat("/proc/self/ns/pid").st_ino,
            "start": _proc_start_time(os.getpid())}


def _owner_gone(owner):
    """Whether the process that made a cluster is gone (False where it cannot be told: another
    pid namespace)."""
    try:
        if owner["pidns"] != os.stat("/proc/self/ns/pid").st_ino:
            return False
    except OSError:
        return False
    return not _pid_alive(owner["pid"]) or _proc_start_time(owner["pid"]) != owner["start"]


def _remove_recorded(record):
    """Removes what one registry record names; returns what went."""
    removed = []
    inodes = set()
    existing = set(_netns_list())
    for ns in record.get("netns", []):
        if ns in existing:
            try:
                st = os.stat(f"/run/netns/{ns}")
                inodes.add((st.st_dev, st.st_ino))
            except OSError:
                pass
    for pid in _pids_in(inodes):
        try:
            os.kill(pid, signal.SIGKILL)
            removed.append(f"pid {pid}")
        except ProcessLookupError:
            pass
    for pid in record.get("forwarders", []):
        if _pid_alive(pid) and _proc_start_time(pid) is not None:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    is_forwarder = b"tap_forwarder" in f.read()
            except OSError:
                is_forwarder = False
            if is_forwarder:
                os.kill(pid, signal.SIGKILL)
                removed.append(f"forwarder pid {pid}")
    for ns in record.get("netns", []):
        if ns in existing and _cmd(["ip", "netns", "del", ns], check=False).returncode == 0:
            removed.append(f"netns {ns}")
    for dev in record.get("links", []):
        if _link_exists(dev) and _cmd(["ip", "link", "del", dev], check=False).returncode == 0:
            removed.append(f"link {dev}")
    return removed


def sweep_stale(everything=False):
    """Removes what clusters of processes that are gone left behind (a harness killed by
    SIGKILL cannot clean up): every cluster records its owner (pid, start time, pid
    namespace) and what it makes in REGISTRY before making it. everything=True removes every
    recorded cluster, live or not: only for a machine where no harness runs. Processes in
    those namespaces are killed by pid. Returns what was removed."""
    removed = []
    try:
        entries = sorted(os.listdir(REGISTRY))
    except FileNotFoundError:
        return removed
    for entry in entries:
        path = os.path.join(REGISTRY, entry)
        try:
            with open(path) as f:
                record = json.load(f)
        except (OSError, ValueError):
            continue
        if everything or _owner_gone(record.get("owner", {})):
            removed += _remove_recorded(record)
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
    return removed


class Terminated(SystemExit):
    """Raised in the main thread on SIGTERM, so that `with Cluster(...)` blocks unwind."""


_closing = 0              # clusters being closed right now
_pending_sigterm = False


def _on_sigterm(signum, frame):
    global _pending_sigterm
    if _closing:
        _pending_sigterm = True   # raised once the close is done: never half a teardown
        return
    raise Terminated(128 + signum)


_handlers_installed = False


def _install_handlers():
    """atexit closes what is still open; SIGTERM unwinds the main thread like Ctrl-C does
    (SIGINT raises KeyboardInterrupt by default already). A handler the program set itself is
    left alone."""
    global _handlers_installed
    if _handlers_installed:
        return
    _handlers_installed = True
    atexit.register(close_all)
    if threading.current_thread() is threading.main_thread():
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, _on_sigterm)
        if signal.getsignal(signal.SIGINT) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGINT, signal.default_int_handler)


def close_all():
    with _live_lock:
        clusters = list(_live)
    for c in clusters:
        try:
            c.close(raise_errors=False)
        except Exception as e:  # atexit: say it, keep going
            print(f"netns: closing cluster {c.tag}: {e}", file=sys.stderr)


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
