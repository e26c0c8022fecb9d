#!/usr/bin/env python3
"""Checkpoint costs against simpler baselines and a real peer, in one session.

  stall     the default job (world 2) with a checkpoint every 10 steps, asynchronous and
            synchronous, against the same job without checkpoints: median stall per
            checkpoint as a share of the median step, the total wall-time overhead, and
            the overhead within each run (steps after a checkpoint against its clean ones)
  write     a large model's checkpoint written synchronously (one rank) against `dd` with
            fsync of the same bytes to the same disk, and torch.save + fsync of the same
            bytes; restore (--resume) against torch.load
  bytes     bytes written per checkpoint: full, then chunk-deduplicated, for dense training
            and with half the model frozen
  replica   one lost pipeline stage (kill -9, 2 simulated nodes) restored with and without
            --replicate-checkpoints: the restore's seconds and the bytes read from memory
  readback  the large model's synchronous write with --verify-checkpoints after-write
            against the same write without it, alternating: the cost of reading every chunk
            back from the disk (its cached pages dropped) before the commit

Usage: bench/checkpoint_bench.py [--runs 5] [--build build] [--dir /var/tmp/troupe-bench]
Prints one line per figure; docs/benchmarks/checkpoints.md records them with this command."""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

from troupe_events import read_events


def events(run_dir):
    return read_events(os.path.join(run_dir, "events.jsonl"))


def of(evs, name):
    return [e for e in evs if e.get("event") == name]


def run(troupe, run_dir, args):
    shutil.rmtree(run_dir, ignore_errors=True)
    t0 = time.perf_counter()
    p = subprocess.run([troupe, "run", "--run-dir", run_dir, "--metrics-port", "0", "--no-progress"] + args,
                       capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"troupe run {' '.join(args)} failed:\n{p.stdout}{p.stderr}")
    return wall, events(run_dir)


def train_seconds(evs):
    steps = of(evs, "step")
    return (steps[-1]["unix_ms"] - steps[0]["unix_ms"]) / 1000.0


def by_position(evs, steps, every=10):
    """Each step's time after a checkpoint by its distance from it (step % every), as a
    share of the run's own clean steps (positions 6-9, which no checkpoint work reaches):
    within one run, so the machine's drift between runs cancels. Returns (per position,
    the overhead over a whole period of `every` steps)."""
    per = {k: [] for k in range(every)}
    for s in of(evs, "step"):
        if 2 * every < s["step"] <= steps - every:  # past the start-up, before the final save
            per[s["step"] % every].append(s["step_s"])
    med = {k: statistics.median(v) for k, v in per.items()}
    clean = statistics.median([med[k] for k in (6, 7, 8, 9)])
    extra = {k: med[k] / clean - 1 for k in range(every)}
    return extra, sum(extra.values()) / every


def stall(troupe, base, runs, steps=200):
    common = ["--world", "2", "--steps", str(steps), "--eval-every", "0"]
    plain, asyn, syn, stalls_a, stalls_s, steps_s = [], [], [], [], [], []
    positions, in_run, paired = {k: [] for k in range(10)}, [], []
    for _ in range(runs):
        # Every configuration writes the final checkpoint; only the in-run ones differ.
        _, e = run(troupe, base, common + ["--checkpoint-every", "0"])
        plain.append(train_seconds(e))
        steps_s += [s["step_s"] for s in of(e, "step")]
        _, e = run(troupe, base, common + ["--checkpoint-every", "10"])
        asyn.append(train_seconds(e))
        paired.append(asyn[-1] / plain[-1] - 1)
        stalls_a += [c["stall_s"] for c in of(e, "checkpoint") if c["step"] < steps]
        extra, overhead = by_position(e, steps)
        for k, v in extra.items():
            positions[k].append(v)
        in_run.append(overhead)
        _, e = run(troupe, base, common + ["--checkpoint-every", "10", "--set", "checkpoint_async=false"])
        syn.append(train_seconds(e))
        stalls_s += [c["stall_s"] for c in of(e, "checkpoint") if c["step"] < steps]
    step = statistics.median(steps_s)
    print(f"stall: median step {step * 1e3:.2f} ms; async stall {statistics.median(stalls_a) * 1e3:.2f} ms "
          f"({statistics.median(stalls_a) / step:.1%} of a step), sync stall "
          f"{statistics.median(stalls_s) * 1e3:.1f} ms ({statistics.median(stalls_s) / step:.0%})")
    print("train seconds per run: none", [round(x, 3) for x in plain], "async", [round(x, 3) for x in asyn],
          "sync", [round(x, 3) for x in syn])
    p, a, s = statistics.median(plain), statistics.median(asyn), statistics.median(syn)
    print(f"overhead (checkpoint every 10 steps, {steps} steps): async {a / p - 1:+.1%} "
          f"(paired per run: median {statistics.median(paired):+.1%}), sync {s / p - 1:+.1%} "
          f"(train seconds, medians: none {p:.2f}, async {a:.2f}, sync {s:.2f})")
    print("async, each step's extra time by its distance from the checkpoint (median of runs): " +
          " ".join(f"{k}: {statistics.median(v):+.1%}" for k, v in positions.items()))
    print(f"async overhead within each run (against its clean steps): median "
          f"{statistics.median(in_run):+.2%}, runs {[f'{x:+.2%}' for x in in_run]}")


