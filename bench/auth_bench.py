#!/usr/bin/env python3
"""The cost of authentication, side by side in one session: this build (TLS 1.3 control plane,
authenticated store) against a baseline build from before it (plain TCP everywhere).

  step       median step time of the default job (`troupe run` defaults, 200 steps, the first
             10 left out), this build over the baseline (target: within 1%)
  formation  time from launching `troupe run --world 4` to its `training_started` event: the
             job's credentials, every agent's and worker's TLS handshake, the store's
             handshakes (target: within 100 ms of the baseline)

Runs alternate between the builds (A B A B ...) so that drift on a noisy machine hits both.

Build the baseline once:
  git worktree add /var/tmp/troupe-baseline 2689aa0
  cmake -S /var/tmp/troupe-baseline -B /var/tmp/troupe-baseline/build -G Ninja \\
        -DCMAKE_BUILD_TYPE=RelWithDebInfo && ninja -C /var/tmp/troupe-baseline/build troupe
Usage: bench/auth_bench.py --baseline /var/tmp/troupe-baseline/build/cli/troupe [--runs 5]
Prints one line per figure; docs/benchmarks/hardening.md records them with this command."""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

from troupe_events import read_events


def run(troupe, run_dir, args):
    shutil.rmtree(run_dir, ignore_errors=True)
    launched_ms = time.time() * 1000.0
    p = subprocess.run([troupe, "run", "--run-dir", run_dir, "--metrics-port", "0",
                        "--no-progress"] + args, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{troupe} {' '.join(args)} failed ({p.returncode}):\n{p.stdout}{p.stderr}")
    return launched_ms, read_events(os.path.join(run_dir, "events.jsonl"))


def median_step(events):
    steps = [e["step_s"] for e in events if e.get("event") == "step" and e.get("step", 0) > 10]
    return statistics.median(steps)


def formation_s(launched_ms, events):
    started = next(e for e in events if e.get("event") == "training_started")
    return (started["unix_ms"] - launched_ms) / 1000.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--baseline", required=True, help="troupe binary built before authentication")
    ap.add_argument("--build", default="build")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dir", default="/var/tmp/troupe-auth-bench")
    a = ap.parse_args()
    builds = {"auth": os.path.join(a.build, "cli", "troupe"), "baseline": a.baseline}
    os.makedirs(a.dir, exist_ok=True)

    step = {k: [] for k in builds}
    form = {k: [] for k in builds}
    for i in range(a.runs):
        for name, troupe in builds.items():
            _, evs = run(troupe, os.path.join(a.dir, f"{name}-step"), ["--steps", "200",
                                                                        "--checkpoint-every", "0"])
            step[name].append(median_step(evs))
            launched, evs = run(troupe, os.path.join(a.dir, f"{name}-form"),
                                ["--world", "4", "--steps", "2", "--checkpoint-every", "0",
                                 "--eval-every", "0"])
            form[name].append(formation_s(launched, evs))
        print(f"run {i + 1}/{a.runs}: step auth {step['auth'][-1] * 1e3:.2f} ms, baseline "
              f"{step['baseline'][-1] * 1e3:.2f} ms; formation auth {form['auth'][-1] * 1e3:.0f} ms, "
              f"baseline {form['baseline'][-1] * 1e3:.0f} ms", flush=True)

    s_auth, s_base = statistics.median(step["auth"]), statistics.median(step["baseline"])
    f_auth, f_base = statistics.median(form["auth"]), statistics.median(form["baseline"])
    print(f"step (default job, median of {a.runs} runs' medians): auth {s_auth * 1e3:.2f} ms, "
          f"baseline {s_base * 1e3:.2f} ms, ratio {s_auth / s_base:.3f} (target <= 1.01)")
    print(f"formation (--world 4, launch to training_started, median of {a.runs}): auth "
          f"{f_auth * 1e3:.0f} ms, baseline {f_base * 1e3:.0f} ms, difference "
          f"{(f_auth - f_base) * 1e3:+.0f} ms (target <= +100 ms)")


if __name__ == "__main__":
    main()
