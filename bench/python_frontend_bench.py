#!/usr/bin/python3
"""The Python frontend against its peers (issue 39), in one session, runs alternating within
each round (the order rotates between rounds): the example GPT (examples/python/gpt.py, a torch.nn model troupe did not write)

  torch1   the same model and loop in plain PyTorch, no troupe (bench/python/ddp_gpt.py
           --world 1)
  troupe1  `troupe run --world 1 -- /usr/bin/python3 gpt.py`
  troupe2  `troupe run --world 2 -- ...`: buckets reduced in place over shared memory
  ddp2     PyTorch DDP over gloo, 2 processes (bench/python/ddp_gpt.py)

troupe's worker keeps freed memory in the process (runtime/sys/warm_memory.cpp: one malloc
arena, no trimming, no mmap below 32 MiB), which on a VM where every first touch of a page
faults makes a torch step several times faster. The peers get the same through glibc's
environment (MALLOC_ARENA_MAX, MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_), so the figures
compare the runtimes, not the allocators; --peer-malloc default shows the difference.

Each figure is samples/s of the steps after --speed-from to the last, as rank 0 measures it in
the script. Prints every run and the medians and ratios as Markdown.

    /usr/bin/python3 bench/python_frontend_bench.py --rounds 5 [--troupe build/cli/troupe]
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
PYTHON = "/usr/bin/python3"
GPT = os.path.join(ROOT, "examples", "python", "gpt.py")
DDP = os.path.join(ROOT, "bench", "python", "ddp_gpt.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def speed_of(text, what):
    for line in text.splitlines():
        if line.startswith("speed: "):
            return json.loads(line[len("speed: "):])["samples_per_s"]
    raise SystemExit(f"{what} printed no speed line:\n{text[-3000:]}")


def run(cmd, what, env=None, timeout=600):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if p.returncode != 0:
        raise SystemExit(f"{what} exited {p.returncode}:\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    return p.stdout + p.stderr


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--troupe", default=os.path.join(ROOT, "build", "cli", "troupe"))
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--speed-from", type=int, default=10)
    ap.add_argument("--model", default="--d-model 128 --heads 4 --layers 2 --context 64",
                    help="gpt.py's model options")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--peer-malloc", choices=["troupe", "default"], default="troupe",
                    help="the peers' glibc malloc settings (see above)")
    args = ap.parse_args()
    model = args.model.split()
    shape = ["--steps", str(args.steps), "--batch", str(args.batch), "--micro-batch",
             str(args.micro_batch), "--seed", "7"]
    script = [PYTHON, GPT] + model + shape + ["--speed-from", str(args.speed_from)]
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(args.troupe))), "python"))
    # One thread per rank, as troupe's workers run (job.threads; torch's matrix products run
    # in OpenBLAS, which torch.set_num_threads does not reach).
    env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    if args.peer_malloc == "troupe":
        env.update(MALLOC_ARENA_MAX="1", MALLOC_MMAP_THRESHOLD_=str(32 << 20),
                   MALLOC_TRIM_THRESHOLD_=str(1 << 30))
    results = {"torch1": [], "troupe1": [], "troupe2": [], "ddp2": []}
    with tempfile.TemporaryDirectory(prefix="troupe-pybench-") as tmp:
        def troupe_run(r, world):
            job = [args.troupe, "run", "--run-dir", os.path.join(tmp, f"r{r}w{world}"),
                   "--world", str(world), "--no-progress", "--metrics-port", "0",
                   "--eval-every", "0"] + shape + ["--"] + script
            results[f"troupe{world}"].append(speed_of(run(job, f"troupe world {world}"),
                                                      f"troupe{world}"))

        def peer_run(r, world):
            port = free_port()
            peer_env = dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            procs = [subprocess.Popen([PYTHON, DDP, "--rank", str(k), "--world", str(world),
                                       "--steps", str(args.steps), "--speed-from",
                                       str(args.speed_from), "--batch", str(args.batch),
                                       "--micro-batch", str(args.micro_batch)] + model,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, env=peer_env) for k in range(world)]
            outs = [p.communicate(timeout=600)[0] for p in procs]
            if any(p.returncode != 0 for p in procs):
                raise SystemExit("the peer failed:\n" + "\n".join(o[-2000:] for o in outs))
            results["torch1" if world == 1 else "ddp2"].append(
                speed_of(outs[0], f"peer world {world}"))

        # The order rotates from round to round, so that no run always follows the same one.
        # With plain PyTorch first in every round, the frontend's loop run alone measured 2 %
        # behind it (5 rounds); rotated, the two were level (6 rounds, 1.001).
        order = [(troupe_run, 1), (peer_run, 1), (troupe_run, 2), (peer_run, 2)]
        for r in range(args.rounds):
            shift = r % len(order)
            for runner, world in order[shift:] + order[:shift]:
                runner(r, world)
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in results.items()),
                  flush=True)
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"\n| run | median samples/s (of {args.rounds}) | runs |\n|---|---|---|")
    for k, v in results.items():
        print(f"| {k} | {med[k]:.0f} | {', '.join(f'{x:.0f}' for x in v)} |")
    # Each round's runs are minutes apart at most; the machine's speed drifts more than that
    # between rounds, so the ratio of each round's pair says more than the ratio of medians.
    def paired(a, b):
        return statistics.median(x / y for x, y in zip(results[a], results[b]))
    print(f"\ntroupe world 1 / plain PyTorch: {med['troupe1'] / med['torch1']:.3f} "
          f"(median of the rounds' ratios: {paired('troupe1', 'torch1'):.3f})")
    print(f"troupe world 2 / DDP world 2: {med['troupe2'] / med['ddp2']:.3f} "
          f"(median of the rounds' ratios: {paired('troupe2', 'ddp2'):.3f})")
    print(f"troupe world 2 / troupe world 1: {med['troupe2'] / med['troupe1']:.3f}")


if __name__ == "__main__":
    sys.exit(main())
