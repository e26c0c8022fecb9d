"""Strangers are refused: a process without the job's secret cannot join as an agent or a
worker, cannot write or read a store key and cannot send an actor message; one holding another
job's token, or a token of another protocol version, is refused with a message that says which.
Then the rightful agent joins and the job trains to the end."""

import os
import re
import socket
import struct
import subprocess
import tempfile
import time
import urllib.request

from harness import SMALL_MODEL, TROUPE, Job, fail, free_port, listening_ports, main, wait_until

ARGS = SMALL_MODEL + ["--world", "1", "--steps", "30", "--checkpoint-every", "0"]


def job_id_of(token_path):
    with open(token_path) as f:
        for line in f:
            if line.startswith("job "):
                return line.split()[1]
    fail(f"{token_path} names no job")


def refused(args, code, *needles, timeout=30):
    """Runs `troupe args` (a stranger), which must end with `code` and mention each needle."""
    start = time.monotonic()
    p = subprocess.run([TROUPE] + args, capture_output=True, text=True, timeout=timeout)
    out = p.stdout + p.stderr
    if p.returncode != code:
        fail(f"{args}: expected exit {code}, got {p.returncode}:\n{out}")
    for n in needles:
        if n not in out:
            fail(f"{args}: the refusal should mention {n!r}:\n{out}")
    return time.monotonic() - start


def store_request_answered(port):
    """Sends the store's own 'set' frame without any handshake; True if it says ok."""
    key, value = b"g1/world/bootstrap", b"evil"
    body = bytes([1]) + struct.pack("<I", len(key)) + key + struct.pack("<I", len(value)) + value
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.settimeout(3)
            s.sendall(struct.pack("<I", len(body)) + body)
            reply = s.recv(64)
    except OSError:
        return False
    return reply[:5] == struct.pack("<I", 1) + b"\x00"


def test():
    with tempfile.TemporaryDirectory() as tmp:
        # Another job's token, made by a short job of its own.
        other_dir = os.path.join(tmp, "other")
        p = subprocess.run([TROUPE, "run", "--run-dir", other_dir] + SMALL_MODEL + ["--steps", "1"],
                           capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            fail(f"the other job failed:\n{p.stdout}{p.stderr}")
        other_token = os.path.join(other_dir, "join.token")

        metrics_port = free_port()
        with Job(ARGS + ["--metrics-port", str(metrics_port)], command="coordinator") as coord:
            found = wait_until(lambda: re.search(r"listening on (\S+);", coord.output()), 60,
                               "the coordinator's address")
            endpoint = found.group(1)
            token = os.path.join(coord.run_dir, "join.token")
            mine, theirs = job_id_of(token), job_id_of(other_token)
            if oct(os.stat(token).st_mode & 0o777) != "0o600":
                fail(f"the join token is not mode 0600: {oct(os.stat(token).st_mode)}")
            if open(token).read() in coord.output():
                fail("the coordinator printed its secret")

            # Another job's members: refused at once, naming both jobs.
            took = refused(["agent", "--coordinator", endpoint, "--join-token", other_token], 1,
                           mine, theirs)
            if took > 10:
                fail(f"refusing another job's agent took {took:.1f}s")
            refused(["worker", "--coordinator", endpoint, "--member", "0", "--join-token",
                     other_token], 1, mine, theirs)

            # Another build's token, a token others can read, and no token at all.
            with open(token) as f:
                text = f.read()
            old = os.path.join(tmp, "old.token")
            with open(old, "w") as f:
                f.write(re.sub(r"^protocol \d+", "protocol 1", text, flags=re.M))
            os.chmod(old, 0o600)
            refused(["agent", "--coordinator", endpoint, "--join-token", old], 2,
                    "protocol version 1", "this troupe build speaks")
            loose = os.path.join(tmp, "loose.token")
            with open(loose, "w") as f:
                f.write(text)
            os.chmod(loose, 0o644)
            refused(["agent", "--coordinator", endpoint, "--join-token", loose], 2, "chmod 600")
            refused(["agent", "--coordinator", endpoint], 2, "--join-token")

            # Raw strangers: no store listener of the coordinator answers an unauthenticated
            # request, and an actor message never gets through (it is counted instead).
            caf_port = int(endpoint.rsplit(":", 1)[1])
            for port in set(listening_ports([coord.proc.pid])) - {caf_port, metrics_port}:
                if store_request_answered(port):
                    fail(f"port {port} accepted a store write from a stranger")
            with socket.create_connection(("127.0.0.1", caf_port), timeout=2) as s:
                s.sendall(struct.pack(">BBBBIQQQ", 2, 0, 0, 0, 0, 0, 0, 0))
            text = wait_until(lambda: (lambda t: t if re.search(
                r'troupe_rejected_connections_total\{listener="coordinator"\} [1-9]', t) else None)(
                urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5)
                .read().decode()), 30, "the refusals to be counted")

            # The rightful agent joins and the job trains to the end.
            agent = subprocess.Popen([TROUPE, "agent", "--coordinator", endpoint, "--join-token",
                                      token], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            coord.extra_pids.append(agent.pid)
            code = coord.wait(300)
            agent.wait(60)
            if code != 0:
                fail(f"the job exited {code}:\n{coord.output()[-3000:]}")
            if not any(e.get("event") == "step" and e.get("step") == 30 for e in coord.events()):
                fail("the job did not train to step 30")


if __name__ == "__main__":
    main(test)
