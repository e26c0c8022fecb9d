#!/usr/bin/python3
"""What checkpoints cost a Python job (issue 39's goal: the stall at most 5 % of a step with a
checkpoint every 10 steps). Each run: `troupe run --world 2 --checkpoint-every 10 -- python3
examples/python/gpt.py` (d_model 128, 60 steps, as bench/python_frontend_bench.py); from
events.jsonl, each checkpoint's stall and the median step time of the steps that took none. The stall is the `checkpoint_stall` phase of
the step after each checkpoint: from the apply to the next step, the state asked of the script,
packed and copied into the snapshot buffer (the write itself runs in the background). Prints each run and the medians.

    /usr/bin/python3 bench/python_checkpoint_bench.py --runs 3 [--troupe build/cli/troupe]
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
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--troupe", default=os.path.join(ROOT, "build", "cli", "troupe"))
    args = ap.parse_args()
    shape = ["--steps", "60", "--batch", "32", "--micro-batch", "8", "--seed", "7"]
    model = ["--d-model", "128", "--heads", "4", "--layers", "2", "--context", "64"]
    ratios = []
    with tempfile.TemporaryDirectory(prefix="troupe-pyckpt-") as tmp:
        for i in range(args.runs):
            run_dir = os.path.join(tmp, f"run{i}")
            p = subprocess.run([args.troupe, "run", "--run-dir", run_dir, "--world", "2",
                                "--no-progress", "--metrics-port", "0", "--eval-every", "0",
                                "--checkpoint-every", "10"] + shape +
                               ["--", "/usr/bin/python3", GPT] + model + shape,
                               capture_output=True, text=True, timeout=600)
            if p.returncode != 0:
                raise SystemExit(f"run {i} exited {p.returncode}:\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
            with open(os.path.join(run_dir, "events.jsonl")) as f:
                events = [json.loads(line) for line in f]
            saved = [e for e in events if e.get("event") == "checkpoint"]
            marked = {e["step"] for e in saved}
            # What held training: the ranks' time from a checkpointed step's apply to their next
            # step (asking the script for its state, packing it, the snapshot copy), which the
            # next step's vote carries into its goodput phases (rank-seconds over the world).
            steps = {e["step"]: e for e in events if e.get("event") == "step"}
            stalls = [steps[s + 1]["phases"].get("checkpoint_stall", 0.0) / steps[s + 1]["world"]
                      for s in marked if s + 1 in steps]
            plain = [e["step_s"] for e in events if e.get("event") == "step" and e["step"] > 10
                     and e["step"] - 1 not in marked and e["step"] not in marked]
            step_s = statistics.median(plain)
            stall = statistics.median(stalls)
            ratios.append(stall / step_s)
            print(f"run {i + 1}: {len(stalls)} checkpoints, median stall {stall * 1000:.2f} ms, "
                  f"median step {step_s * 1000:.1f} ms: {100 * ratios[-1]:.2f} % of a step",
                  flush=True)
    print(f"\nmedian of {args.runs}: a checkpoint stalls training {100 * statistics.median(ratios):.2f} % "
          f"of a step")


if __name__ == "__main__":
    main()
