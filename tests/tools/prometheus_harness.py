#!/usr/bin/python3
"""Scrape metrics endpoints with a real Prometheus server and check that series arrive.

Starts a throw-away `prometheus` on a free loopback port with a scrape config (interval 1 s)
for the given targets, waits until every --expect query returns at least one sample and every
target's health is "up", then stops Prometheus and deletes its temporary directory. Exits 0 on
success and 1 otherwise (including bad arguments and signals), always with a one-line verdict
on stdout and, on failure, the details needed to see why.

    prometheus_harness.py --target 127.0.0.1:9400 \\
        --expect troupe_steps_total --expect 'troupe_loss{rank="0"}' [--timeout 60]

--target may be repeated (one job, several endpoints); --expect takes any PromQL instant
query (usually a metric name) and may be repeated or left out (then only target health is
checked). Standard library only; Linux.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

PROG = "prometheus_harness"
JOB_NAME = "troupe_harness"
START_ATTEMPTS = 3          # a new port each time, in case another process grabs ours
POLL_SECONDS = 0.5
STOP_GRACE_SECONDS = 10.0


class HarnessError(Exception):
    """A failure with a message meant for the user."""


class Interrupted(Exception):
    """Raised from a signal handler so that cleanup runs on SIGTERM, SIGINT and SIGHUP."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # exit 1, not argparse's 2: one failure code
        self.print_usage(sys.stderr)
        print(f"{PROG}: FAIL: {message}", file=sys.stderr)
        sys.exit(1)


def say(message: str) -> None:
    print(f"{PROG}: {message}", flush=True)


