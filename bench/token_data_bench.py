#!/usr/bin/python3
"""Token files of any size (issue 40): the same job on a 4 MiB and a 4 GiB uint16 token file,
runs alternating. For each run: the seconds from starting `troupe run` to its first committed
step (the `step` event's time), and each worker's peak resident memory (VmHWM, the `memory`
events). The 4 GiB file is sparse (all holes: ids 0), so it costs no disk; its pages are
mapped, never read whole. Goals: the first step within 1 s of the small file's, and each
worker's memory within 100 MB of it.

    /usr/bin/python3 bench/token_data_bench.py --runs 5 [--troupe build/cli/troupe]
"""
import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import troupe_events  # noqa: E402

VOCAB = 512


def sidecar(path, tokens):
    with open(path + ".json", "w") as f:
        json.dump({"format": "troupe.tokens", "version": 1, "dtype": "uint16", "vocab_size": VOCAB,
                   "tokens": tokens, "tokenizer": ""}, f)


def make_files(tmp):
    small = os.path.join(tmp, "small.bin")
    n = 2 << 20  # 4 MiB of uint16 ids
    with open(small, "wb") as f:
        f.write(struct.pack(f"<{n}H", *((i * 7 + i // 509) % VOCAB for i in range(n))))
    sidecar(small, n)
    big = os.path.join(tmp, "big.bin")
    n = 2 << 30  # 4 GiB
    with open(big, "wb") as f:
        f.truncate(2 * n)
    sidecar(big, n)
    return small, big


def one_run(troupe, data, run_dir, steps):
    args = [troupe, "run", "--run-dir", run_dir, "--data", data, "--world", "2", "--steps",
            str(steps), "--layers", "2", "--heads", "2", "--d-model", "64", "--context", "64",
            "--batch", "16", "--micro-batch", "4", "--eval-every", "0", "--no-progress",
            "--metrics-port", "0"]
    started = time.time()
    p = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise SystemExit(f"troupe run on {data} exited {p.returncode}:\n{p.stdout[-2000:]}"
                         f"{p.stderr[-2000:]}")
    events = troupe_events.read_events(os.path.join(run_dir, "events.jsonl"))
    first = min(e["unix_ms"] for e in events if e.get("event") == "step") / 1000.0
    peak = {}
    for e in events:
        if e.get("event") == "memory" and e.get("peak_rss_bytes"):
            peak[e["rank"]] = max(peak.get(e["rank"], 0), e["peak_rss_bytes"])
    return first - started, max(peak.values()) if peak else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--troupe", default=os.path.join(ROOT, "build", "cli", "troupe"))
    args = ap.parse_args()
    results = {"4 MiB": [], "4 GiB": []}
    with tempfile.TemporaryDirectory(prefix="troupe-tokbench-") as tmp:
        small, big = make_files(tmp)
        for r in range(args.runs):
            order = [("4 MiB", small), ("4 GiB", big)]
            for name, path in order if r % 2 == 0 else reversed(order):
                run_dir = os.path.join(tmp, f"run-{r}-{name.replace(' ', '')}")
                results[name].append(one_run(args.troupe, path, run_dir, args.steps))
            print(f"run {r + 1}: " + ", ".join(
                f"{k} first step {v[-1][0]:.2f} s, peak RSS {v[-1][1] / 2**20:.1f} MiB"
                for k, v in results.items()), flush=True)
    print("\n| file | first step, median s | runs | worker peak RSS, median MiB |")
    print("|---|---|---|---|")
    med = {}
    for k, v in results.items():
        med[k] = (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v))
        print(f"| {k} | {med[k][0]:.2f} | {', '.join(f'{x[0]:.2f}' for x in v)} | "
              f"{med[k][1] / 2**20:.1f} |")
    print(f"\n4 GiB - 4 MiB: first step {med['4 GiB'][0] - med['4 MiB'][0]:+.2f} s (goal < 1 s), "
          f"peak RSS {(med['4 GiB'][1] - med['4 MiB'][1]) / 2**20:+.1f} MiB (goal < 100 MB)")


if __name__ == "__main__":
    sys.exit(main())
