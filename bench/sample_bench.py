#!/usr/bin/python3
"""Sampling throughput (issue 40): `troupe sample` against the same model in PyTorch with a KV
cache (bench/python/sample_peer.py: a model.generate-style loop with past keys and values over
examples/python/gpt2.py's module, one thread), greedy, same prompt and token count.

For each model size: a short byte-level run on the default corpus (build/data/kjv.txt, else
README.md) gives a checkpoint, `troupe ckpt export --format torch` the peer's file. Then,
alternating, --runs times each: `troupe sample --temperature 0 --verbose` (its stderr timing
line: generation only, the prompt's pass included, loading excluded; BLAS on one thread) and
the peer (--runs repeats in one process after a warm-up, timed the same way). The figures are
medians in tokens/s; the ratio is troupe's median over the peer's. The greedy texts are
compared too: the same model must give the same tokens (up to float rounding near a tie, so
the length of the common prefix is printed).

Usage: bench/sample_bench.py [--runs 7] [--tokens 240] [--sizes small,medium] [--build build]
         [--dir /var/tmp/troupe-sample-bench]
docs/BENCHMARKS.md ("Sampling (issue 40)") records the figures with this command."""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPT = "And God said"
SIZES = {
    # the default job's model, with a context that holds the prompt and every token
    "small": ["--layers", "4", "--heads", "4", "--d-model", "128", "--context", "256",
              "--steps", "40", "--batch", "8", "--micro-batch", "4"],
    # 10.7 M parameters: every token reads 43 MB of weights
    "medium": ["--layers", "6", "--heads", "6", "--d-model", "384", "--context", "256",
               "--steps", "4", "--batch", "2", "--micro-batch", "1"],
}


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stderr}")
    return p


def troupe_rate(troupe, run_dir, tokens):
    p = subprocess.run([troupe, "sample", run_dir, "--prompt", PROMPT, "--tokens", str(tokens),
                        "--temperature", "0", "--verbose"], capture_output=True)
    if p.returncode != 0:
        sys.exit(f"troupe sample: exit {p.returncode}\n{p.stderr.decode()}")
    m = re.search(r"([0-9.]+) tokens/s", p.stderr.decode())
    return float(m.group(1)), p.stdout[len(PROMPT.encode()):]


def common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=240)
    ap.add_argument("--sizes", default="small,medium")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--dir", default="/var/tmp/troupe-sample-bench")
    args = ap.parse_args()
    troupe = os.path.join(args.build, "cli", "troupe")
    corpus = os.path.join(args.build, "data", "kjv.txt")
    if not os.path.exists(corpus):
        corpus = os.path.join(ROOT, "README.md")
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    cpu = next((l.split(":", 1)[1].strip() for l in run(["lscpu"]).stdout.splitlines()
                if l.startswith("Model name")), "?")
    print(f"cpu: {cpu}; prompt {PROMPT!r}, {args.tokens} tokens, greedy, {args.runs} runs")
    for size in args.sizes.split(","):
        run_dir = os.path.join(args.dir, size)
        run([troupe, "run", "--data", corpus, "--run-dir", run_dir, "--world", "1",
             "--checkpoint-every", "0", "--no-progress", "--metrics-port", "0", *SIZES[size]])
        model = os.path.join(args.dir, f"{size}.pt")
        run([troupe, "ckpt", "export", run_dir, "--format", "torch", model])
        ours, theirs = [], []
        text = peer_ids = None
        for _ in range(args.runs):
            rate, text = troupe_rate(troupe, run_dir, args.tokens)
            ours.append(rate)
            p = run(["/usr/bin/python3", os.path.join(ROOT, "bench", "python", "sample_peer.py"),
                     model, "--prompt", PROMPT, "--tokens", str(args.tokens), "--repeats", "1"])
            peer = json.loads(p.stdout)
            theirs += peer["tokens_per_s"]
            peer_ids = bytes(peer["ids"])
        a, b = statistics.median(ours), statistics.median(theirs)
        same = common_prefix(text, peer_ids)
        print(f"{size}: troupe {a:,.0f} tokens/s (runs {', '.join(f'{r:,.0f}' for r in ours)}); "
              f"PyTorch {b:,.0f} tokens/s (runs {', '.join(f'{r:,.0f}' for r in theirs)}); "
              f"ratio {a / b:.2f}; greedy texts agree on {same} of {args.tokens} tokens")


if __name__ == "__main__":
    main()
