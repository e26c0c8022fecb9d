#!/usr/bin/python3
"""The PyTorch peer of troupe's kill -9 recovery measurement (bench/torchrun_recovery.sh).

Data-parallel training (DDP, gloo, CPU, one thread per worker) of the byte-level GPT in
bench/torch_gpt.py, meant to be launched by torchrun (PyTorch 1.13, Debian's /usr/bin/python3):

    torchrun --standalone --nproc_per_node 4 --max_restarts 3 bench/torch_elastic.py \
        --data build/data/kjv.txt --steps 20 --ckpt-dir CKPT --log LOG --kill-rank 1 --kill-step 10

Steps are numbered 1..--steps, as in troupe. After every --checkpoint-every steps rank 0 saves
model, optimizer and step (tmp file + os.replace, so a checkpoint is either whole or absent).
A (re)started worker group resumes from the newest checkpoint: "resume_step" is the last
step it restores (0 when there is none) and training continues at resume_step + 1.

Fault: in the first incarnation only (TORCHELASTIC_RESTART_COUNT == 0), rank --kill-rank
logs a "kill" event just before step --kill-step would start and SIGKILLs itself; torchrun
has to notice, tear down the other workers and start a new group.

--log receives JSON lines, all with unix_ms:
  {"event":"start", "restart", "resume_step", "proc_unix_ms"}  rank 0, ready to train
      (proc_unix_ms: when the worker's interpreter reached this file, before importing torch)
  {"event":"step", "step", "restart", "loss"}                   rank 0, after each step
      (loss: rank 0's share of the batch)
  {"event":"kill", "step", "rank"}                               the killed rank, just before dying

The sample for (seed, step, i) is fixed: np.random.default_rng(seed * 1_000_003 + step)
draws the step's global batch of offsets, and rank r trains on its contiguous slice of it,
so a recomputed step sees the same bytes as the first time.
"""
import time

PROC_UNIX_MS = int(time.time() * 1000)  # before the (slow) torch import

import argparse
import glob
import json
import os
import signal
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt import GPT, learning_rate  # noqa: E402


def now_ms():
    return int(time.time() * 1000)


def append_json(path, record):
    """One short line in append mode: concurrent appenders do not interleave within it."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()


def newest_checkpoint(ckpt_dir):
    """Path of the checkpoint with the highest step in ckpt_dir, or None."""
    paths = glob.glob(os.path.join(ckpt_dir, "step_*.pt"))  # "*.pt.tmp" never matches
    if not paths:
        return None
    return max(paths, key=lambda p: int(os.path.basename(p)[len("step_"):-len(".pt")]))


def save_checkpoint(ckpt_dir, step, model, opt):
    """Rank 0 only. Write, then rename into place; keep the two newest checkpoints."""
    final = os.path.join(ckpt_dir, f"step_{step:08d}.pt")
    tmp = final + ".tmp"
    torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict()}, tmp)
    os.replace(tmp, final)
    for old in sorted(glob.glob(os.path.join(ckpt_dir, "step_*.pt")))[:-2]:
        os.remove(old)


def batch_offsets(seed, step, batch, limit):
    """The global batch of window offsets for one step; the same for every rank and every run."""
    rng = np.random.default_rng(seed * 1_000_003 + step)
    return rng.integers(0, limit, size=batch)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="corpus file, read as raw bytes")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=16, help="global batch (windows per step)")
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=32)
    ap.add_argument("--context", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--checkpoint-every", type=int, default=5)
    ap.add_argument("--ckpt-dir", required=True)
    ap.add_argument("--log", required=True, help="JSON-lines event log")
    ap.add_argument("--kill-rank", type=int, default=-1)
    ap.add_argument("--kill-step", type=int, default=-1)
    args = ap.parse_args()

    torch.set_num_threads(1)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.init_process_group("gloo")  # MASTER_ADDR/PORT, RANK, WORLD_SIZE come from torchrun
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch % world:
        sys.exit(f"--batch {args.batch} is not a multiple of the world size {world}")
    share = args.batch // world  # windows per rank per step
    os.makedirs(args.ckpt_dir, exist_ok=True)

    data = np.memmap(args.data, dtype=np.uint8, mode="r")
    T = args.context
    limit = len(data) - T - 1

    torch.manual_seed(args.seed)  # same init everywhere (DDP also broadcasts rank 0's)
    model = GPT(args.layers, args.heads, args.d_model, T)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)

    # Every rank loads the same file: the old group is gone before a new one starts, so the
    # directory cannot change under us.
    resume_step = 0
    path = newest_checkpoint(args.ckpt_dir)
    if path is not None:
        state = torch.load(path)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        resume_step = state["step"]
    # gloo cannot broadcast the bool causal-mask buffer ("Invalid scalar type"); it is a
    # constant, identical on every rank, so DDP is told to leave it alone.
    DDP._set_params_and_buffers_to_ignore_for_model(model, ["mask"])
    ddp = DDP(model, broadcast_buffers=False)

    if rank == 0:
        append_json(args.log, {"event": "start", "unix_ms": now_ms(), "restart": restart,
                               "resume_step": resume_step, "proc_unix_ms": PROC_UNIX_MS})

    for step in range(resume_step + 1, args.steps + 1):
        if restart == 0 and rank == args.kill_rank and step == args.kill_step:
            append_json(args.log, {"event": "kill", "step": step, "rank": rank, "unix_ms": now_ms()})
            os.kill(os.getpid(), signal.SIGKILL)

        for g in opt.param_groups:
            g["lr"] = learning_rate(step - 1, args.steps, args.lr, args.warmup, 0.1)
        opt.zero_grad(set_to_none=True)

        mine = batch_offsets(args.seed, step, args.batch, limit)[rank * share:(rank + 1) * share]
        chunks = [mine[i:i + args.micro_batch] for i in range(0, share, args.micro_batch)]
        loss_sum = 0.0
        for i, chunk in enumerate(chunks):
            window = torch.from_numpy(np.stack([data[o:o + T + 1] for o in chunk]).astype(np.int64))
            # Each micro-batch is weighted by its share of this rank's windows; DDP then averages
            # over ranks, giving the mean over the global batch. Only the last one all-reduces.
            weight = len(chunk) / share
            if i + 1 < len(chunks):
                with ddp.no_sync():
                    loss = ddp(window[:, :-1], window[:, 1:])
                    (loss * weight).backward()
            else:
                loss = ddp(window[:, :-1], window[:, 1:])
                (loss * weight).backward()
            loss_sum += loss.item() * weight
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

        if rank == 0:
            if args.checkpoint_every > 0 and step % args.checkpoint_every == 0:
                save_checkpoint(args.ckpt_dir, step, model, opt)
            append_json(args.log, {"event": "step", "step": step, "unix_ms": now_ms(),
                                   "restart": restart, "loss": round(loss_sum, 5)})

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
