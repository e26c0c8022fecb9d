"""A GPT-2 in plain torch.nn with HuggingFace GPT-2's parameter names, for the models that
`troupe ckpt export` writes from troupe's built-in GPT.

    build/cli/troupe ckpt export runs/latest --format safetensors model.safetensors
    /usr/bin/python3 examples/python/gpt2.py model.safetensors --prompt "And God said" --tokens 80
    /usr/bin/python3 examples/python/gpt2.py model.pt --loss build/data/kjv.txt --offsets 0 4096

The module is GPT2LMHeadModel's architecture, which is troupe's: pre-LayerNorm blocks (eps
1e-5), causal self-attention with q, k and v fused in c_attn, an MLP of width 4C with the
tanh GELU ("gelu_new"), biases on every projection, and an output head tied to the token
embedding. Its projections are GPT-2's Conv1D: the weight is [in, out] and y = x W + b, the
orientation the export writes, so `load_state_dict(strict=True)` takes the file as it is (and
so does transformers' GPT2LMHeadModel, for those who have it).

Either file format loads: safetensors, read here with the standard library (no safetensors
package needed), or the torch one (torch.load). The vocabulary, width, context and depth
come from the tensors' shapes, the number of heads from the file's metadata (--heads when a
file has none).

As a script it prints the mean loss (nats per token) of windows of context + 1 bytes at
--offsets of a byte file, or samples --tokens bytes greedily after --prompt.
"""

import argparse
import json
import math
import struct
import sys
from collections import OrderedDict

import torch
from torch import nn
from torch.nn import functional as F


class Conv1D(nn.Module):
    """GPT-2's projection: weight [in, out], y = x W + b."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(
            *x.shape[:-1], self.weight.shape[1])


class Attention(nn.Module):
    def __init__(self, d_model, n_head, context):
        super().__init__()
        self.n_head = n_head
        self.c_attn = Conv1D(d_model, 3 * d_model)  # q | k | v, head h in columns h*hs.. of each
        self.c_proj = Conv1D(d_model, d_model)
        mask = torch.ones(context, context, dtype=torch.bool).triu(diagonal=1)
        self.register_buffer("mask", mask, persistent=False)  # not a parameter of the file

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(self.mask[:T, :T], float("-inf")).softmax(dim=-1)
        return self.c_proj((att @ v).transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        self.c_fc = Conv1D(d_model, 4 * d_model)
        self.c_proj = Conv1D(4 * d_model, d_model)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, d_model, n_head, context):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model, eps=1e-5)
        self.attn = Attention(d_model, n_head, context)
        self.ln_2 = nn.LayerNorm(d_model, eps=1e-5)
        self.mlp = MLP(d_model)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    """GPT2LMHeadModel's parameters, under its names: transformer.{wte, wpe, h.i.*, ln_f} and
    lm_head.weight, which is transformer.wte.weight (tied)."""

    def __init__(self, vocab, d_model, n_head, n_layer, context):
        super().__init__()
        if d_model % n_head:
            raise ValueError(f"n_head {n_head} does not divide d_model {d_model}")
        self.context = context
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, d_model),
            wpe=nn.Embedding(context, d_model),
            h=nn.ModuleList(Block(d_model, n_head, context) for _ in range(n_layer)),
            ln_f=nn.LayerNorm(d_model, eps=1e-5)))
        self.lm_head = nn.Linear(d_model, vocab, bias=False)
        self.lm_head.weight = self.transformer.wte.weight

    def forward(self, idx):
        """Logits [B, T, V] of token ids idx [B, T], T <= context."""
        t = self.transformer
        x = t.wte(idx) + t.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in t.h:
            x = block(x)
        return self.lm_head(t.ln_f(x))


def batch_loss(model, inputs, targets):
    """Mean cross-entropy (nats per token) of next-token targets [B, T] given inputs [B, T]."""
    logits = model(inputs)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# ---- reading an exported file ----------------------------------------------------------------

def read_safetensors(path):
    """(OrderedDict name -> float32 tensor, metadata dict) of a safetensors file of F32 tensors."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    metadata = header.pop("__metadata__", {})
    data = memoryview(blob)[8 + n:]
    tensors = OrderedDict()
    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        if info["dtype"] != "F32":
            raise ValueError(f"{path}: {name} is {info['dtype']}, this reader takes F32 only")
        begin, end = info["data_offsets"]
        flat = torch.frombuffer(bytearray(data[begin:end]), dtype=torch.float32)
        tensors[name] = flat.reshape(info["shape"])
    return tensors, metadata


def read_state(path):
    """(state dict, metadata) of an exported file of either format."""
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic == b"PK\x03\x04":  # a zip: the file torch.save writes
        state = torch.load(path, map_location="cpu")
        return state, dict(getattr(state, "troupe_metadata", {}))
    return read_safetensors(path)


def load(path, n_head=None):
    """(GPT2 with the file's parameters, in eval mode, metadata)."""
    state, metadata = read_state(path)
    vocab, d_model = state["transformer.wte.weight"].shape
    context = state["transformer.wpe.weight"].shape[0]
    n_layer = sum(1 for k in state if k.startswith("transformer.h.") and k.endswith(".ln_1.weight"))
    n_head = n_head or int(metadata.get("n_head", 0))
    if not n_head:
        raise SystemExit(f"{path} does not say how many heads the model has: give --heads")
    model = GPT2(vocab, d_model, n_head, n_layer, context)
    model.load_state_dict(state, strict=True)
    return model.eval(), metadata


@torch.no_grad()
def generate(model, ids, tokens):
    """`ids` followed by `tokens` greedily chosen ids (the last context ids are the input)."""
    ids = list(ids)
    for _ in range(tokens):
        window = torch.tensor([ids[-model.context:]], dtype=torch.long)
        ids.append(int(model(window)[0, -1].argmax()))
    return ids


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="a file `troupe ckpt export` wrote (safetensors or torch)")
    ap.add_argument("--heads", type=int, default=None, help="heads, when the file does not say")
    ap.add_argument("--loss", metavar="FILE", help="a byte file (a text) to take windows from")
    ap.add_argument("--offsets", type=int, nargs="+", default=[0],
                    help="where the windows of context + 1 bytes start in --loss's file")
    ap.add_argument("--prompt", default=None, help="text to continue greedily")
    ap.add_argument("--tokens", type=int, default=64, help="bytes to sample after --prompt")
    args = ap.parse_args()

    torch.set_num_threads(1)
    model, metadata = load(args.model, args.heads)
    T = model.context
    print(f"{args.model}: step {metadata.get('troupe_step', '?')}, "
          f"{sum(p.numel() for p in model.parameters())} parameters, context {T}")
    if args.loss:
        with open(args.loss, "rb") as f:
            data = f.read()
        windows = []
        for o in args.offsets:
            if not 0 <= o <= len(data) - T - 1:
                raise SystemExit(f"offset {o}: a window of {T + 1} bytes does not fit in {args.loss}")
            windows.append(list(data[o:o + T + 1]))
        batch = torch.tensor(windows, dtype=torch.long)
        with torch.no_grad():
            loss = batch_loss(model, batch[:, :-1], batch[:, 1:])
        print(f"loss {loss.item():.6f} nats per token over {len(windows)} windows of {T}")
    if args.prompt is not None:
        if model.transformer.wte.weight.shape[0] != 256:
            raise SystemExit("--prompt samples bytes: the model's vocabulary is not 256")
        ids = generate(model, args.prompt.encode() or b"\n", args.tokens)
        sys.stdout.write(bytes(ids).decode("utf-8", errors="replace") + "\n")


if __name__ == "__main__":
    main()
