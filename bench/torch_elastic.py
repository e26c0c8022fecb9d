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

Agent fault (bench/torchrun_takeover.py): --kill-agent-step S is given to one torchrun agent's
workers only. In its first incarnation, that agent's local rank 0 logs a "kill" event with
"target": "agent" just before step S and SIGKILLs its parent, the torchrun agent, then goes on
training: the workers themselves are untouched, as when a node agent (or the process hosting
the rendezvous store) crashes.

--log receives JSON lines, all with unix_ms:
  {"event":"start", "restart", "resume_step", "proc_unix_ms"}  rank 0, ready to train
      (proc_unix_ms: when the worker's interpreter reached this file, before importing torch)
  {"event":"step", "step", "restart", "loss"}                   rank 0, after each step
      (loss: rank 0's share of the batch)
  {"event":"kill", "step", "rank"}                               the killed rank, just before dying
  {"event":"kill", "step", "rank", "target":"agent", "agent_pid"} --kill-agent-step: before the agent's kill
Start and step events also carry "pid", rank 0's process id: steps with a new pid come from a
new worker group, even where a new agent counts its restarts from 0 again.

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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_ddp_common import build, train_step, wrap  # noqa: E402
from torch_gpt import add_model_args  # noqa: E402


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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="corpus file, read as raw bytes")
    ap.add_argument("--steps", type=int, default=20)
    add_model_args(ap, layers=2, heads=2, d_model=32, context=32, warmup=5)
    ap.add_argument("--checkpoint-every", type=int, default=5)
    ap.add_argument("--ckpt-dir", required=True)
    ap.add_argument("--log", required=True, help="JSON-lines event log")
    ap.add_argument("--kill-rank", type=int, default=-1)
    ap.add_argument("--kill-step", type=int, default=-1)
    ap.add_argument("--kill-agent-step", type=int, default=-1,
                    help="local rank 0 SIGKILLs its torchrun agent (its parent) before this step")
    args = ap.parse_args()

    torch.set_num_threads(1)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.init_process_group("gloo")  # MASTER_ADDR/PORT, RANK, WORLD_SIZE come from torchrun
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch % world:
        sys.exit(f"--batch {args.batch} is not a multiple of the world size {world}")
    os.makedirs(args.ckpt_dir, exist_ok=True)

    data = np.memmap(args.data, dtype=np.uint8, mode="r")
    model, opt = build(args)  # the same init everywhere (DDP also broadcasts rank 0's)

    # Every rank loads the same file: the old group is gone before a new one starts, so the
    # directory cannot change under us.
    resume_step = 0
    path = newest_checkpoint(args.ckpt_dir)
    if path is not None:
        state = torch.load(path)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        resume_step = state["step"]
    ddp = wrap(model)

    if rank == 0:
        append_json(args.log, {"event": "start", "unix_ms": now_ms(), "restart": restart,
                               "resume_step": resume_step, "proc_unix_ms": PROC_UNIX_MS,
                               "pid": os.getpid()})

    for step in range(resume_step + 1, args.steps + 1):
        if restart == 0 and rank == args.kill_rank and step == args.kill_step:
            append_json(args.log, {"event": "kill", "step": step, "rank": rank, "unix_ms": now_ms()})
            os.kill(os.getpid(), signal.SIGKILL)
        if (restart == 0 and step == args.kill_agent_step
                and int(os.environ.get("LOCAL_RANK", "-1")) == 0):
            agent = os.getppid()
            append_json(args.log, {"event": "kill", "target": "agent", "step": step, "rank": rank,
                                   "agent_pid": agent, "unix_ms": now_ms()})
            os.kill(agent, signal.SIGKILL)

        loss_sum = train_step(ddp, model, opt, data, args, step, rank, world)

        if rank == 0:
            if args.checkpoint_every > 0 and step % args.checkpoint_every == 0:
                save_checkpoint(args.ckpt_dir, step, model, opt)
            append_json(args.log, {"event": "step", "step": step, "unix_ms": now_ms(),
                                   "restart": restart, "loss": round(loss_sum, 5),
                                   "pid": os.getpid()})

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
