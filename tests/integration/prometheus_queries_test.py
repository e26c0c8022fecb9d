"""Every query that monitoring/prometheus/ ships names a series troupe really exports (issue 28).

The PromQL of the Grafana dashboard (panels and templating) and of troupe.rules.yml (recording
and alert rules) is read, its metric names extracted (promql_names.metric_names: not function,
aggregation, keyword or label names), and each name must be a series of a real scrape, or a
recording rule that troupe.rules.yml defines. The series come from a real `troupe run`: 4 ranks,
one killed at step 5 (so the job recovers and exports troupe_recoveries_total{cause}), with
checkpoints and validation, scraped over HTTP once every family has its samples. The
dashboard's queries are also parsed by promtool (as rules of a throw-away file), so a query
Prometheus would reject fails here too. Last, a real Prometheus scrapes the same job with
troupe.rules.yml loaded, and every recording rule must give a sample: the rules' label
matching and selectors work on the series as troupe writes them. Without promtool or
prometheus those parts are Skipped (exit 77)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

from harness import SMALL_MODEL, Job, fail, free_port, main, skip, wait_until
from procfs import kill_tagged, tagged_env, tagged_pids
from promql_names import (dashboard_queries, exposition_samples, metric_names, rule_entries)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
PROM_DIR = os.path.join(ROOT, "monitoring", "prometheus")
RULES = os.path.join(PROM_DIR, "troupe.rules.yml")
DASHBOARD = os.path.join(PROM_DIR, "grafana", "troupe-dashboard.json")
# Series Prometheus writes itself for every scrape target (TroupeTargetDown reads `up`).
PROMETHEUS_SERIES = {"up"}
sys.path.insert(0, os.path.join(ROOT, "tests", "tools"))
import prometheus_harness  # noqa: E402  (starts and polls a throw-away prometheus)

# The lexer on expressions whose names are known, including every construct that is not a
# metric name: a lexer that took `by`, `phase` or `rate` for a metric would fail the check
# below for the wrong reason, and one that missed a name would let a typo through.
LEXER_CASES = {
    'sum by (phase) (rate(a_total{phase!="idle",instance=~"$x"}[5m]))': {"a_total"},
    "b:rec:rate5m / ignoring (phase) group_left sum without (phase) (b:rec:rate5m)":
        {"b:rec:rate5m"},
    "histogram_quantile(0.99, sum by (le) (rate(c_bucket[5m:1m] offset 1h)))": {"c_bucket"},
    'd > bool 1e-3 and on(job) e or {__name__="f"} unless count_values("v", g) # h\n + Inf':
        {"d", "e", "f", "g"},
    'label_replace(i, "dst", "$1", "src", "(.*)") * on (a) group_right (b) j': {"i", "j"},
    "sum(k) by (l) + topk(3, m) - changes(n[30m]) == 0": {"k", "m", "n"},
}


def check_lexer():
    for expr, want in LEXER_CASES.items():
        got = metric_names(expr)
        if got != want:
            fail(f"metric_names({expr!r}) = {sorted(got)}, expected {sorted(want)}")


def check_dashboard_is_generated():
    """The JSON is what grafana/make_dashboard.py writes (edits go to the script)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "d.json")
        subprocess.run([sys.executable, os.path.join(PROM_DIR, "grafana", "make_dashboard.py"),
                        out], check=True, timeout=60)
        with open(out) as a, open(DASHBOARD) as b:
            if a.read() != b.read():
                fail("grafana/troupe-dashboard.json is not what grafana/make_dashboard.py "
                     "writes: run the script")


