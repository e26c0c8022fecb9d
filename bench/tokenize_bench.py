#!/usr/bin/env python3
"""Tokenizing throughput (issue 40): `troupe tokenize --tokenizer M` (encoding only: no
training) against SentencePiece's own `spm_encode --model M --output_format=id` on the same
corpus with the same model, each a whole process from start to its output file on disk.

The corpus: the default job's (build/data/kjv.txt, the King James Bible) repeated to --mb MB,
or README.md and docs/ repeated when it is not built. The model is trained once by troupe
tokenize (--vocab, BPE). Each run of each side is timed alone, alternating, --runs times;
the figures are medians, in MB of corpus per second. troupe's ids are checked to be
spm_encode's (with the newline's own id between lines, which spm_encode leaves out).

Usage: bench/tokenize_bench.py [--runs 5] [--mb 16] [--vocab 8000] [--build build]
         [--dir /var/tmp/troupe-tokenize-bench]
Prints one line per figure; docs/BENCHMARKS.md ("Tokenizing") records them with this command."""

import argparse
import array
import glob
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_corpus(path, mb, build):
    kjv = os.path.join(build, "data", "kjv.txt")
    if os.path.exists(kjv):
        source, name = open(kjv, "rb").read(), "kjv.txt"
    else:
        files = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"),
                                                                      recursive=True))
        source, name = b"".join(open(f, "rb").read() for f in files), "README.md + docs/*.md"
    want = int(mb * 1e6)
    out = bytearray()
    while len(out) < want:
        out += source
    cut = out.rfind(b"\n", 0, want) + 1  # whole lines
    with open(path, "wb") as f:
        f.write(out[:cut])
    return cut, name


def timed(cmd, **kw):
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, **kw)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout.decode()}{p.stderr.decode()}")
    return wall


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--mb", type=float, default=16)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--dir", default="/var/tmp/troupe-tokenize-bench")
    a = ap.parse_args()
    troupe = os.path.join(a.build, "cli", "troupe")
    spm_encode = shutil.which("spm_encode")
    if not spm_encode:
        sys.exit("spm_encode not found: apt-get install sentencepiece (scripts/setup.sh installs it)")
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    corpus = os.path.join(a.dir, "corpus.txt")
    size, name = make_corpus(corpus, a.mb, a.build)
    model_dir = os.path.join(a.dir, "model")
    train_s = timed([troupe, "tokenize", corpus, model_dir, "--vocab", str(a.vocab), "--val-fraction", "0"])
    model = os.path.join(model_dir, "tokenizer.model")
    cpus = os.cpu_count()
    print(f"corpus: {name} repeated to {size / 1e6:.1f} MB; BPE vocab {a.vocab} trained in {train_s:.1f} s; "
          f"CPU {cpu_model()}, {cpus} CPUs; {a.runs} runs each, medians; load average "
          f"{os.getloadavg()[0]:.2f} before")

    spm_out = os.path.join(a.dir, "spm_ids.txt")
    sides = {
        "spm_encode": lambda: timed([spm_encode, "--model", model, "--output_format=id", "--output", spm_out,
                                     corpus]),
        "troupe 1 thread": lambda: timed([troupe, "tokenize", corpus, os.path.join(a.dir, "t1"), "--tokenizer",
                                          model, "--val-fraction", "0", "--threads", "1"]),
        f"troupe {min(cpus, 8)} threads": lambda: timed([troupe, "tokenize", corpus, os.path.join(a.dir, "tn"),
                                                        "--tokenizer", model, "--val-fraction", "0"]),
    }
    walls = {k: [] for k in sides}
    for _ in range(a.runs):
        for k, run in sides.items():
            walls[k].append(run())

    # The same ids: troupe's stream is spm_encode's lines with the newline's id between them.
    ours = array.array("H")
    with open(os.path.join(a.dir, "t1", "train.bin"), "rb") as f:
        ours.frombytes(f.read())
    with open(spm_out) as f:
        lines = [[int(x) for x in line.split()] for line in f]
    newline = max(set(ours) - {i for line in lines for i in line} or {-1})
    theirs = []
    for line in lines:
        theirs += line + [newline]
    same = list(ours) == theirs
    print(f"ids: troupe's train.bin {'equals' if same else 'DIFFERS FROM'} spm_encode's output "
          f"({len(ours)} tokens, newline id {newline})")

    base = statistics.median(walls["spm_encode"])
    for k, w in walls.items():
        med = statistics.median(w)
        print(f"{k:>18}: {size / 1e6 / med:7.1f} MB/s  (median {med:.3f} s; runs "
              f"{' '.join(f'{x:.3f}' for x in w)})  {base / med:.2f}x spm_encode")
    print(f"load average {os.getloadavg()[0]:.2f} after; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
