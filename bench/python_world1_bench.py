#!/usr/bin/python3
"""World 1 of the Python frontend, taken apart (issue 39): the small GPT of
bench/python_frontend_bench.py three ways, in an order that rotates from round to round:

  torch1   the loop in plain PyTorch (bench/python/ddp_gpt.py --world 1)
  alone    examples/python/gpt.py run by itself: troupe's frontend loop, no runtime
  troupe1  the same script under `troupe run --world 1`

alone/torch1 is what the frontend's loop costs; troupe1/alone what the runtime adds (the
vote's round trip to the coordinator, the hand-offs between the script and the rank thread).
Prints each round and the median of the rounds' ratios to torch1.

    /usr/bin/python3 bench/python_world1_bench.py --rounds 9
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
PYTHON = "/usr/bin/python3"
MODEL = "--d-model 128 --heads 4 --layers 2 --context 64".split()
SHAPE = ["--steps", "60", "--batch", "32", "--micro-batch", "8", "--seed", "7"]


def speed(text, what):
    for line in text.splitlines():
        if line.startswith("speed: "):
            return json.loads(line[len("speed: "):])["samples_per_s"]
    raise SystemExit(f"{what} printed no speed line:\n{text[-3000:]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--troupe", default=os.path.join(ROOT, "build", "cli", "troupe"))
    args = ap.parse_args()
    # As bench/python_frontend_bench.py: one thread, and freed memory kept in the process.
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "build", "python"),
               OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MALLOC_ARENA_MAX="1",
               MALLOC_MMAP_THRESHOLD_=str(32 << 20), MALLOC_TRIM_THRESHOLD_=str(1 << 30))
    script = [PYTHON, os.path.join(ROOT, "examples", "python", "gpt.py")] + MODEL + SHAPE + [
        "--speed-from", "10"]
    tmp = tempfile.mkdtemp(prefix="troupe-world1-")
    runs = {
        "torch1": lambda r: [PYTHON, os.path.join(ROOT, "bench", "python", "ddp_gpt.py"),
                             "--rank", "0", "--world", "1", "--steps", "60", "--speed-from",
                             "10", "--batch", "32", "--micro-batch", "8"] + MODEL,
        "alone": lambda r: script,
        "troupe1": lambda r: [args.troupe, "run", "--run-dir", os.path.join(tmp, f"r{r}"),
                              "--world", "1", "--no-progress", "--metrics-port", "0",
                              "--eval-every", "0"] + SHAPE + ["--"] + script,
    }
    names = list(runs)
    results = {k: [] for k in names}
    for r in range(args.rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            p = subprocess.run(runs[name](r), capture_output=True, text=True, env=env,
                               timeout=600)
            results[name].append(speed(p.stdout + p.stderr, name))
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in results.items()),
              flush=True)
    for k, v in results.items():
        ratio = statistics.median(a / b for a, b in zip(v, results["torch1"]))
        print(f"{k}: median {statistics.median(v):.0f} samples/s, median of the rounds' "
              f"ratios to torch1 {ratio:.3f}")


if __name__ == "__main__":
    sys.exit(main())
