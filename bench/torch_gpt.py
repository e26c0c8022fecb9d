#!/usr/bin/python3
"""The PyTorch side of the single-rank throughput comparison (bench/run_train_bench.sh).

The same byte-level GPT as runtime/model/gpt.hpp (pre-LayerNorm blocks, fused QKV with
bias, causal attention, tanh-GELU MLP of width 4C, head tied to the token embedding), the
same GPT-2 initialisation, the same step (global batch in micro-batches, clipping at 1.0,
AdamW with decay on 2-D tensors only, warm-up + cosine learning rate), on one thread.
Prints "tokens_per_s X" for the steps after --skip. Run with Debian's /usr/bin/python3
(python3-torch 1.13).
"""
import argparse
import math
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d_model, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln_2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.mlp_proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x, mask):
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.qkv(self.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(mask[:T, :T], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        return x + self.mlp_proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, d_model, context, vocab=256):
        super().__init__()
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(context, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.register_buffer(
            "mask", torch.triu(torch.ones(context, context, dtype=torch.bool), diagonal=1))
        residual_std = 0.02 / math.sqrt(2 * n_layer)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif "ln_" in name:
                nn.init.ones_(p)
            else:
                std = residual_std if name.endswith(("proj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for block in self.blocks:
            x = block(x, self.mask)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied head
        return F.cross_entropy(logits.view(B * T, -1), targets.reshape(B * T))


def learning_rate(step, total, lr, warmup, min_ratio):
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    floor = lr * min_ratio
    return floor + 0.5 * (lr - floor) * (1 + math.cos(math.pi * progress))


def add_model_args(ap, layers=4, heads=4, d_model=128, context=64, warmup=20):
    """The options of the model and its optimizer, as troupe's; defaults differ between the
    benchmarks."""
    ap.add_argument("--batch", type=int, default=16, help="global batch (windows per step)")
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--layers", type=int, default=layers)
    ap.add_argument("--heads", type=int, default=heads)
    ap.add_argument("--d-model", type=int, default=d_model)
    ap.add_argument("--context", type=int, default=context)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=warmup)
    ap.add_argument("--seed", type=int, default=1337)


def adamw(model, lr):
    """AdamW as troupe configures it: weight decay on matrices only."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95), eps=1e-8)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--skip", type=int, default=5, help="warm-up steps not timed")
    add_model_args(ap)
    ap.add_argument("--print-every", type=int, default=0)
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    data = np.fromfile(args.data, dtype=np.uint8)
    train = torch.from_numpy(data[: int(len(data) * 0.95)].astype(np.int64))
    T = args.context
    model = GPT(args.layers, args.heads, args.d_model, T)
    print(f"model: {sum(p.numel() for p in model.parameters())} parameters", flush=True)
    opt = adamw(model, args.lr)
    rng = np.random.default_rng(args.seed)
    micro_steps = args.batch // args.micro_batch
    start = None
    for step in range(args.steps):
        if step == args.skip:
            start = time.perf_counter()
            start_cpu = time.process_time()
        for g in opt.param_groups:
            g["lr"] = learning_rate(step, args.steps, args.lr, args.warmup, 0.1)
        opt.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for _ in range(micro_steps):
            offsets = rng.integers(0, len(train) - T - 1, size=args.micro_batch)
            window = torch.stack([train[o:o + T + 1] for o in offsets])
            loss = model(window[:, :-1], window[:, 1:])
            (loss / micro_steps).backward()
            loss_sum += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if args.print_every and (step + 1) % args.print_every == 0:
            print(f"step {step + 1:4d}  loss {loss_sum / micro_steps:.4f}", flush=True)
    timed = time.perf_counter() - start
    cpu = time.process_time() - start_cpu
    tokens = (args.steps - args.skip) * args.batch * T
    print(f"tokens_per_s {tokens / timed:.1f}  ({args.steps - args.skip} steps timed, "
          f"{timed / (args.steps - args.skip):.3f} s/step, {tokens / cpu:.0f} tokens per CPU s)")


if __name__ == "__main__":
    main()
