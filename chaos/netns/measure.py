"""Measures a cluster's links: a plain TCP stream (throughput), UDP round trips (RTT) and
numbered UDP datagrams (which arrive, which do not), so that benchmarks compare against the
link's own capacity in the same harness and tests judge faults by what crosses the link.

    import measure
    measure.tcp_stream(c, "n1", "n2", seconds=2)   # {"bits_per_second", "bytes", "seconds"}
    measure.rtt(c, "n1", "coord", count=50)        # {"median_ms", "mean_ms", "min_ms", ...}
    measure.udp_stream(c, "n1", "n2", count=3000)  # {"sent", "received": [seq, ...], "loss"}
    measure.link(c, "n1", "n2")                    # throughput and RTT together

RTT and UDP run in this process on sockets made inside the namespaces; the TCP stream runs
as two processes (probe.py), so that the interpreter is not what limits it.
"""

import json
import os
import select
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PROBE = os.path.join(HERE, "probe.py")
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)


class MeasureError(RuntimeError):
    pass


def _read_json_line(proc, timeout, what):
    r, _, _ = select.select([proc.stdout], [], [], timeout)
    if not r:
        raise MeasureError(f"{what}: no answer within {timeout}s")
    line = proc.stdout.readline()
    if not line:
        err = proc.stderr.read() if proc.stderr else ""
        raise MeasureError(f"{what}: ended without an answer (exit {proc.wait()}): {err.strip()}")
    return json.loads(line)


def tcp_stream(cluster, src, dst, seconds=2.0, python=None, chunk_kib=256):
    """One TCP stream from src to dst for `seconds`; throughput as the receiver saw it."""
    python = python or sys.executable
    sink = cluster.popen(dst, [python, PROBE, "tcp-sink", "--bind", cluster.address(dst)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        port = _read_json_line(sink, 10, "tcp-sink")["port"]
        source = cluster.popen(src, [python, PROBE, "tcp-source", "--connect",
                                     f"{cluster.address(dst)}:{port}", "--seconds", str(seconds),
                                     "--chunk-kib", str(chunk_kib)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        sent = _read_json_line(source, seconds + 30, "tcp-source")
        got = _read_json_line(sink, 30, "tcp-sink")
        source.wait(10)
        sink.wait(10)
    finally:
        for p in (sink,):
            if p.poll() is None:
                p.kill()
                p.wait()
    secs = got["seconds"] or 1e-9
    return {"bits_per_second": got["bytes"] * 8 / secs, "bytes": got["bytes"], "seconds": secs,
            "sent_bytes": sent["bytes"]}


class _UdpEcho:
    """Answers every datagram with itself, in dst's namespace, until closed."""

    def __init__(self, cluster, node):
        self.sock = cluster.socket(node, socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((cluster.address(node), 0))
        self.port = self.sock.getsockname()[1]
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="udp-echo")
        self.thread.start()

    def _loop(self):
        while not self._stop.is_set():
            r, _, _ = select.select([self.sock], [], [], 0.05)
            if r:
                try:
                    data, peer = self.sock.recvfrom(2048)
                    self.sock.sendto(data, peer)
                except OSError:
                    pass

    def close(self):
        self._stop.set()
        self.thread.join(timeout=2)
        self.sock.close()


def rtt(cluster, src, dst, count=50, interval=0.02, timeout=2.0):
    """Round trips of `count` UDP probes from src to an echo in dst, one every `interval`
    seconds (pipelined: a slow link does not stretch the run). Milliseconds."""
    echo = _UdpEcho(cluster, dst)
    s = cluster.socket(src, socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.bind((cluster.address(src), 0))
        s.connect((cluster.address(dst), echo.port))
        sent_at = {}
        samples = {}

        def sender():
            start = time.perf_counter()
            for seq in range(count):
                target = start + seq * interval
                delay = target - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                sent_at[seq] = time.perf_counter()
                try:
                    s.send(struct.pack("!I", seq) + b"\0" * 28)
                except OSError:
                    pass

        t = threading.Thread(target=sender, daemon=True)
        t.start()
        deadline = time.perf_counter() + count * interval + timeout
        while len(samples) < count and time.perf_counter() < deadline:
            r, _, _ = select.select([s], [], [], 0.05)
            if not r:
                continue
            try:
                data = s.recv(2048)
            except OSError:
                continue
            now = time.perf_counter()
            seq = struct.unpack("!I", data[:4])[0]
            if seq in sent_at and seq not in samples:
                samples[seq] = (now - sent_at[seq]) * 1000
        t.join()
    finally:
        s.close()
        echo.close()
    values = [samples[k] for k in sorted(samples)]
    out = {"sent": count, "received": len(values), "samples_ms": values}
    if values:
        out.update(min_ms=min(values), max_ms=max(values), mean_ms=statistics.fmean(values),
                   median_ms=statistics.median(values),
                   stdev_ms=statistics.pstdev(values) if len(values) > 1 else 0.0)
    return out


def udp_stream(cluster, src, dst, count=3000, pps=5000, size=64, drain=0.5):
    """Sends `count` numbered datagrams from src to dst at `pps` per second and reports which
    arrived (in arrival order). The receiver's buffer is large and the sender paced, so the
    sockets lose nothing themselves: what is missing was lost on the link."""
    rx = cluster.socket(dst, socket.AF_INET, socket.SOCK_DGRAM)
    tx = cluster.socket(src, socket.AF_INET, socket.SOCK_DGRAM)
    received = []
    stop = threading.Event()
    try:
        try:
            rx.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 16 << 20)
        except OSError:
            rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
        rx.bind((cluster.address(dst), 0))
        port = rx.getsockname()[1]

        def receiver():
            while not stop.is_set():
                r, _, _ = select.select([rx], [], [], 0.02)
                while r:
                    try:
                        data = rx.recv(65536, socket.MSG_DONTWAIT)
                    except BlockingIOError:
                        break
                    received.append(struct.unpack("!I", data[:4])[0])

        t = threading.Thread(target=receiver, daemon=True, name="udp-sink")
        t.start()
        tx.bind((cluster.address(src), 0))
        tx.connect((cluster.address(dst), port))
        payload = b"\0" * max(0, size - 4)
        start = time.perf_counter()
        burst = max(1, pps // 1000)
        errors = 0
        for seq in range(count):
            if seq % burst == 0:
                delay = start + seq / pps - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
            try:
                tx.send(struct.pack("!I", seq) + payload)
            except OSError:
                errors += 1   # ECONNREFUSED from an earlier ICMP, ENETUNREACH on a cut link
        # Wait until nothing more arrives (or everything did).
        last, quiet_since = -1, time.perf_counter()
        while len(received) < count:
            n = len(received)
            if n != last:
                last, quiet_since = n, time.perf_counter()
            elif time.perf_counter() - quiet_since > drain:
                break
            time.sleep(0.01)
        stop.set()
        t.join(timeout=2)
    finally:
        rx.close()
        tx.close()
    got = len(set(received))
    return {"sent": count, "received": received, "send_errors": errors,
            "loss": 1 - got / count if count else 0.0}


def link(cluster, a, b, seconds=2.0):
    """The link's own capacity between a and b in this harness: a TCP stream's throughput
    and the UDP round trip."""
    r = rtt(cluster, a, b, count=20, interval=0.01)
    s = tcp_stream(cluster, a, b, seconds=seconds)
    return {"tcp_bits_per_second": s["bits_per_second"], "rtt_median_ms": r.get("median_ms")}
