"""What a cluster needs of the machine it runs on: commands (`ip`, `tc`) that fail with the
reason, whether namespaces, forwarder links and netem can be had here, sockets made inside a
namespace, processes found by namespace and killed by pid, a free subnet, and cleanup that
outlives the harness.

Everything a cluster makes is recorded first in REGISTRY (/run/troupe-netns/) with its owner
(pid, start time, pid namespace); a harness killed by SIGKILL cannot clean up, so the next
cluster made on the machine removes what owners that are gone left, as does
`python3 cluster.py sweep`. On SIGTERM the main thread unwinds its `with Cluster(...)` blocks
(Terminated), and atexit closes what is still open.
"""

import atexit
import contextlib
import ctypes
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


def pid_alive(pid):
    """Whether `pid` is a live process (a zombie counts as dead)."""
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


# ---------------------------------------------------------------- devices, processes, subnets

def _readline(stream, timeout):
    r, _, _ = select.select([stream], [], [], timeout)
    return stream.readline() if r else ""


def _disable_ipv6(dev):
    try:
        with open(f"/proc/sys/net/ipv6/conf/{dev}/disable_ipv6", "w") as f:
            f.write("1")
    except OSError:
        pass    # no IPv6 at all: nothing to silence


def _base36(n):
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    s = ""
    while True:
        n, r = divmod(n, 36)
        s = digits[r] + s
        if n == 0:
            return s


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
        if (st.st_dev, st.st_ino) in inodes and pid_alive(int(entry)):
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


# ---------------------------------------------------------------- the registry of owners

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
    return not pid_alive(owner["pid"]) or _proc_start_time(owner["pid"]) != owner["start"]


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
        if pid_alive(pid) and _proc_start_time(pid) is not None:
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


# ---------------------------------------------------------------- SIGTERM and exit

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


@contextlib.contextmanager
def _sigterm_deferred():
    """Around a cluster's teardown: a SIGTERM that arrives inside waits until no teardown is
    running, then raises Terminated in the main thread."""
    global _closing
    _closing += 1
    try:
        yield
    finally:
        _closing -= 1
    main = threading.current_thread() is threading.main_thread()
    if _pending_sigterm and _closing == 0 and main:
        raise Terminated(128 + signal.SIGTERM)


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