def check_dashboard_shape():
    """What makes the JSON provisionable: a schema version Grafana 10 reads, a datasource
    variable every panel and target uses, unique panel ids, no absolute datasource uid."""
    with open(DASHBOARD) as f:
        dash = json.load(f)
    problems = []
    if not 36 <= dash.get("schemaVersion", 0) <= 39:
        problems.append(f"schemaVersion {dash.get('schemaVersion')} (expected about 38)")
    if not dash.get("uid") or not dash.get("title"):
        problems.append("no uid or title")
    var = [v for v in dash["templating"]["list"] if v.get("type") == "datasource"]
    if [v.get("name") for v in var] != ["DS_PROMETHEUS"] or var[0].get("query") != "prometheus":
        problems.append(f"expected one datasource variable DS_PROMETHEUS of prometheus: {var}")
    ids = []
    titles = []

    def walk(items):
        for p in items:
            yield p
            yield from walk(p.get("panels", []))

    for p in walk(dash["panels"]):
        ids.append(p.get("id"))
        titles.append(p.get("title", ""))
        if p.get("type") == "row":
            continue
        for holder in [p] + p.get("targets", []):
            uid = (holder.get("datasource") or {}).get("uid")
            if uid != "${DS_PROMETHEUS}":
                problems.append(f"panel {p.get('title')!r}: datasource uid {uid!r}")
        if not p.get("targets"):
            problems.append(f"panel {p.get('title')!r} has no query")
        if not {"h", "w", "x", "y"} <= set(p.get("gridPos", {})):
            problems.append(f"panel {p.get('title')!r} has no gridPos")
    if len(ids) != len(set(ids)):
        problems.append(f"panel ids repeat: {ids}")
    # The views issue 28 asks for, by title.
    for want in ("Loss", "Tokens per second", "Step time", "Phase breakdown", "Goodput and MFU",
                 "Generation and world", "Recoveries", "Committed step",
                 "Heartbeat age per rank", "Straggler score per rank"):
        if want not in titles:
            problems.append(f"no panel titled {want!r}")
    if problems:
        fail("the dashboard is not provisionable as it is:\n  " + "\n  ".join(problems))


def check_with_promtool(queries):
    """Parses each dashboard query with Prometheus' own parser (promtool check rules on a
    file of one recording rule per query; JSON is valid YAML)."""
    if not shutil.which("promtool"):
        skip("promtool not found: the dashboard's PromQL is not parsed by Prometheus")
        return
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query{i}", "expr": q} for i, (_, q) in enumerate(queries)]}]}
    with tempfile.NamedTemporaryFile("w", suffix=".yml") as f:
        json.dump(rules, f)
        f.flush()
        p = subprocess.run(["promtool", "check", "rules", f.name], capture_output=True,
                           text=True)
    if p.returncode != 0:
        fail("promtool rejects a dashboard query:\n" + p.stdout + p.stderr + "\nqueries:\n" +
             "\n".join(f"  {i}: {w}: {q}" for i, (w, q) in enumerate(queries)))


