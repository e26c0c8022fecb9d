#!/usr/bin/python3
"""The PyTorch side of bench/sample_bench.py: greedy generation with a KV cache from the model
`troupe ckpt export --format torch` wrote, loaded into examples/python/gpt2.py's GPT2 module.

The loop is HuggingFace's model.generate with past_key_values, written out over the module's
own layers: the prompt goes through every block once, keeping each block's keys and values;
then each new token is one position per block, its query against the cached keys and values,
and the next token is the argmax of the last logits. One thread (torch.set_num_threads(1)),
no autograd. Prints one JSON line: the tokens/s of each repeat (prompt pass included, loading
excluded, as `troupe sample --verbose` times it) and the generated ids.

    /usr/bin/python3 bench/python/sample_peer.py model.pt --prompt "And God said" --tokens 200
"""

import argparse
import json
import math
import os
import sys
import time

import torch
from torch.nn import functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "examples", "python"))
import gpt2  # noqa: E402  examples/python/gpt2.py


def attend(block, x, past):
    """Block `block` on new positions x [1, n, C], with `past` = (k, v) [1, H, L, hs] or None.
    Returns (x after the block, (k, v) with the new positions appended)."""
    attn = block.attn
    _, n, C = x.shape
    H = attn.n_head
    hs = C // H
    q, k, v = attn.c_attn(block.ln_1(x)).split(C, dim=2)
    q, k, v = (t.view(1, n, H, hs).transpose(1, 2) for t in (q, k, v))
    if past is not None:
        k = torch.cat((past[0], k), dim=2)
        v = torch.cat((past[1], v), dim=2)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
    if n > 1:  # the prompt: causal within it (one new position sees the whole cache)
        L = k.shape[2]
        att = att.masked_fill(attn.mask[L - n:L, :L], float("-inf"))
    y = att.softmax(dim=-1) @ v
    x = x + attn.c_proj(y.transpose(1, 2).reshape(1, n, C))
    x = x + block.mlp(block.ln_2(x))
    return x, (k, v)


@torch.no_grad()
def forward_with_past(model, ids, past, position):
    """Logits [V] after the last of `ids` at positions position.., and the new cache."""
    t = model.transformer
    idx = torch.tensor([ids], dtype=torch.long)
    x = t.wte(idx) + t.wpe(torch.arange(position, position + len(ids)))
    new_past = []
    for i, block in enumerate(t.h):
        x, kv = attend(block, x, past[i] if past else None)
        new_past.append(kv)
    return model.lm_head(t.ln_f(x[:, -1]))[0], new_past


@torch.no_grad()
def generate(model, prompt, tokens):
    """Greedy ids after `prompt`; the whole sequence must fit the context."""
    if len(prompt) + tokens > model.context:
        raise SystemExit(f"prompt {len(prompt)} + tokens {tokens} exceed the context "
                         f"{model.context}: this loop does not crop")
    logits, past = forward_with_past(model, prompt, None, 0)
    out = []
    for i in range(tokens):
        nxt = int(logits.argmax())
        out.append(nxt)
        if i + 1 == tokens:
            break
        logits, past = forward_with_past(model, [nxt], past, len(prompt) + i)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="the file `troupe ckpt export --format torch` wrote")
    ap.add_argument("--prompt", required=True, help="byte-level prompt")
    ap.add_argument("--tokens", type=int, required=True)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model, _ = gpt2.load(args.model)
    prompt = list(args.prompt.encode())
    generate(model, prompt, min(args.tokens, 4))  # warm-up: first-call allocations
    rates, ids = [], None
    for _ in range(args.repeats):
        start = time.perf_counter()
        ids = generate(model, prompt, args.tokens)
        rates.append(args.tokens / (time.perf_counter() - start))
    print(json.dumps({"tokens_per_s": rates, "ids": ids, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
