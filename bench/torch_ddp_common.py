"""What bench/torch_ddp.py and bench/torch_elastic.py share: the model and its optimizer under
DDP, the sampling of a step's batch and one data-parallel training step.
Both peers must train exactly as troupe does, so this is the one place that says how."""
import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from torch_gpt import GPT, adamw, learning_rate


def batch_offsets(seed, step, batch, limit):
    """The global batch of window offsets for one step; the same for every rank and every run."""
    rng = np.random.default_rng(seed * 1_000_003 + step)
    return rng.integers(0, limit, size=batch)


def build(args):
    """The model (seeded: the same on every rank), AdamW as troupe configures it, and DDP."""
    torch.manual_seed(args.seed)
    model = GPT(args.layers, args.heads, args.d_model, args.context)
    return model, adamw(model, args.lr)


def wrap(model):
    """DDP over the model. gloo cannot broadcast the bool causal-mask buffer ("Invalid scalar
    type"); it is a constant, identical on every rank, so DDP is told to leave it alone."""
    DDP._set_params_and_buffers_to_ignore_for_model(model, ["mask"])
    return DDP(model, broadcast_buffers=False)


def train_step(ddp, model, opt, data, args, step, rank, world, after_backward=None):
    """One step of rank `rank`: its contiguous share of the step's batch in micro-batches, one
    all-reduce (no_sync on the others), clipping and AdamW. Returns this rank's share of the
    loss; `after_backward` is called once the last backward (and its all-reduce) returned."""
    T = args.context
    share = args.batch // world
    for g in opt.param_groups:
        g["lr"] = learning_rate(step - 1, args.steps, args.lr, args.warmup, 0.1)
    opt.zero_grad(set_to_none=True)
    mine = batch_offsets(args.seed, step, args.batch, len(data) - T - 1)[
        rank * share:(rank + 1) * share]
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
            if after_backward:
                after_backward()
        loss_sum += loss.item() * weight
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss_sum
