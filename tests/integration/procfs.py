"""What a test's processes hold, read from /proc: troupe's shared-memory segments, the TCP
connections between two processes, and every process a job started.

The segments are memfds (runtime/comm/shm_communicator.cpp names a group's segment
"troupe-g<generation>-<group>", shm_staging.cpp a process's staging "troupe-staging-<kind>"):
they never appear under /dev/shm and live exactly as long as a process holds one open or
mapped. A job's processes are found by a tag in their environment, which every child
inherits, also one that outlived its parent and was reparented."""

import os
import signal
import uuid

from harness import pid_alive, socket_inodes, tcp_rows

TAG = "TROUPE_TEST_TAG"
SEGMENT = "memfd:troupe-"


def tagged_env(base=None):
    """(environment, tag): `base` (default: this process's environment) with a new tag."""
    tag = uuid.uuid4().hex
    env = dict(os.environ if base is None else base)
    env[TAG] = tag
    return env, tag


def tagged_pids(tag):
    """The live processes whose environment carries `tag` (a zombie's reads empty)."""
    needle = f"{TAG}={tag}".encode()
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    pids.append(int(name))
        except OSError:
            continue
    return pids


def kill_tagged(tag):
    """SIGKILLs every process still carrying the job's tag (only processes the calling test
    started carry it)."""
    for pid in tagged_pids(tag):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def pids_with_args(*args):
    """The live processes whose command line holds every one of `args` (str) as a whole word."""
    wanted = [a.encode() for a in args]
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if all(w in argv for w in wanted) and pid_alive(int(name)):
            pids.append(int(name))
    return pids


def _segment_name(path):
    path = path.strip()
    if path.endswith(" (deleted)"):
        path = path[:-len(" (deleted)")]
    return path[path.index(SEGMENT) + len("memfd:"):]


def segments(pid):
    """The troupe segments `pid` holds, by a descriptor or by a mapping (a rank maps rank 0's
    segment and may close the descriptor it opened it with)."""
    names = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("/" + SEGMENT):
                names.add(_segment_name(target))
    except OSError:
        pass
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                cols = line.split(None, 5)
                if len(cols) == 6 and cols[5].startswith("/" + SEGMENT):
                    names.add(_segment_name(cols[5]))
    except OSError:
        pass
    return names


def segments_held(tag):
    """{pid: segment names} of the tagged processes that hold a troupe segment."""
    return {pid: names for pid in tagged_pids(tag) if (names := segments(pid))}


def tcp_pairs(pids):
    """The pairs (a, b), a < b, of `pids` connected to each other by an established TCP
    connection."""
    owner = {inode: pid for pid in pids for inode in socket_inodes(pid)}
    ends = []  # (local address, remote address, owning pid)
    for cols in tcp_rows():
        if cols[3] == "01" and cols[9] in owner:  # 01: ESTABLISHED
            ends.append((cols[1], cols[2], owner[cols[9]]))
    by_local = {local: pid for local, _, pid in ends}
    pairs = set()
    for _, remote, pid in ends:
        peer = by_local.get(remote)
        if peer is not None and peer != pid:
            pairs.add((min(pid, peer), max(pid, peer)))
    return pairs