def write(troupe, base, runs):
    model = ["--layers", "8", "--d-model", "384", "--heads", "8", "--world", "1", "--eval-every", "0"]
    w_tp, r_tp, dd_tp, ts_tp, tl_tp, ratios = [], [], [], [], [], []
    nbytes = 0
    for _ in range(runs):
        # dd first, then troupe, each on a file system with nothing left to flush (the last
        # run's files removed, then sync and a pause): a flush also writes back whatever
        # earlier writes and deletions left dirty, which otherwise decides the comparison.
        settle(base)
        dd_tp.append(dd(base, 172 << 20))
        settle(base)
        _, e = run(troupe, base, model + ["--steps", "1", "--checkpoint-every", "0",
                                          "--set", "checkpoint_async=false"])
        c = of(e, "checkpoint")[-1]
        nbytes = c["bytes_written"]
        w_tp.append(nbytes / c["write_s"])
        p = subprocess.run([troupe, "run", "--run-dir", base, "--metrics-port", "0", "--no-progress",
                            "--resume", "--steps", "2"] + model, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(p.stderr)
        restored = [x for x in of(events(base), "restored") if x["from"] == "checkpoint"]
        r_tp.append(sum(x["bytes"] for x in restored) / max(x["seconds"] for x in restored))
        ratios.append(w_tp[-1] / dd_tp[-1])
        # Debian's python3-torch lives in the system interpreter, whatever `python3` is here.
        python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
        torch = subprocess.run([python, "-c", TORCH_SAVE, base, str(nbytes)],
                               capture_output=True, text=True)
        if torch.returncode == 0:
            s, l = map(float, torch.stdout.split())
            ts_tp.append(s)
            tl_tp.append(l)
    gb = 1e9
    # The disk is noisy: each run's write is compared with dd of the same bytes right after it.
    print(f"write: troupe {statistics.median(w_tp) / gb:.2f} GB/s for {nbytes / 1e6:.0f} MB "
          f"(median of the per-run ratios: {statistics.median(ratios):.0%} of dd+fsync "
          f"{statistics.median(dd_tp) / gb:.2f} GB/s; runs {[f'{x:.0%}' for x in ratios]})" +
          (f"; torch.save+fsync {statistics.median(ts_tp) / gb:.2f} GB/s" if ts_tp else "; torch not found"))
    print(f"restore: troupe {statistics.median(r_tp) / gb:.2f} GB/s (verified, the slowest rank)" +
          (f"; torch.load {statistics.median(tl_tp) / gb:.2f} GB/s" if tl_tp else ""))


def readback(troupe, base, runs):
    model = ["--layers", "8", "--d-model", "384", "--heads", "8", "--world", "1", "--eval-every", "0",
             "--steps", "1", "--checkpoint-every", "0", "--set", "checkpoint_async=false"]
    seconds = {"off": [], "after-write": []}
    ratios, reads = [], []
    nbytes = 0
    for _ in range(runs):
        pair = {}
        for mode in ("off", "after-write"):
            settle(base)
            _, e = run(troupe, base, model + ["--verify-checkpoints", mode])
            c = of(e, "checkpoint")[-1]
            nbytes = c["bytes_written"]
            pair[mode] = c["write_s"]
            seconds[mode].append(c["write_s"])
        ratios.append(pair["after-write"] / pair["off"])
        reads.append(dd_read(base, 172 << 20))
    off, on = statistics.median(seconds["off"]), statistics.median(seconds["after-write"])
    print(f"readback: write of {nbytes / 1e6:.0f} MB {off * 1e3:.0f} ms without, {on * 1e3:.0f} ms with "
          f"--verify-checkpoints after-write (median of the per-pair ratios {statistics.median(ratios):.2f}x; "
          f"runs {[f'{x:.2f}' for x in ratios]}); read back at {nbytes / max(on - off, 1e-9) / 1e9:.2f} GB/s, "
          f"dd iflag=direct reads {statistics.median(reads) / 1e9:.2f} GB/s")


def dd_read(base, nbytes):
    """Throughput of dd reading `nbytes` back from the disk (O_DIRECT), beside the run."""
    os.makedirs(base, exist_ok=True)
    target = os.path.join(os.path.dirname(base), "dd.bin")
    subprocess.run(["dd", "if=/dev/urandom", f"of={target}", "bs=1M", f"count={nbytes >> 20}",
                    "conv=fsync"], capture_output=True, check=True)
    t0 = time.perf_counter()
    subprocess.run(["dd", f"if={target}", "of=/dev/null", "bs=1M", "iflag=direct"],
                   capture_output=True, check=True)
    seconds = time.perf_counter() - t0
    os.remove(target)
    return (nbytes >> 20 << 20) / seconds


def settle(base):
    shutil.rmtree(base, ignore_errors=True)
    os.sync()
    time.sleep(2)


def dd(base, nbytes):
    """Throughput of dd writing `nbytes` of zeros with fsync, in the run's directory."""
    os.makedirs(base, exist_ok=True)
    target = os.path.join(os.path.dirname(base), "dd.bin")  # beside the run, same disk
    t0 = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={nbytes >> 20}",
                    "conv=fsync"], capture_output=True, check=True)
    seconds = time.perf_counter() - t0
    os.remove(target)
    return (nbytes >> 20 << 20) / seconds


