"""A regression MLP that fits a noisy sine curve, written as plain PyTorch.

    /usr/bin/python3 examples/python/mlp.py                   # alone, world 1
    build/cli/troupe run --world 2 -- /usr/bin/python3 examples/python/mlp.py

Both train the same model: troupe fixes which samples form each global batch
and seeds torch before every micro-batch, so the world size changes only the
order in which gradients are summed.
"""

import argparse
import json
import math

import torch
from torch import nn

import troupe


def noise(i):
    """A value in [-1, 1) that depends on the index alone (an integer hash),
    so every rank and every rerun sees the same dataset without drawing from
    any generator."""
    h = (i * 2654435761) & 0xFFFFFFFF
    h ^= h >> 16
    h = (h * 0x45D9F3B) & 0xFFFFFFFF
    h ^= h >> 16
    return h / 2**31 - 1.0


class NoisyCurve(torch.utils.data.Dataset):
    """Map-style: sample i is x on a grid over [-3, 3] and sin(x) plus noise."""

    def __init__(self, n, noise_scale=0.1):
        self.x = torch.linspace(-3.0, 3.0, n).unsqueeze(1)
        jitter = torch.tensor([noise(i) for i in range(n)], dtype=torch.float32)
        self.y = torch.sin(self.x) + noise_scale * jitter.unsqueeze(1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--samples", type=int, default=10_000,
                        help="the dataset's length")
    parser.add_argument("--out", metavar="PATH",
                        help="torch.save the final state_dict here (rank zero)")
    parser.add_argument("--log-losses", metavar="PATH",
                        help="append a JSON line per committed step (rank zero)")
    return parser.parse_args()


def main():
    args = parse_args()
    # Under troupe the job's settings win over these (the coordinator planned
    # the batches with them); alone they are the settings.
    job = troupe.init(steps=args.steps, batch=args.batch,
                      micro_batch=args.micro_batch, seed=args.seed)

    # Built after init, which seeded torch: every rank starts from the same
    # parameters.
    model = nn.Sequential(nn.Linear(1, 64), nn.Tanh(), nn.Dropout(0.1),
                          nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=job.steps)
    loss_fn = nn.MSELoss()
    data = NoisyCurve(args.samples)

    log = open(args.log_losses, "a") if args.log_losses else None
    trainer = troupe.Trainer(job, model, optimizer, data, extras={"schedule": schedule})
    with trainer:
        for step in trainer.steps():
            for mb in step.micro_batches():
                x, y = mb.batch()
                step.backward(loss_fn(model(x), y))
            if not step.commit():
                continue  # aborted: steps() hands this number out again
            optimizer.step()
            schedule.step()
            if step.rank != 0:
                continue
            if log:
                log.write(json.dumps({"step": step.number, "loss": step.local_loss,
                                      "job_loss": step.loss, "world": step.world}) + "\n")
                # A worker may be killed at any moment; keep what was logged.
                log.flush()
            if step.number % 50 == 0 or step.number == job.steps:
                print(f"step {step.number} loss {step.loss:.5f} world {step.world}",
                      flush=True)
    if log:
        log.close()

    if job.rank_zero and args.out:
        torch.save(model.state_dict(), args.out)
    if job.rank_zero:
        with torch.no_grad():
            model.eval()
            x = torch.tensor([[-math.pi / 2], [0.0], [math.pi / 2]])
            fit = ", ".join(f"{v:.3f}" for v in model(x).squeeze(1).tolist())
        print(f"fit at -pi/2, 0, pi/2: {fit} (sin: -1, 0, 1)", flush=True)


if __name__ == "__main__":
    main()
