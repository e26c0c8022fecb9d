"""The metrics endpoint answers during a run, passes `promtool check metrics`, and a real
Prometheus server ingests the job's series. Then Ctrl-C (SIGINT) stops the whole job
cleanly: exit code 130, an "interrupted" event, and no process left behind.

Then every series the README's Metrics paragraph names is checked by name in a real
Prometheus scrape (issue 28): the list is read from README.md (promql_names.readme_series), so
a series documented but not exported fails here. The job for that part produces the series
that only exist under conditions: 4 ranks with one killed at step 5 (a recovery, so
troupe_recoveries_total{cause} has a sample; the per-rank gauges are set while it trains) and
`--etcd local` (troupe_coordinator_leader and troupe_coordinator_epoch). Histograms are
checked as their _bucket, _sum and _count series."""

import os
import shutil
import signal
import subprocess
import sys
import urllib.request

from etcd_members import ETCD
from harness import SMALL_MODEL, Job, fail, free_port, main, skip, wait_until
from procfs import kill_tagged, tagged_env, tagged_pids
from promql_names import exposition_samples, exposition_types, readme_series

HARNESS = os.path.join(os.path.dirname(__file__), "..", "tools", "prometheus_harness.py")
README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "README.md")
# Series the README names that only a job started with --etcd exports (the README says so:
# "with `--etcd`"). Without etcd installed they are not checked, and the test is Skipped.
ETCD_ONLY = ["troupe_coordinator_leader", "troupe_coordinator_epoch"]
SERIES = ["troupe_steps_total", "troupe_loss", "troupe_tokens_per_second", "troupe_world_size",
          "troupe_generation", "troupe_step_seconds_bucket"]


def have_prometheus():
    return bool(os.environ.get("PROMETHEUS") or shutil.which("prometheus")
                or os.access("/usr/bin/prometheus", os.X_OK))  # where the harness looks


def readme_queries(body, names, histograms):
    """The PromQL instant queries (series names) that must have samples for the README's
    `names`, checked first against the exposition `body` itself."""
    types = exposition_types(body)
    samples = exposition_samples(body)
    problems = []
    queries = []
    for name in names:
        kind = types.get(name)
        if kind is None:
            problems.append(f"{name}: in the README, not exported (no # TYPE line)")
            continue
        if (kind == "histogram") != (name in histograms):
            problems.append(f"{name}: exported as a {kind}, the README "
                            f"{'calls it' if name in histograms else 'does not call it'} a "
                            "histogram")
        series = [name + s for s in ("_bucket", "_sum", "_count")] if kind == "histogram" \
            else [name]
        for s in series:
            if s not in samples:
                problems.append(f"{s}: exported without a sample")
        queries += series
    if problems:
        fail("the README's metrics and /metrics disagree:\n  " + "\n  ".join(problems) +
             f"\n/metrics:\n{body}")
    return queries


