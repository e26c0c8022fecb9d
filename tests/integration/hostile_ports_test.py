"""Garbage at every port: while a 2-rank job trains, a hostile neighbour on the same machine
sends junk to every TCP port the job's processes listen on (found from /proc, so a listener
added later is attacked too). The job must finish with exit 0, with losses bit-identical to a
calm run of the same seed, the coordinator's memory within 64 MiB of the calm run's, and the
refusals counted in its metrics."""

import os
import random
import re
import socket
import struct
import threading
import time
import urllib.request

from harness import SMALL_MODEL, Job, fail, free_port, listening_ports, main, pid_alive, wait_until

# Two nodes and two pipeline stages, so the job has every kind of listener: the coordinator's
# control plane, the stage actor of stage 1, the key-value store, the metrics endpoint and the
# checkpoint replica servers.
ARGS = SMALL_MODEL + ["--world", "2", "--nodes", "2", "--pp", "2", "--steps", "4000",
                      "--checkpoint-every", "500", "--replicate-checkpoints"]
MEMORY_SLACK = 64 << 20
CONNECT_TIMEOUT = 0.5


def job_tree(root):
    """Every live process under `root` (its agents and workers), root first."""
    parents = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            pass
    tree, frontier = [root], [root]
    while frontier:
        children = [p for p, pp in parents.items() if pp in frontier]
        tree += children
        frontier = children
    return tree


def peak_rss(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def send_and_close(port, payload, linger=0.0):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=CONNECT_TIMEOUT) as s:
            s.settimeout(CONNECT_TIMEOUT)
            s.sendall(payload)
            if linger:
                time.sleep(linger)  # let the listener act on it before the connection ends
    except OSError:
        pass  # a listener that hangs up on garbage is doing its job