TORCH_SAVE = r"""
import os, sys, time, torch

d, n = sys.argv[1], int(sys.argv[2])
t = {"state": torch.ones(n // 4)}
p = os.path.join(d, "torch.pt")
t0 = time.perf_counter()
with open(p, "wb") as f:
    torch.save(t, f); f.flush(); os.fsync(f.fileno())
s = n / (time.perf_counter() - t0)
t0 = time.perf_counter()
torch.load(p)
l = n / (time.perf_counter() - t0)
os.remove(p)
print(s, l)
"""


def bytes_per_checkpoint(troupe, base):
    common = ["--world", "2", "--steps", "20", "--checkpoint-every", "10", "--eval-every", "0"]
    # 64 KiB chunks: boxes of 16 KiB and more (this model's matrices) get chunks of their own.
    for name, extra in [("dense", []), ("half frozen", ["--freeze", "wte,wpe,h.0.,h.1.",
                                                        "--checkpoint-chunk-kib", "64"])]:
        _, e = run(troupe, base, common + extra)
        c = of(e, "checkpoint")
        full = c[0]["bytes_written"] + c[0]["bytes_deduplicated"]
        print(f"bytes ({name}): full state {full / 1e6:.2f} MB; first checkpoint wrote "
              f"{c[0]['bytes_written'] / 1e6:.2f} MB, second {c[1]['bytes_written'] / 1e6:.2f} MB "
              f"({c[1]['bytes_written'] / full:.0%} of full)")


def replica(troupe, base, runs):
    args = ["--world", "2", "--nodes", "2", "--pp", "2", "--steps", "24", "--checkpoint-every", "5",
            "--eval-every", "0", "--fault", "kill:rank=1:step=12"]
    got = {}
    for name, extra in [("disk", []), ("memory", ["--replicate-checkpoints"])]:
        seconds, memory, total = [], [], []
        for _ in range(runs):
            _, e = run(troupe, base, args + extra)
            last = of(e, "generation")[-1]["number"]
            r = [x for x in of(e, "restored") if x["generation"] == last and x["from"] == "checkpoint"]
            seconds.append(max(x["seconds"] for x in r))
            memory.append(sum(x.get("from_memory_bytes", 0) for x in r))
            total.append(sum(x["bytes"] for x in r))
        got[name] = statistics.median(seconds)
        print(f"replica ({name}): restore of the lost stage {statistics.median(seconds) * 1e3:.1f} ms, "
              f"{statistics.median(memory) / 1e6:.2f} of {statistics.median(total) / 1e6:.2f} MB from memory")
    print(f"replica: memory / disk restore time {got['memory'] / got['disk']:.2f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--build", default="build")
    ap.add_argument("--dir", default="/var/tmp/troupe-ckpt-bench")
    ap.add_argument("--only", choices=["stall", "write", "bytes", "replica", "readback"])
    a = ap.parse_args()
    troupe = os.path.join(a.build, "cli", "troupe")
    os.makedirs(a.dir, exist_ok=True)
    base = os.path.join(a.dir, "run")
    if a.only in (None, "stall"):
        stall(troupe, base, a.runs)
    if a.only in (None, "write"):
        write(troupe, base, a.runs)
    if a.only in (None, "bytes"):
        bytes_per_checkpoint(troupe, base)
    if a.only in (None, "replica"):
        replica(troupe, base, a.runs)
    if a.only in (None, "readback"):
        readback(troupe, base, a.runs)
    shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