def readme_series_in_a_real_scrape():
    names, histograms = readme_series(README)
    if len(names) < 30 or len(histograms) < 4:
        fail(f"read only {len(names)} series ({len(histograms)} histograms) from the README's "
             f"Metrics paragraph: the reader or the README changed: {names}")
    for name in ETCD_ONLY:  # the exemption list must name what the README names
        if name not in names:
            fail(f"{name} is exempted below but not in the README's Metrics paragraph")
    etcd = os.access(ETCD, os.X_OK)
    if not etcd:
        skip(f"etcd is not installed ({ETCD}): {', '.join(ETCD_ONLY)} are not checked")
        names = [n for n in names if n not in ETCD_ONLY]
    port = free_port()
    args = SMALL_MODEL + ["--world", "4", "--steps", "100000", "--metrics-port", str(port),
                          "--checkpoint-every", "3", "--eval-every", "3",
                          "--fault", "kill:rank=3:step=5"] + (["--etcd", "local"] if etcd else [])
    env, tag = tagged_env()
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        with Job(args, env=env) as job:
            def recovered():
                ev = job.events()
                gens = [e for e in ev
                        if e.get("event") == "generation" and e.get("number", 0) >= 2]
                return gens and any(e.get("event") == "step" and e.get("generation", 0) >= 2
                                    and e["step"] >= gens[0]["start_step"] + 3 for e in ev)
            try:
                wait_until(recovered, 180,
                           "the job to recover from the killed rank and train 3 steps")
            except SystemExit:
                print(f"the job's output:\n{job.output()}", flush=True)
                raise

            def every_readme_family_sampled():
                body = urllib.request.urlopen(url, timeout=10).read().decode()
                sampled, types = exposition_samples(body), exposition_types(body)
                return body if all((n + "_count" if types.get(n) == "histogram" else n)
                                   in sampled for n in names) else None
            body = wait_until(every_readme_family_sampled, 60,
                              "a sample of every series the README names")
            queries = readme_queries(body, names, histograms)
            if have_prometheus():
                expects = [a for q in queries for a in ("--expect", q)]
                scrape = subprocess.run([sys.executable, HARNESS, "--target",
                                         f"127.0.0.1:{port}", "--timeout", "90"] + expects,
                                        capture_output=True, text=True)
                print(scrape.stdout, scrape.stderr)
                if scrape.returncode != 0:
                    fail("Prometheus did not ingest every series the README names")
                print(f"all {len(names)} series the README names were scraped by Prometheus "
                      f"({len(queries)} series names)")
            else:
                skip("prometheus not found: the README's series are checked in /metrics only")
            job.proc.send_signal(signal.SIGINT)
            code = job.wait(60)
            if code != 130:
                fail(f"Ctrl-C should end the job with exit code 130, got {code}:\n"
                     f"{job.output()}")
            job.assert_no_process_left()
        # etcd included: every process that inherited the job's tag.
        wait_until(lambda: not tagged_pids(tag), 30,
                   "every process of the job (etcd too) to exit")
    finally:
        kill_tagged(tag)  # what is left after a failure (etcd too), by pid


def test():
    port = free_port()
    args = SMALL_MODEL + ["--world", "2", "--steps", "100000", "--metrics-port", str(port),
                          "--checkpoint-every", "0"]
    with Job(args) as job:
        wait_until(lambda: any(e.get("event") == "step" and e["step"] >= 3 for e in job.events()), 120,
                   "the job to commit 3 steps")
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        for name in SERIES:
            if name.encode() not in body:
                fail(f"{name} missing from /metrics:\n{body.decode()}")
        # Without the tools (the Debian package 'prometheus') these parts are Skipped, not passed.
        if shutil.which("promtool"):
            check = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True)
            if check.returncode != 0:
                fail(f"promtool check metrics failed:\n{check.stdout.decode()}{check.stderr.decode()}")
        else:
            skip("promtool not found: the exposition is not checked")
        if have_prometheus():
            scrape = subprocess.run([sys.executable, HARNESS, "--target", f"127.0.0.1:{port}", "--timeout", "90"]
                                    + [a for s in SERIES for a in ("--expect", s)], capture_output=True, text=True)
            print(scrape.stdout, scrape.stderr)
            if scrape.returncode != 0:
                fail("Prometheus did not ingest the job's series")
        else:
            skip("prometheus not found: no server scrapes the job")

        pids = job.all_pids()
        if len(pids) < 4:
            fail(f"expected the launcher, an agent and 2 ranks, saw pids {pids}")
        job.proc.send_signal(signal.SIGINT)
        code = job.wait(60)
        if code != 130:
            fail(f"Ctrl-C should end the job with exit code 130, got {code}:\n{job.output()}")
        if not any(e.get("event") == "interrupted" for e in job.events()):
            fail("no 'interrupted' event")
        job.assert_no_process_left()
        print(f"stopped cleanly; processes {pids} all gone")

    readme_series_in_a_real_scrape()


if __name__ == "__main__":
    main(test)
