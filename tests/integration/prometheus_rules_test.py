"""monitoring/prometheus/troupe.rules.yml passes `promtool check rules` and its unit tests
(`promtool test rules troupe.rules.test.yml`), the tests cover every rule (each recording
rule's value is checked; each alert is seen both firing and not firing), and they bite: the
rules with a threshold, a `for:` or a clause of an expression changed make them fail. The
example configuration that loads them passes `promtool check config`.
Skipped (exit 77) without promtool (Debian's 'prometheus')."""

import os
import re
import shutil
import subprocess
import tempfile

from harness import SKIPPED, fail, main
from promql_names import rule_entries

PROM_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "monitoring",
                        "prometheus")
RULES = os.path.join(PROM_DIR, "troupe.rules.yml")
TESTS = os.path.join(PROM_DIR, "troupe.rules.test.yml")
EXAMPLE_CONFIG = os.path.join(PROM_DIR, "prometheus.example.yml")

# Changes to the rules that the unit tests must notice, one at a time: (what, old, new).
MUTATIONS = [
    ("straggler threshold", "troupe_straggler_score > 1.5", "troupe_straggler_score > 2.5"),
    ("straggler cost", "troupe_step_compute_seconds > 0.002", "troupe_step_compute_seconds > 0"),
    ("straggler duration", "for: 10m", "for: 1m"),
    ("storm threshold", ">= 3\n", ">= 1\n"),
    ("no-checkpoint window", "changes(troupe_checkpoint_last_committed_step[30m]) == 0",
     "changes(troupe_checkpoint_last_committed_step[10m]) == 0"),
    ("no-checkpoint: training must move", "and changes(troupe_step[30m]) > 0",
     "and troupe_step >= 0"),
    ("no-checkpoint: uncommitted steps", "and troupe_step > troupe_checkpoint_last_committed_step",
     "and troupe_step >= 0"),
    ("no-checkpoint: checkpointing on", "and troupe_checkpoints_total > 0",
     "and troupe_checkpoints_total >= 0"),
    ("goodput threshold", "< 0.5\n", "< 0.2\n"),
    ("goodput: states", "and (troupe_job_state == 1 or troupe_job_state == 2)",
     "and troupe_job_state >= 0"),
    ("forming state", "troupe_job_state == 0", "troupe_job_state >= 0"),
    ("goodput phase", 'phase="compute"}', 'phase="exposed_comm"}'),
    ("quantile", "histogram_quantile(0.90,", "histogram_quantile(0.95,"),
    ("recovery rate window", "rate(troupe_recoveries_total[15m])",
     "increase(troupe_recoveries_total[15m])"),
    ("usual step time", "rate(troupe_step_seconds_sum[1h]) / rate(troupe_step_seconds_count[1h])",
     "rate(troupe_step_seconds_sum[1h])"),
    ("stall: N x the usual step time", "10 * troupe:step_seconds:mean_rate1h",
     "2 * troupe:step_seconds:mean_rate1h"),
    ("stall: the floor over the usual time", "mean_rate1h > 300)", "mean_rate1h > 3000)"),
    ("stall: the floor without a usual time", "+ 300)", "+ 3000)"),
    ("stall: states", "and on (job, instance) (troupe_job_state == 1 or troupe_job_state == 2)",
     "and on (job, instance) troupe_job_state >= 0"),
    ("failed state", "troupe_job_state[15m]) == 4", "troupe_job_state[15m]) >= 3"),
    ("failed: stops on request", "troupe_job_exit_code[15m]) >= 75",
     "troupe_job_exit_code[15m]) >= 200"),
    ("failed: the last state counts", "last_over_time(troupe_job_state[15m])",
     "last_over_time(troupe_job_state[30m])"),
    ("divergence threshold", "increase(troupe_divergences_total[15m]) > 0",
     "increase(troupe_divergences_total[15m]) > 1"),
    ("target down", 'up{job="troupe"} == 0', 'up{job="troupe"} >= 0'),
    ("target down: troupe's scrape job", 'up{job="troupe"}', "up"),
    ("target down: ended jobs", "troupe_job_exit_code[1h]) >= 0",
     "troupe_job_exit_code[1h]) >= 1"),
]


def promtool(*args, cwd=None):
    return subprocess.run(["promtool", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def check_coverage(entries):
    """Each recording rule has a promql_expr_test of its name with samples; each alert has a
    test that expects it firing and one that expects it silent."""
    with open(TESTS) as f:
        text = f.read()
    problems = []
    for kind, name, _ in entries:
        if kind == "record":
            if not re.search(rf"- expr: {re.escape(name)}\n\s+eval_time: \S+\n\s+exp_samples:\n"
                             rf"\s+- labels: '{re.escape(name)}\{{", text):
                problems.append(f"recording rule {name}: no test checks its value")
        else:
            cases = re.findall(rf"- alertname: {re.escape(name)}\n\s+eval_time: \S+\n"
                               r"\s+exp_alerts:( \[\])?", text)
            if "" not in cases:
                problems.append(f"alert {name}: no test sees it firing")
            if " []" not in cases:
                problems.append(f"alert {name}: no test sees it silent")
    if problems:
        fail("troupe.rules.test.yml does not cover every rule:\n  " + "\n  ".join(problems))


def check_mutations():
    with open(RULES) as f:
        rules = f.read()
    with tempfile.TemporaryDirectory(prefix="troupe-rules-") as tmp:
        shutil.copy(TESTS, tmp)
        for what, old, new in MUTATIONS:
            if old not in rules:
                fail(f"mutation {what!r}: {old!r} is not in troupe.rules.yml (update the test)")
            with open(os.path.join(tmp, "troupe.rules.yml"), "w") as f:
                f.write(rules.replace(old, new, 1))
            p = promtool("test", "rules", "troupe.rules.test.yml", cwd=tmp)
            if p.returncode == 0:
                fail(f"the unit tests pass with the {what} changed ({old!r} -> {new!r})")
            print(f"  changed {what}: the unit tests fail, as they should")


def test():
    if not shutil.which("promtool"):
        print("SKIP: promtool not found (Debian package 'prometheus')", flush=True)
        raise SystemExit(SKIPPED)
    entries = rule_entries(RULES)
    p = promtool("check", "rules", RULES)
    print(p.stdout + p.stderr)
    if p.returncode != 0:
        fail("promtool check rules failed")
    found = re.search(r"SUCCESS: (\d+) rules found", p.stdout)
    if not found or int(found.group(1)) != len(entries):
        fail(f"promtool found {found and found.group(1)} rules, this test read {len(entries)}")
    alerts = {name for kind, name, _ in entries if kind == "alert"}
    for want in ("TroupeStraggler", "TroupeRecoveryStorm", "TroupeNoCheckpointCommitted",
                 "TroupeLowGoodput", "TroupeJobStuckForming", "TroupeStepsStalled",
                 "TroupeJobFailed", "TroupeJobDiverged", "TroupeTargetDown"):
        if want not in alerts:
            fail(f"no alert {want}")
    check_coverage(entries)
    p = promtool("check", "config", EXAMPLE_CONFIG)
    if p.returncode != 0:
        fail(f"promtool check config {EXAMPLE_CONFIG} failed:\n{p.stdout}{p.stderr}")
    p = promtool("test", "rules", os.path.basename(TESTS), cwd=PROM_DIR)
    print(p.stdout + p.stderr)
    if p.returncode != 0:
        fail("promtool test rules failed")
    check_mutations()
    print(f"{len(entries)} rules checked, unit-tested and mutation-tested")


if __name__ == "__main__":
    main(test)