def recording_rules_in_real_prometheus(port, recorded):
    """A real Prometheus scrapes the job each second with troupe.rules.yml loaded (evaluated
    each second); every recording rule must return a sample within 60 s."""
    try:
        binary = prometheus_harness.find_prometheus(None)
    except prometheus_harness.HarnessError as e:
        skip(f"the recording rules are not evaluated by a real Prometheus: {e}")
        return
    workdir = tempfile.mkdtemp(prefix="troupe-rules-prometheus-")
    started = []
    target = f"127.0.0.1:{port}"
    try:
        config = os.path.join(workdir, "prometheus.yml")
        prometheus_harness.write_config(config, [target], "/metrics", 1.0)
        shutil.copy(RULES, workdir)
        with open(config, "a") as f:
            f.write("rule_files:\n  - troupe.rules.yml\n")
        deadline = time.monotonic() + 90
        prom = prometheus_harness.start_prometheus(binary, workdir, config, deadline, started)
        report = prometheus_harness.check(prom, [target], sorted(recorded), deadline)
        print("\n".join("  " + line for line in report))
    except prometheus_harness.HarnessError as e:
        fail(f"a real Prometheus with troupe.rules.yml loaded: {e}")
    finally:
        for prom in started:
            prom.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def scrape_real_job(used, recorded):
    """The sample names of a real job's /metrics once every family has samples; while the
    job runs, and only if every name `used` is exported or recorded (else the test fails on
    those names, which says more), the recording rules are run by a real Prometheus."""
    port = free_port()
    args = SMALL_MODEL + ["--world", "4", "--steps", "100000", "--metrics-port", str(port),
                          "--checkpoint-every", "3", "--eval-every", "3",
                          "--fault", "kill:rank=3:step=5"]
    env, tag = tagged_env()
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        with Job(args, env=env) as job:
            def recovered_and_training():
                ev = job.events()
                gens = [e for e in ev if e.get("event") == "generation" and e.get("number", 0) >= 2]
                return gens and any(e.get("event") == "step" and e.get("generation", 0) >= 2
                                    and e["step"] >= gens[0]["start_step"] + 4 for e in ev) \
                    and any(e.get("event") == "checkpoint" for e in ev) \
                    and any(e.get("event") == "validation" for e in ev)
            try:
                wait_until(recovered_and_training, 180,
                           "a recovery from the killed rank, 4 steps after it, a checkpoint and a "
                           "validation")
            except SystemExit:
                print(f"the job's output:\n{job.output()}", flush=True)
                raise

            def body_with_every_family():
                body = urllib.request.urlopen(url, timeout=10).read().decode()
                # A rank's gauges appear once the supervisor has updated them; the recovery's
                # counter once it was counted.
                want = ("troupe_recoveries_total{", "troupe_straggler_score{",
                        "troupe_heartbeat_age_seconds{")
                return body if all(w in body for w in want) else None
            body = wait_until(body_with_every_family, 60, "the per-rank and per-cause samples")
            sampled = exposition_samples(body)
            if all(n in sampled or n in recorded or n in PROMETHEUS_SERIES for n in used):
                recording_rules_in_real_prometheus(port, recorded)
            job.proc.send_signal(signal.SIGINT)
            code = job.wait(60)
            if code != 130:
                fail(f"the job should end with 130 on SIGINT, got {code}:\n{job.output()}")
            job.assert_no_process_left()
        wait_until(lambda: not tagged_pids(tag), 20, "every process the job started to exit")
    finally:
        kill_tagged(tag)  # what is left after a failure (etcd too), by pid
    return exposition_samples(body)


def test():
    check_lexer()
    check_dashboard_is_generated()
    check_dashboard_shape()
    queries, problems = dashboard_queries(DASHBOARD)
    if problems:
        fail("dashboard queries:\n  " + "\n  ".join(problems))
    if len(queries) < 20:
        fail(f"only {len(queries)} dashboard queries were found: the reader is broken")
    check_with_promtool(queries)

    rules = rule_entries(RULES)
    recorded = {name for kind, name, _ in rules if kind == "record"}
    used = {}  # metric name -> where it is used
    for where, q in queries:
        for name in metric_names(q):
            used.setdefault(name, []).append(f"dashboard {where}")
    for kind, name, expr in rules:
        for metric in metric_names(expr):
            used.setdefault(metric, []).append(f"rules {kind} {name}")
    if not recorded or len(used) < 15:
        fail(f"too little read: {len(recorded)} recording rules, names {sorted(used)}")

    exported = scrape_real_job(used, recorded)
    print(f"{len(exported)} sample names exported; {len(used)} names used by the rules and "
          f"the dashboard, {len(recorded)} of the rules recording rules")
    # The check must be able to fail: a name nobody exports is caught.
    if "troupe_not_a_series" in exported | recorded:
        fail("the negative control is exported?")
    missing = {n: w for n, w in used.items()
               if n not in exported and n not in recorded and n not in PROMETHEUS_SERIES}
    if missing:
        fail("queries name series that troupe does not export (and no recording rule "
             "defines):\n" + "\n".join(f"  {n}: used by {', '.join(w)}"
                                       for n, w in sorted(missing.items())))
    print(f"every one of {len(used)} names is exported or recorded: {', '.join(sorted(used))}")


if __name__ == "__main__":
    main(test)