def attack(port, rng):
    """The battery of the issue, against one port."""
    # The message that crashed CAF's middleman: a big-endian BASP server handshake header
    # with payload length 0, then 80 zero bytes.
    crash = struct.pack(">BBBBIQQQ", 0, 0, 0, 0, 0, 0, 0, 0) + bytes(80)
    for _ in range(3):
        send_and_close(port, crash, linger=0.05)
    # BASP headers of every operation, both byte orders, payload lengths 0, 80 and 2^32-1.
    for op in range(8):
        for order in (">", "<"):
            for length in (0, 80, 2**32 - 1):
                header = struct.pack(order + "BBBBIQQQ", op, 0, 0, 0, length, 1, 2, 3)
                send_and_close(port, header + (bytes(length) if length == 80 else b""))
    # Frames whose length prefix says 2^30 and 2^32-1 (both byte orders).
    for length in (2**30, 2**32 - 1):
        for order in (">", "<"):
            send_and_close(port, struct.pack(order + "I", length) + b"x" * 64, linger=0.05)
    # An HTTP request with a 1 MiB header.
    send_and_close(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Junk: " + b"a" * (1 << 20) + b"\r\n\r\n")
    # Random payloads from 1 byte to 64 KiB.
    for _ in range(RANDOM_PER_PORT):
        n = rng.choice([1, 2, 7, 32, 100, 1000, 4096, rng.randint(1, 65536)])
        send_and_close(port, rng.randbytes(n))


def hold_open(ports, count, seconds):
    """`count` connections spread over `ports` that never send a byte, held for `seconds`."""
    held = []
    for i in range(count):
        try:
            held.append(socket.create_connection(("127.0.0.1", ports[i % len(ports)]),
                                                 timeout=CONNECT_TIMEOUT))
        except OSError:
            pass
    time.sleep(seconds)
    for s in held:
        s.close()
    return len(held)


def step_losses(events):
    return {e["step"]: e["loss"] for e in events if e.get("event") == "step"}


def metrics_url(job):
    found = re.search(r"metrics on (http://\S+/metrics)", job.output())
    return found.group(1) if found else None


def scrape(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def run_calm():
    with Job(ARGS + ["--metrics-port", str(free_port())]) as job:
        peak = 0
        while job.proc.poll() is None:
            peak = max(peak, peak_rss(job.proc.pid) or 0)
            time.sleep(0.05)
        if job.proc.returncode != 0:
            fail(f"the calm run exited {job.proc.returncode}:\n{job.output()[-3000:]}")
        return step_losses(job.events()), peak


RANDOM_PER_PORT = 0


def test():
    global RANDOM_PER_PORT
    calm_losses, calm_peak = run_calm()

    with Job(ARGS + ["--metrics-port", str(free_port())]) as job:
        wait_until(lambda: any(e.get("event") == "step" and e.get("step", 0) >= 5
                               for e in job.events()), 120, "the first steps")
        # Every listener exists once the pipeline stages and the replica servers are up.
        ports = wait_until(lambda: (lambda p: p if len(p) >= 4 else None)(
            listening_ports(job_tree(job.proc.pid))), 30, "the job's listeners")
        RANDOM_PER_PORT = 500  # per attacker; two attackers per port: 1,000 payloads each
        print(f"attacking ports {ports} ({RANDOM_PER_PORT} random payloads each)", flush=True)

        peak = [0]
        stop = threading.Event()

        def watch_memory():
            while not stop.is_set():
                peak[0] = max(peak[0], peak_rss(job.proc.pid) or 0)
                time.sleep(0.05)

        watcher = threading.Thread(target=watch_memory)
        watcher.start()
        holder_result = []
        holder = threading.Thread(target=lambda: holder_result.append(hold_open(ports, 500, 6.0)))
        holder.start()
        # Two attackers per port, so a listener that is slow to refuse slows only its own.
        attackers = [threading.Thread(target=attack, args=(port, random.Random(port * 2 + i)))
                     for port in ports for i in range(2)]
        for t in attackers:
            t.start()
        for t in attackers:
            t.join()
        holder.join()
        if job.proc.poll() is not None:
            fail("the job ended before the attack did; it proves nothing. Raise --steps.\n"
                 + job.output()[-3000:])
        print(f"held {holder_result[0]} silent connections", flush=True)

        url = metrics_url(job)
        if not url:
            fail("the job printed no metrics address:\n" + job.output()[-2000:])
        # Workers report their stage listeners' refusals with their heartbeats, so the sum can
        # lag the attack by a heartbeat interval.
        listeners = ("coordinator", "store", "metrics", "stage")

        def counted_everywhere():
            counted = {m.group(1): float(m.group(2)) for m in re.finditer(
                r'troupe_rejected_connections_total\{listener="([^"]+)"\} (\S+)', scrape(url))}
            return counted if all(counted.get(n, 0) >= 100 for n in listeners) else None

        try:
            counted = wait_until(counted_everywhere, 15, "refusals counted for every listener")
        except SystemExit:
            print(scrape(url), flush=True)
            raise
        print(f"refusals counted: {counted}", flush=True)

        code = job.wait(600)
        stop.set()
        watcher.join()
        if code != 0:
            fail(f"the attacked job exited {code}:\n{job.output()[-4000:]}")
        losses = step_losses(job.events())
        if losses != calm_losses:
            differ = [s for s in calm_losses if losses.get(s) != calm_losses[s]][:5]
            fail(f"losses differ from the calm run at steps {differ}")
        print(f"coordinator peak RSS: calm {calm_peak >> 20} MiB, attacked {peak[0] >> 20} MiB",
              flush=True)
        if peak[0] > calm_peak + MEMORY_SLACK:
            fail(f"the coordinator's memory grew by {(peak[0] - calm_peak) >> 20} MiB under attack")
        for pid in job_tree(job.proc.pid)[1:]:
            if pid_alive(pid):
                fail(f"process {pid} outlived the job")


if __name__ == "__main__":
    main(test)
