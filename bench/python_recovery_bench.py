#!/usr/bin/python3
"""How fast a Python job goes on after a kill -9 of one of its workers (issue 39's goal: the next
committed step within 0.1 s at 4 ranks, no committed step lost). Each run: `troupe run --world 4
--fault kill:rank=1:step=20 -- /usr/bin/python3 examples/python/gpt.py`, the small GPT; from
events.jsonl, the time from the fault (the coordinator's SIGKILL) to the rank_lost verdict and to
the next committed step, and whether every step 1..N was committed. Prints each run and medians.

    /usr/bin/python3 bench/python_recovery_bench.py --runs 5 [--troupe build/cli/troupe]
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
GPT = os.path.join(ROOT, "examples", "python", "gpt.py")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--troupe", default=os.path.join(ROOT, "build", "cli", "troupe"))
    args = ap.parse_args()
    shape = ["--steps", "40", "--batch", "16", "--micro-batch", "4", "--seed", "7"]
    verdicts, commits = [], []
    with tempfile.TemporaryDirectory(prefix="troupe-pyrecovery-") as tmp:
        for i in range(args.runs):
            run_dir = os.path.join(tmp, f"run{i}")
            p = subprocess.run([args.troupe, "run", "--run-dir", run_dir, "--world", "4",
                                "--no-progress", "--metrics-port", "0", "--eval-every", "0",
                                "--fault", "kill:rank=1:step=20"] + shape +
                               ["--", "/usr/bin/python3", GPT, "--d-model", "32"] + shape,
                               capture_output=True, text=True, timeout=600)
            if p.returncode != 0:
                raise SystemExit(f"run {i} exited {p.returncode}:\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
            with open(os.path.join(run_dir, "events.jsonl")) as f:
                events = [json.loads(line) for line in f]
            fault = next(e for e in events if e.get("event") == "fault")
            lost = next(e for e in events if e.get("event") == "rank_lost")
            steps = [e for e in events if e.get("event") == "step"]
            if sorted(e["step"] for e in steps) != list(range(1, 41)):
                raise SystemExit(f"run {i}: committed steps {[e['step'] for e in steps]}")
            after = next(e for e in steps if e["unix_ms"] > fault["unix_ms"])
            verdicts.append(lost["unix_ms"] - fault["unix_ms"])
            commits.append(after["unix_ms"] - fault["unix_ms"])
            print(f"run {i + 1}: lost after {verdicts[-1]} ms, step {after['step']} committed "
                  f"after {commits[-1]} ms at world {after['world']}", flush=True)
    print(f"\nmedian of {args.runs}: kill -9 -> rank_lost {statistics.median(verdicts)} ms, "
          f"-> next committed step {statistics.median(commits)} ms; 0 committed steps lost")


if __name__ == "__main__":
    main()