def parse_target(text: str) -> str:
    """Validates HOST:PORT (or [IPv6]:PORT) and returns it unchanged."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"target {text!r} is not HOST:PORT")
    return text


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(path: str, targets: list[str], metrics_path: str, interval: float,
                 bearer_token_file: str | None = None) -> None:
    # JSON strings are valid YAML scalars, so no YAML library is needed.
    interval_text = f"{interval:g}s"
    lines = [
        "global:",
        f"  scrape_interval: {interval_text}",
        f"  scrape_timeout: {interval_text}",
        f"  evaluation_interval: {interval_text}",
        "scrape_configs:",
        f"  - job_name: {json.dumps(JOB_NAME)}",
        f"    metrics_path: {json.dumps(metrics_path)}",
        "    scheme: http",
        "    static_configs:",
        f"      - targets: {json.dumps(targets)}",
    ]
    if bearer_token_file:
        lines += ["    authorization:", "      type: Bearer",
                  f"      credentials_file: {json.dumps(os.path.abspath(bearer_token_file))}"]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


# Loopback only: ignore http_proxy and friends, which would send our requests elsewhere.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_get(url: str, timeout: float = 3.0) -> tuple[int, bytes]:
    try:
        with _OPENER.open(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def api_get(base: str, path: str, params: dict[str, str] | None = None) -> dict:
    url = base + path
    if params:
        url += "?" + urllib.parse.urlencode(params)
    status, body = http_get(url)
    try:
        doc = json.loads(body.decode("utf-8", "replace"))
    except ValueError as e:
        raise HarnessError(f"{path} answered HTTP {status} with a body that is not JSON") from e
    if doc.get("status") != "success":
        error = f"{doc.get('errorType', '?')}: {doc.get('error', '?')}"
        raise HarnessError(f"{path} {params or ''} failed: {error}")
    return doc["data"]


def log_tail(log_path: str, lines: int = 20) -> str:
    try:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-lines:]).rstrip()
    except OSError:
        return "(no log)"


def _die_with_parent() -> None:
    # Runs in the child before exec: if the harness is SIGKILLed (a CI timeout), the kernel
    # kills Prometheus too instead of leaving it running.
    try:
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    except Exception:  # noqa: BLE001 - best effort, not Linux or no libc
        pass


class PrometheusProcess:
    """One prometheus process and the files it uses; stop() is safe to call more than once."""

    def __init__(self, binary: str, workdir: str, config_path: str, port: int):
        self.port = port
        self.base = f"http://127.0.0.1:{port}"
        self.log_path = os.path.join(workdir, f"prometheus-{port}.log")
        tsdb = os.path.join(workdir, f"tsdb-{port}")
        command = [
            binary,
            f"--config.file={config_path}",
            f"--storage.tsdb.path={tsdb}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1h",
            "--log.level=warn",
            # Short query timeout: a query that hangs should fail the poll, not the deadline.
            "--query.timeout=10s",
        ]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=_die_with_parent, cwd=workdir)

    def exited(self) -> bool:
        return self.proc.poll() is not None

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        if not self._log.closed:
            self._log.close()


def start_prometheus(binary: str, workdir: str, config_path: str, deadline: float,
                     started: list[PrometheusProcess]) -> PrometheusProcess:
    """Starts Prometheus and waits for /-/ready, retrying on a new port if ours was taken.
    Every process started is appended to `started` at once, so the caller can stop it even
    if a signal interrupts this function."""
    last_error = ""
    for _ in range(START_ATTEMPTS):
        prom = PrometheusProcess(binary, workdir, config_path, free_loopback_port())
        started.append(prom)
        while time.monotonic() < deadline:
            if prom.exited():
                break
            try:
                status, _ = http_get(prom.base + "/-/ready", timeout=1.0)
                if status == 200:
                    return prom
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.1)
        prom.stop()
        tail = log_tail(prom.log_path)
        if time.monotonic() >= deadline:
            raise HarnessError(f"prometheus was not ready before the deadline; its log:\n{tail}")
        last_error = f"prometheus exited with code {prom.proc.returncode}; its log:\n{tail}"
        if "address already in use" not in tail:
            break
    raise HarnessError(last_error)


def check(prom: PrometheusProcess, targets: list[str], expects: list[str], deadline: float
          ) -> list[str]:
    """Polls until every expectation holds; returns a description of each found series."""
    found: dict[str, str] = {}
    health: dict[str, str] = {}
    while True:
        if prom.exited():
            raise HarnessError(f"prometheus exited early (code {prom.proc.returncode}); its "
                               f"log:\n{log_tail(prom.log_path)}")
        for expr in expects:
            if expr in found:
                continue
            # A malformed query raises HarnessError at once: it would never start to work.
            result = api_get(prom.base, "/api/v1/query", {"query": expr})
            kind = result.get("resultType")
            series = result.get("result") or []
            if kind in ("scalar", "string"):  # e.g. time(): always one value
                found[expr] = f"{expr}: {kind} {series[1] if len(series) > 1 else '?'}"
            elif series:  # vector (value) or matrix (values), from a range selector
                first = series[0]
                value = first.get("value") or (first.get("values") or [[None, "?"]])[-1]
                found[expr] = (f"{expr}: {len(series)} series, e.g. "
                               f"{json.dumps(first.get('metric', {}), sort_keys=True)} = "
                               f"{value[1]}")
        health = {}
        for t in api_get(prom.base, "/api/v1/targets", {"state": "active"}).get(
                "activeTargets", []):
            if t.get("scrapePool") == JOB_NAME:
                address = t.get("labels", {}).get("instance", "?")
                error = t.get("lastError") or ""
                health[address] = t.get("health", "unknown") + (f" ({error})" if error else "")
        all_up = all(health.get(t, "").startswith("up") for t in targets)
        if all_up and len(found) == len(expects):
            return [f"target {t}: up" for t in targets] + [found[e] for e in expects]
        if time.monotonic() >= deadline:
            missing = [e for e in expects if e not in found]
            problems = []
            if missing:
                problems.append("no samples for: " + ", ".join(missing))
            for t in targets:
                if not health.get(t, "").startswith("up"):
                    problems.append(f"target {t} health: {health.get(t, 'not listed')}")
            raise HarnessError("; ".join(problems))
        time.sleep(POLL_SECONDS)


def find_prometheus(explicit: str | None) -> str:
    candidate = explicit or os.environ.get("PROMETHEUS") or shutil.which("prometheus") \
        or "/usr/bin/prometheus"
    if not (os.path.isfile(candidate) and os.access(candidate, os.X_OK)):
        raise HarnessError(f"prometheus binary not found at {candidate!r} (install the Debian "
                           "package 'prometheus' or pass --prometheus PATH)")
    return candidate


def main(argv: list[str]) -> int:
    parser = _Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", action="append", required=True, type=parse_target,
                        help="HOST:PORT to scrape; repeat for several endpoints")
    parser.add_argument("--expect", action="append", default=[], metavar="QUERY",
                        help="a metric name (or PromQL query) that must return a sample; repeat")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds for the whole check, Prometheus start-up included "
                             "(default 60)")
    parser.add_argument("--metrics-path", default="/metrics", help="default /metrics")
    parser.add_argument("--scrape-interval", type=float, default=1.0, help="seconds, default 1")
    parser.add_argument("--prometheus", help="path of the prometheus binary (default: $PROMETHEUS,"
                                             " then PATH, then /usr/bin/prometheus)")
    parser.add_argument("--bearer-token-file", metavar="FILE",
                        help="Prometheus sends this file's token as Authorization: Bearer")
    parser.add_argument("--keep-tmp", action="store_true",
                        help="keep the temporary directory (config, TSDB, log) for debugging")
    args = parser.parse_args(argv)
    if args.timeout <= 0 or args.scrape_interval <= 0:
        parser.error("--timeout and --scrape-interval must be positive")

    def on_signal(signum, _frame):
        raise Interrupted(f"interrupted by signal {signal.Signals(signum).name}")

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)

    deadline = time.monotonic() + args.timeout
    workdir = tempfile.mkdtemp(prefix="troupe-prometheus-")
    started: list[PrometheusProcess] = []
    try:
        binary = find_prometheus(args.prometheus)
        config_path = os.path.join(workdir, "prometheus.yml")
        write_config(config_path, args.target, args.metrics_path, args.scrape_interval,
                     args.bearer_token_file)
        prom = start_prometheus(binary, workdir, config_path, deadline, started)
        say(f"prometheus ready on 127.0.0.1:{prom.port}, scraping {', '.join(args.target)}")
        report = check(prom, args.target, args.expect, deadline)
        for line in report:
            say("  " + line)
        say(f"OK: {len(args.target)} target(s) up, {len(args.expect)} expected series present")
        return 0
    except (HarnessError, Interrupted) as e:
        say(f"FAIL: {e}")
        return 1
    except (OSError, urllib.error.URLError) as e:
        say(f"FAIL: {type(e).__name__}: {e}")
        return 1
    finally:
        # Signals during cleanup must not skip the rest of it.
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        for prom in started:
            prom.stop()
        if args.keep_tmp:
            say(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
