#!/usr/bin/python3
"""The peers of the Python frontend's benchmark (--world 1: the same loop in plain PyTorch): the same torch.nn GPT as examples/python/gpt.py
(its model, dataset and optimizer, imported from there), trained with PyTorch DDP over gloo on
loopback, one process per rank, one thread each, with the same global batch and micro-batches:
each rank runs its micro-batches under no_sync() but the last, whose backward all-reduces (DDP's
buckets, overlapped with backward). Rank 0 prints the same 'speed:' line as gpt.py.

    MASTER_ADDR=127.0.0.1 MASTER_PORT=29600 /usr/bin/python3 bench/python/ddp_gpt.py \\
        --rank R --world 2 --steps 60 --speed-from 10 [gpt.py's model options]
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "examples", "python"))
sys.path.insert(0, os.path.join(ROOT, "build", "python"))
from gpt import GPT, TEXT, Characters  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--speed-from", type=int, default=10)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--context", type=int, default=32)
    ap.add_argument("--dropout", type=float, default=0.1)
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)  # as troupe.init() does
    torch.manual_seed(args.seed)
    alone = args.world == 1  # plain PyTorch: no process group, no DDP
    if not alone:
        dist.init_process_group("gloo", rank=args.rank, world_size=args.world)
    data = Characters(TEXT, args.context)
    model = GPT(len(data.vocab), args.d_model, args.heads, args.layers, args.context,
                args.dropout, False)
    # gloo broadcasts no bool tensors: the causal masks (derived, equal everywhere) stay out.
    if alone:
        ddp = model
    else:
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
            model, [n for n, b in model.named_buffers() if b.dtype == torch.bool])
        ddp = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    per_rank = args.batch // args.world
    micro = min(args.micro_batch, per_rank)
    generator = torch.Generator().manual_seed(args.seed)
    start = None
    for step in range(1, args.steps + 1):
        order = torch.randint(len(data), (args.batch,), generator=generator).tolist()
        mine = order[args.rank * per_rank:(args.rank + 1) * per_rank]
        chunks = [mine[i:i + micro] for i in range(0, len(mine), micro)]
        optimizer.zero_grad(set_to_none=False)
        for j, chunk in enumerate(chunks):
            x, y = torch.utils.data.default_collate([data[i] for i in chunk])
            last = j == len(chunks) - 1
            context = ddp.no_sync() if not (last or alone) else _nothing()
            with context:
                logits = ddp(x)
                loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))
                (loss * len(chunk) / per_rank).backward()
        optimizer.step()
        schedule.step()
        if args.rank == 0 and step == args.speed_from:
            start = time.perf_counter()
    if not alone:
        dist.barrier()
    if args.rank == 0 and start is not None:
        seconds = time.perf_counter() - start
        samples = (args.steps - args.speed_from) * args.batch
        print("speed: " + json.dumps({"samples_per_s": samples / seconds,
                                      "steps": args.steps - args.speed_from,
                                      "seconds": seconds}), flush=True)
    if not alone:
        dist.destroy_process_group()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()
