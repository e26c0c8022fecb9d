#!/usr/bin/python3
"""troupe's recovery measured from its own events.jsonl: time to recover from a kill -9 (the
fault's timestamp to the first committed step of the new generation), steps lost, detection
latency for a crash, a hang (SIGSTOP) and a 2x straggler, the step time with a 2x straggler
left alone and rebalanced (4 replicas), goodput under a kill schedule, and
time to recover as the world grows (16, 32, 64 ranks of a tiny model on this machine,
oversubscribed). Each figure is the median (and max) of several trials.

    bench/recovery_bench.py [--troupe build/cli/troupe] [--trials 10] [--worlds 4,16,32,64]
                            [--only recover|detect|goodput|straggler] [--goodput-spares K]

Prints one line per measurement; bench/torchrun_recovery.sh measures the peer the same way.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

from troupe_events import read_events

DEFAULT_JOB = ["--eval-every", "0", "--metrics-port", "0", "--no-progress"]
TINY = ["--layers", "1", "--heads", "1", "--d-model", "16", "--context", "16"]


def run(troupe, args, timeout=600):
    with tempfile.TemporaryDirectory(prefix="troupe-bench-") as tmp:
        run_dir = os.path.join(tmp, "run")
        proc = subprocess.run([troupe, "run", "--run-dir", run_dir] + args, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout)
        events = read_events(os.path.join(run_dir, "events.jsonl"))
        if proc.returncode != 0:
            sys.exit(f"troupe {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-3000:]}")
        return events


def of(events, name):
    return [e for e in events if e.get("event") == name]


def summary(label, values, unit="s", digits=3):
    values = sorted(values)
    print(f"{label}: median {statistics.median(values):.{digits}f} {unit}, max {values[-1]:.{digits}f} {unit}, "
          f"min {values[0]:.{digits}f} {unit} ({len(values)} trials)", flush=True)


def time_to_recover(troupe, world, trials, job):
    recover, lost, detect = [], [], []
    for _ in range(trials):
        events = run(troupe, job + ["--world", str(world), "--steps", "20", "--checkpoint-every", "5",
                                    "--fault", "kill:rank=1:step=10"])
        fault = of(events, "fault")[0]
        new_gen = of(events, "generation")[1]
        first = next(e for e in of(events, "step") if e["generation"] == new_gen["number"])
        recover.append((first["unix_ms"] - fault["unix_ms"]) / 1000)
        detect.append((of(events, "rank_lost")[0]["unix_ms"] - fault["unix_ms"]) / 1000)
        # Committed steps that had to be computed again: none when live ranks hold the state.
        lost.append((fault["step"] - 1) - new_gen["start_step"])
    summary(f"world {world}: kill -9 -> first committed step", recover)
    summary(f"world {world}: kill -9 -> detected", detect)
    print(f"world {world}: committed steps recomputed: median {statistics.median(lost)}, max {max(lost)} "
          f"(plus the step in flight)", flush=True)
    return statistics.median(recover)


def detection(troupe, trials):
    hang, straggle_steps, straggle_s = [], [], []
    for _ in range(trials):
        events = run(troupe, DEFAULT_JOB + ["--world", "4", "--steps", "40", "--checkpoint-every", "0",
                                            "--fault", "stop:rank=1:step=10:for=5s"])
        fault = of(events, "fault")[0]
        hang.append((of(events, "rank_lost")[0]["unix_ms"] - fault["unix_ms"]) / 1000)
        events = run(troupe, DEFAULT_JOB + ["--world", "4", "--steps", "50", "--checkpoint-every", "0",
                                            "--fault", "slow:rank=1:factor=2:from=20"])
        flag = of(events, "straggler")
        slow_start = next(e for e in of(events, "step") if e["step"] == 19)
        if flag and flag[0]["rank"] == 1:
            straggle_steps.append(flag[0]["step"] - 20 + 1)
            straggle_s.append((flag[0]["unix_ms"] - slow_start["unix_ms"]) / 1000)
    summary("hang (SIGSTOP, heartbeat timeout 2 s) -> detected", hang)
    if straggle_steps:
        summary("2x straggler -> flagged", straggle_s)
        print(f"2x straggler -> flagged after median {statistics.median(straggle_steps)} slowed steps, "
              f"max {max(straggle_steps)} ({len(straggle_steps)} of {trials} trials flagged)", flush=True)


def straggler(troupe, trials):
    """Rank 1 of 4 data-parallel replicas computes 2x slower from step 30 (64 micro-batches of one
    sample per step, so the rebalance has room to divide them); the median step time of steps
    70-100 against steps 10-29 of the same run, with the straggler left alone and rebalanced."""
    job = DEFAULT_JOB + ["--layers", "2", "--d-model", "128", "--heads", "4", "--context", "64", "--batch", "64",
                         "--micro-batch", "1", "--world", "4", "--steps", "100", "--checkpoint-every", "0",
                         "--fault", "slow:rank=1:factor=2:from=30"]
    ratios = {"warn": [], "rebalance": []}
    final = []
    for _ in range(trials):
        for policy in ratios:
            events = run(troupe, job + ["--straggler-policy", policy])
            step_s = {e["step"]: e["step_s"] for e in of(events, "step")}
            healthy = statistics.median(step_s[s] for s in range(10, 30))
            ratios[policy].append(statistics.median(step_s[s] for s in range(70, 101)) / healthy)
            if policy == "rebalance":
                final.append(of(events, "generation")[-1]["plan"]["replica_micro_batches"])
    for policy, values in ratios.items():
        print(f"2x straggler, 4 replicas, policy {policy}: step time {statistics.median(values):.2f}x the healthy "
              f"one (median of {trials}; max {max(values):.2f}x)", flush=True)
    print(f"rebalanced micro-batches per replica: {final[0]}", flush=True)


def goodput(troupe, every, steps, trials, spares=0):
    values, kills = [], []
    for seed in range(trials):
        count = max(1, (steps - 10) // every)
        events = run(troupe, DEFAULT_JOB + ["--world", "4", "--steps", str(steps), "--checkpoint-every", "20",
                                            "--max-restarts", str(count + 2), "--fault",
                                            f"random:kills={count}:seed={seed + 1}:every={every}:from=10",
                                            "--spares", str(spares)])
        start = of(events, "training_started")[0]["unix_ms"]
        end = of(events, "job_done")[0]["unix_ms"]
        seen, useful = set(), 0.0
        for e in reversed(of(events, "step")):  # the last commit of a step is the one kept
            if e["step"] not in seen:
                seen.add(e["step"])
                useful += e["step_s"]
        values.append(useful / ((end - start) / 1000))
        kills.append(len(of(events, "fault")))
    print(f"goodput, one kill every {every} steps ({statistics.median(kills)} kills in {steps} steps, workers "
          f"restarted and rejoining, {spares} spares): median {statistics.median(values):.3f}, min {min(values):.3f} "
          f"({trials} trials)", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--troupe", default=os.path.join(os.path.dirname(__file__), "..", "build", "cli", "troupe"))
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--worlds", default="4,16,32,64")
    ap.add_argument("--only", choices=["recover", "detect", "goodput", "straggler"])
    ap.add_argument("--torch-model", action="store_true",
                    help="the 4-rank job uses bench/torch_elastic.py's model (2 layers, d_model 32, context 32), "
                         "to sit beside bench/torchrun_recovery.sh")
    ap.add_argument("--goodput-spares", type=int, default=0,
                    help="idle spare workers in the goodput runs (--spares): a spare takes a lost place at once")
    ap.add_argument("--goodput-seconds", type=float, action="append",
                    help="also a kill every this many seconds of wall time (repeatable)")
    a = ap.parse_args()
    if a.only in (None, "recover"):
        small = ["--layers", "2", "--heads", "2", "--d-model", "32", "--context", "32"] if a.torch_model else []
        base = time_to_recover(a.troupe, 4, a.trials, DEFAULT_JOB + small)
        for world in [int(w) for w in a.worlds.split(",") if int(w) != 4]:
            job = DEFAULT_JOB + TINY + ["--batch", str(world), "--micro-batch", "1", "--step-timeout-ms", "20000"]
            t = time_to_recover(a.troupe, world, a.trials, job)
            print(f"world {world}: {t / base:.2f}x the 4-rank time", flush=True)
    if a.only in (None, "detect"):
        detection(a.troupe, a.trials)
    if a.only in (None, "straggler"):
        straggler(a.troupe, max(3, a.trials // 3))
    if a.only in (None, "goodput"):
        goodput(a.troupe, 60, 600, max(3, a.trials // 3), a.goodput_spares)
        goodput(a.troupe, 15, 600, max(3, a.trials // 3), a.goodput_spares)
        if a.goodput_seconds:
            # A kill every N seconds of wall time at this machine's own step time.
            probe = run(a.troupe, DEFAULT_JOB + ["--world", "4", "--steps", "40", "--checkpoint-every", "0"])
            step_s = statistics.median(e["step_s"] for e in of(probe, "step")[10:])
            for seconds in a.goodput_seconds:
                every = max(2, round(seconds / step_s))
                print(f"(one kill every {seconds} s at {step_s * 1e3:.0f} ms a step = every {every} steps)", flush=True)
                goodput(a.troupe, every, 4 * every + 10, max(1, a.trials // 9))


if __name__ == "__main__":
    main()
