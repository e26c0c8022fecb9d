#!/usr/bin/python3
"""Where a step's time goes in a multi-rank job: compute (forward+backward), communication
(gradient all-reduce) and control plane (vote -> commit round trip through the
coordinator, less the time the vote waited there for the slowest rank's, which is
reported as peer wait), from events.jsonl of real `troupe run` jobs.

usage: bench/step_split.py [--troupe build/cli/troupe] [--world 2] [--steps 60] [--repeats 3]
                           [-- extra troupe run options, e.g. --tp 2 or --zero 1]
Prints per-run medians and the median over runs; the control-plane share is the figure
the design promises to keep under 1% of a step."""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

from troupe_events import read_events


def one_run(troupe, world, steps, extra):
    with tempfile.TemporaryDirectory(prefix="troupe-bench-") as tmp:
        run_dir = os.path.join(tmp, "run")
        cmd = [troupe, "run", "--world", str(world), "--steps", str(steps), "--run-dir", run_dir,
               "--metrics-port", "0", "--checkpoint-every", "0", "--eval-every", "0", "--no-progress"] + extra
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        steps_ev = [e for e in read_events(os.path.join(run_dir, "events.jsonl"))
                    if e.get("event") == "step"]
    # Skip warm-up steps (first touches of buffers, connection set-up).
    steady = steps_ev[5:]
    med = lambda key: statistics.median(e[key] for e in steady)
    return {k: med(k) for k in ("step_s", "compute_s", "comm_s", "control_s", "peer_wait_s", "tokens_per_s")}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--troupe", default="build/cli/troupe")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("extra", nargs="*", help="more `troupe run` options (after --)")
    a = p.parse_args()
    runs = [one_run(a.troupe, a.world, a.steps, a.extra) for _ in range(a.repeats)]
    for i, r in enumerate(runs):
        print(f"run {i}: step {r['step_s']*1e3:.1f} ms = compute {r['compute_s']*1e3:.1f} + comm "
              f"{r['comm_s']*1e3:.1f} + control {r['control_s']*1e3:.2f} + peer wait {r['peer_wait_s']*1e3:.2f} "
              f"(+ optimizer/other); "
              f"{r['tokens_per_s']:.0f} tok/s")
    m = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(f"median of {a.repeats} runs, world {a.world} {' '.join(a.extra)}: step {m['step_s']*1e3:.1f} ms | compute "
          f"{m['compute_s']/m['step_s']:.1%} | comm {m['comm_s']/m['step_s']:.1%} | control plane "
          f"{m['control_s']/m['step_s']:.2%} ({m['control_s']*1e3:.2f} ms) | peer wait "
          f"{m['peer_wait_s']/m['step_s']:.2%} | {m['tokens_per_s']:.0f} tok/s")


if __name__ == "__main__":
    main()
