"""The real Prometheus server scrapes a job through a recovery and a rejoin: through its query
API it sees troupe_world_size fall from 4 to 3 when a worker is killed with kill -9, rise back
to 4 when `troupe agent --ranks 1` joins, troupe_recoveries_total rise, and troupe_job_state
back at training (1). (A recovery here lasts tens of milliseconds, too short for a 1 s scrape
to catch the recovering state in between.)"""

import os
import signal
import subprocess
import sys
import tempfile
import time

from harness import SMALL_MODEL, TROUPE, Job, fail, free_port, main, wait_until

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
import prometheus_harness as ph  # noqa: E402


def query(prom, expr):
    result = ph.api_get(prom.base, "/api/v1/query", {"query": expr}).get("result") or []
    return float(result[0]["value"][1]) if result else None


def test():
    port = free_port()
    args = SMALL_MODEL + ["--world", "4", "--steps", "100000", "--metrics-port", str(port),
                          "--checkpoint-every", "0"]
    started = []
    with tempfile.TemporaryDirectory(prefix="troupe-prom-") as tmp, Job(args) as job:
        try:
            config = os.path.join(tmp, "prometheus.yml")
            ph.write_config(config, [f"127.0.0.1:{port}"], "/metrics", 1)
            prom = ph.start_prometheus(ph.find_prometheus(None), tmp, config, time.monotonic() + 60, started)
            wait_until(lambda: query(prom, "troupe_world_size") == 4, 60, "Prometheus to see 4 ranks")

            victim = next(e["pid"] for e in job.events() if e.get("event") == "rank_joined")
            os.kill(victim, signal.SIGKILL)
            wait_until(lambda: query(prom, "troupe_world_size") == 3, 60, "Prometheus to see 3 ranks")
            wait_until(lambda: (query(prom, "sum(troupe_recoveries_total)") or 0) >= 1, 60,
                       "troupe_recoveries_total to rise")

            with open(os.path.join(job.run_dir, "coordinator.addr")) as f:
                addr = f.read().strip()
            agent = subprocess.Popen([TROUPE, "agent", "--coordinator", addr, "--ranks", "1",
                                      "--join-token", os.path.join(job.run_dir, "join.token")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            job.extra_pids.append(agent.pid)
            wait_until(lambda: query(prom, "troupe_world_size") == 4, 60, "Prometheus to see 4 ranks again")

            low = query(prom, "min_over_time(troupe_world_size[5m])")
            high = query(prom, "max_over_time(troupe_world_size[5m])")
            states = query(prom, "max_over_time(troupe_job_state[5m])")
            now_state = query(prom, "troupe_job_state")
            if low != 3 or high != 4:
                fail(f"troupe_world_size ranged over [{low}, {high}], expected [3, 4]")
            if now_state != 1:
                fail(f"troupe_job_state is {now_state}, expected 1 (training)")
            print(f"Prometheus saw world 4 -> 3 -> 4, recoveries "
                  f"{query(prom, 'sum(troupe_recoveries_total)')}, job state max {states}, now {now_state}")
            job.proc.send_signal(signal.SIGINT)
            if job.wait(60) != 130:
                fail("the job did not stop on Ctrl-C")
            agent.wait(timeout=30)
        finally:
            for p in started:
                p.stop()


if __name__ == "__main__":
    main(test)
