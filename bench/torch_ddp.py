#!/usr/bin/python3
"""One rank of PyTorch DDP (gloo, CPU, one thread) training the byte-level GPT of
bench/torch_gpt.py, timed per step: the peer of troupe's cross-node training benchmark
(bench/cross_node_bench.py starts one per rank, each in its node's network namespace).

    GLOO_SOCKET_IFNAME=eth0 /usr/bin/python3 bench/torch_ddp.py --rank R --world 4 \\
        --master 10.200.7.11:29600 --data build/data/kjv.txt --steps 40 --out rankR.json

The process group meets over TCP at --master (rank 0 serves torch's store there). Rank r
trains on its contiguous share of each step's global batch (torch_elastic.py's sampling), in
micro-batches, with DDP all-reducing once per step (no_sync on the others).

Timing per step, written to --out as JSON ({"steps": [{"step_s", "comm_s"}, ...], ...}):
  step_s  from the start of the step to the start of the next (forward, backward, optimizer)
  comm_s  the time this rank waited for gradient communication after its backward compute
          ended: from the call of the step's last bucket's comm hook (every gradient is then
          computed) until backward() returned (DDP waits for every bucket's all-reduce and
          copies the results back there). DDP overlaps the earlier buckets' all-reduce with the
          backward pass; only what is left after it is counted, as troupe's comm_s counts the
          reduction that follows its compute. The hook is DDP's own allreduce_hook with a
          timestamp (the behaviour DDP documents for the hook: the same results as no hook).
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_ddp_common import build, train_step, wrap  # noqa: E402
from torch_gpt import add_model_args  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--master", required=True, help="HOST:PORT of rank 0's store")
    ap.add_argument("--data", required=True)
    ap.add_argument("--steps", type=int, default=40)
    add_model_args(ap, layers=4, heads=4, d_model=128, context=64, warmup=20)
    ap.add_argument("--timeout-s", type=float, default=120)
    ap.add_argument("--out", required=True, help="this rank's timings (JSON)")
    args = ap.parse_args()

    torch.set_num_threads(1)
    host, port = args.master.rsplit(":", 1)
    t_init = time.perf_counter()
    dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=args.rank,
                            world_size=args.world,
                            timeout=__import__("datetime").timedelta(seconds=args.timeout_s))
    init_s = time.perf_counter() - t_init
    if args.batch % (args.world * args.micro_batch):
        sys.exit(f"--batch {args.batch} must be a multiple of world x micro-batch")

    data = np.memmap(args.data, dtype=np.uint8, mode="r")
    model, opt = build(args)
    ddp = wrap(model)
    last_ready = [0.0]

    def timed_allreduce(state, bucket):
        last_ready[0] = time.perf_counter()
        return default_hooks.allreduce_hook(None, bucket)

    ddp.register_comm_hook(None, timed_allreduce)

    steps = []
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        waited = []
        train_step(ddp, model, opt, data, args, step, args.rank, args.world,
                   after_backward=lambda: waited.append(time.perf_counter() - last_ready[0]))
        steps.append({"t0": t0, "comm_s": waited[0] if waited else 0.0})
    end = time.perf_counter()
    for i, s in enumerate(steps):
        s["step_s"] = (steps[i + 1]["t0"] if i + 1 < len(steps) else end) - s["t0"]
        del s["t0"]
    with open(args.out + ".tmp", "w") as f:  # renamed: a reader never sees half of it
        json.dump({"rank": args.rank, "world": args.world, "init_s": init_s,
                   "tokens_per_step": args.batch * args.context, "torch": torch.__version__,
                   "steps": steps}, f)
    os.replace(args.out + ".tmp", args.out)
    # Every rank is done once all pass this barrier; then leave without
    # destroy_process_group, in which torch 1.13 sometimes left rank 0 (the store's host)
    # hanging here after the others had gone.
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
