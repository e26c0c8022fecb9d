"""A small character-level GPT, built from torch.nn alone, trained on a text
embedded in this file.

    /usr/bin/python3 examples/python/gpt.py                   # alone, world 1
    build/cli/troupe run --world 2 -- /usr/bin/python3 examples/python/gpt.py

`--fail-at-step N` raises inside step N's micro-batch loop, so that tests can
watch a worker die mid-step and the job recover.
"""

import argparse
import json
import math
import time

import torch
from torch import nn
from torch.nn import functional as F

import troupe

TEXT = """\
The lighthouse keeper kept two logs. In the first he wrote the weather: the
wind, the height of the swell, the hour the fog came in from the banks and the
hour it lifted. In the second he wrote what the weather had cost him: a pane of
glass, a night without sleep, a gull that broke its neck against the lamp.

Every spring the supply boat brought oil, flour, a sack of letters and a new
ledger. The keeper read the letters slowly and answered them all in one
evening, by the light he was paid to keep burning. He never wrote about the
storms. He wrote about the garden he had dug in the lee of the tower, where
nothing grew taller than his hand, and about the seals that slept on the rocks
at low tide and barked at the boat when it left.

When the light was automated, an engineer came to take the logs away. She read
the first one standing up and the second one sitting on the stairs, and she
stayed until the tide turned. On the last page of the second log there was one
line: the lamp turns by itself now, and so, it seems, do I.

A machine that learns from text is a little like that keeper. It does not know
what fog is. It knows that the word comes after the banks and before it lifted,
that a storm is something that breaks glass, that a letter is answered in the
evening. Give it enough evenings and it will write you a plausible night at the
lighthouse, with the wind in the right place and the seals on the right rocks.
"""


class Characters(torch.utils.data.Dataset):
    """Map-style: window i is characters [i, i + context) as input and the
    same window shifted by one as target."""

    def __init__(self, text, context):
        self.vocab = sorted(set(text))
        index = {c: k for k, c in enumerate(self.vocab)}
        self.data = torch.tensor([index[c] for c in text], dtype=torch.long)
        self.context = context

    def __len__(self):
        return len(self.data) - self.context

    def __getitem__(self, i):
        window = self.data[i:i + self.context + 1]
        return window[:-1], window[1:]


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model, heads, context, dropout):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)
        # Not persistent: it is derived from the context length, so it has no
        # place in a checkpoint.
        mask = torch.ones(context, context, dtype=torch.bool).tril()
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        scores = scores.masked_fill(~self.mask[:t, :t], float("-inf"))
        weights = self.dropout(scores.softmax(dim=-1))
        out = (weights @ v).transpose(1, 2).reshape(b, t, d)
        return self.proj(out)


class Block(nn.Module):
    def __init__(self, d_model, heads, context, dropout):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, heads, context, dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(),
                                 nn.Linear(4 * d_model, d_model), nn.Dropout(dropout))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, d_model, heads, layers, context, dropout, tie_head):
        super().__init__()
        self.tokens = nn.Embedding(vocab, d_model)
        self.positions = nn.Embedding(context, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.Sequential(*[Block(d_model, heads, context, dropout)
                                      for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        if tie_head:
            self.head.weight = self.tokens.weight

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tokens(idx) + self.positions(torch.arange(t))
        return self.head(self.ln_f(self.blocks(self.drop(x))))


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--context", type=int, default=32)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--tie-head", action="store_true",
                        help="share the output head's weight with the token embedding")
    parser.add_argument("--out", metavar="PATH",
                        help="torch.save the final state_dict here (rank zero)")
    parser.add_argument("--log-losses", metavar="PATH",
                        help="append a JSON line per committed step (rank zero)")
    parser.add_argument("--speed-from", type=int, metavar="K",
                        help="print the samples/s of steps K+1.. to the last (rank zero), as "
                             "a JSON line starting with 'speed:' (bench/python_frontend_bench.py)")
    parser.add_argument("--fail-at-step", type=int, metavar="N",
                        help="raise RuntimeError inside step N's micro-batch loop")
    parser.add_argument("--fail-rank", type=int, metavar="R",
                        help="with --fail-at-step: fail on rank R only (default: any)")
    parser.add_argument("--fail-once", action="store_true",
                        help="with --fail-at-step: not when step N is redone")
    return parser.parse_args()


_marks = {}


def speed_mark(number, start, job):
    if number == start:
        _marks["start"] = time.perf_counter()
    elif number == job.last_step and "start" in _marks:
        seconds = time.perf_counter() - _marks["start"]
        samples = (number - start) * job.batch
        print("speed: " + json.dumps({"samples_per_s": samples / seconds,
                                      "steps": number - start, "seconds": seconds}),
              flush=True)


def should_fail(args, step):
    if args.fail_at_step != step.number:
        return False
    if args.fail_rank is not None and args.fail_rank != step.rank:
        return False
    return not (args.fail_once and step.redo)


def main():
    args = parse_args()
    job = troupe.init(steps=args.steps, batch=args.batch,
                      micro_batch=args.micro_batch, seed=args.seed)

    data = Characters(TEXT, args.context)
    model = GPT(len(data.vocab), args.d_model, args.heads, args.layers, args.context,
                args.dropout, args.tie_head)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=job.steps)

    log = open(args.log_losses, "a") if args.log_losses else None
    trainer = troupe.Trainer(job, model, optimizer, data, extras={"schedule": schedule})
    with trainer:
        for step in trainer.steps():
            for mb in step.micro_batches():
                if should_fail(args, step):
                    raise RuntimeError(f"injected failure at step {step.number}")
                x, y = mb.batch()
                logits = model(x)
                loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))
                # Every sample has the same number of tokens, so the weights
                # troupe gives by samples are right; count makes the logged
                # loss a mean per token.
                step.backward(loss, count=y.numel())
            if not step.commit():
                continue
            optimizer.step()
            schedule.step()
            if step.rank != 0:
                continue
            if args.speed_from is not None:
                speed_mark(step.number, args.speed_from, job)
            if log:
                log.write(json.dumps({"step": step.number, "loss": step.local_loss,
                                      "job_loss": step.loss, "world": step.world}) + "\n")
                log.flush()
            if step.number % 50 == 0 or step.number == job.steps:
                print(f"step {step.number} loss {step.loss:.4f} world {step.world}",
                      flush=True)
    if log:
        log.close()

    if job.rank_zero and args.out:
        torch.save(model.state_dict(), args.out)


if __name__ == "__main__":
    main()
