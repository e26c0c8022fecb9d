"""Endpoints of a plain TCP stream, run as processes inside namespaces by measure.tcp_stream
(two processes, so neither end shares an interpreter lock with the other or with the test).

    probe.py tcp-sink --bind ADDR [--port P]        prints {"port": P}, then, after the
                                                     stream ends, {"bytes": B, "seconds": S}
    probe.py tcp-source --connect ADDR:PORT --seconds S [--chunk-kib K]
                                                     sends for S seconds, prints {"bytes": B}

The sink times the stream from its first byte to the sender's close.
"""

import argparse
import json
import socket
import sys
import time


def emit(obj):
    print(json.dumps(obj), flush=True)


def tcp_sink(args):
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((args.bind, args.port))
    srv.listen(1)
    srv.settimeout(args.accept_timeout)
    emit({"port": srv.getsockname()[1]})
    conn, _ = srv.accept()
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    total = 0
    first = None
    while True:
        n = conn.recv_into(view)
        if n == 0:
            break
        if first is None:
            first = time.perf_counter()
        total += n
    end = time.perf_counter()
    emit({"bytes": total, "seconds": (end - first) if first else 0.0})


def tcp_source(args):
    host, port = args.connect.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=args.connect_timeout)
    s.settimeout(None)
    chunk = memoryview(bytearray(args.chunk_kib * 1024))
    total = 0
    end = time.perf_counter() + args.seconds
    while time.perf_counter() < end:
        s.sendall(chunk)
        total += len(chunk)
    s.shutdown(socket.SHUT_WR)
    s.close()
    emit({"bytes": total})


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)
    sink = sub.add_parser("tcp-sink")
    sink.add_argument("--bind", required=True)
    sink.add_argument("--port", type=int, default=0)
    sink.add_argument("--accept-timeout", type=float, default=30.0)
    src = sub.add_parser("tcp-source")
    src.add_argument("--connect", required=True)
    src.add_argument("--seconds", type=float, default=2.0)
    src.add_argument("--chunk-kib", type=int, default=256)
    src.add_argument("--connect-timeout", type=float, default=10.0)
    args = p.parse_args()
    {"tcp-sink": tcp_sink, "tcp-source": tcp_source}[args.mode](args)


if __name__ == "__main__":
    try:
        main()
    except OSError as e:
        print(f"probe: {e}", file=sys.stderr)
        raise SystemExit(1)
