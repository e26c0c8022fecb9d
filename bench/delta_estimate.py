#!/usr/bin/env python3
"""What a lossless delta would save over the deduplicating chunk store, measured before it is
built: for two consecutive checkpoints of a real run, every saved box of the second is XORed
(as 32-bit words) with the same box of the first and compressed with zstd -1 (Debian's zstd
CLI), against compressing the box alone. Dense training changes every float every step, so
only the low mantissa bits that did not change can compress.

Usage: /usr/bin/python3 bench/delta_estimate.py [--build build] [--every 10]
Needs numpy (Debian's python3-numpy, installed with python3-torch)."""

import argparse
import json
import os
import shutil
import subprocess
import tempfile

import numpy as np


def chunk(run_dir, key):
    with open(os.path.join(run_dir, "checkpoints", "chunks", key[:2], key), "rb") as f:
        return np.frombuffer(f.read()[48:], dtype=np.uint32)


def piece_words(run_dir, manifest, p):
    words = np.concatenate([chunk(run_dir, k) for k in p["chunks"]])
    n = p["box"][2] * p["box"][3]
    return words[p["offset"]:p["offset"] + n]


def zstd_size(data):
    return len(subprocess.run(["zstd", "-1", "-c", "-q"], input=data.tobytes(),
                              capture_output=True, check=True).stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--every", type=int, default=10)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="troupe-delta-") as tmp:
        run = os.path.join(tmp, "run")
        subprocess.run([os.path.join(a.build, "cli", "troupe"), "run", "--run-dir", run, "--world", "2",
                        "--steps", str(3 * a.every), "--checkpoint-every", str(a.every), "--keep-last", "0",
                        "--eval-every", "0", "--metrics-port", "0", "--no-progress"],
                       check=True, capture_output=True)
        steps = [2 * a.every, 3 * a.every]
        man = [json.load(open(os.path.join(run, "checkpoints", f"step-{s:08d}", "manifest.json")))
               for s in steps]
        before = {(p["rank"], p["array"], p["tensor"], tuple(p["box"])): p for p in man[0]["pieces"]}
        raw = alone = delta = 0
        per_array = {}
        for p in man[1]["pieces"]:
            old = before.get((p["rank"], p["array"], p["tensor"], tuple(p["box"])))
            new_words = piece_words(run, man[1], p)
            raw += new_words.nbytes
            a_size = zstd_size(new_words)
            d_size = zstd_size(new_words ^ piece_words(run, man[0], old)) if old else a_size
            alone += a_size
            delta += d_size
            s = per_array.setdefault(p["array"], [0, 0, 0])
            s[0] += new_words.nbytes
            s[1] += a_size
            s[2] += d_size
        print(f"steps {steps[0]} -> {steps[1]} (checkpoint every {a.every}):")
        print(f"  raw {raw / 1e6:.2f} MB; zstd -1 alone {alone / raw:.1%}; XOR with the previous + zstd -1 "
              f"{delta / raw:.1%} of raw")
        for name, (r, al, d) in per_array.items():
            print(f"  {name:10s} raw {r / 1e6:.2f} MB, zstd alone {al / r:.1%}, delta {d / r:.1%}")


if __name__ == "__main__":
    main()
