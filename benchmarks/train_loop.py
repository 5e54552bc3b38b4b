"""Training tokens/s of ``blocklab.training.loop`` against a plain PyTorch loop doing the same work.

Both train the default model (listops-seed on listops, batch 128) for the same number of steps
with AdamW and gradient clipping at 1.0; the trainer also computes its per-layer gradient norms
every 10 steps and evaluates the held-out split once. One process, one thread, interleaved
rounds (the order rotating), medians: the ratio is what to read on a shared machine.

    .venv/bin/python benchmarks/train_loop.py [--steps 100] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics

import torch

import blocklab as bl
from blocklab.bench.stats import median_ratio, time_rounds
from blocklab.tasks import get_task
from blocklab.training.loop import TrainConfig, train


def plain_loop(config: bl.ModelConfig, data: object, steps: int, batch: int) -> None:
    """The textbook loop: shuffled batches, forward, backward, clip, AdamW step."""
    torch.manual_seed(0)
    model = bl.Transformer(config)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3, betas=(0.9, 0.98), weight_decay=0.01)
    order = torch.randperm(len(data.inputs))
    for step in range(steps):
        idx = order[(step * batch) % (len(order) - batch) :][:batch]
        _, loss = model(data.inputs[idx], data.targets[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss.item()  # the trainer reads every loss too


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    task = get_task("listops")
    config = bl.preset("listops-seed", **task.config_overrides())
    c = TrainConfig(steps=args.steps, eval_every=args.steps, target_accuracy=None, checkpoint_every=0)
    runs = {
        "blocklab.training.loop": lambda: train(config, c, task, report=False),
        "plain PyTorch loop": lambda: plain_loop(config, task.split("train"), args.steps, c.batch_size),
    }
    times = time_rounds(runs, args.rounds, min_seconds=0.0)
    tokens = args.steps * c.batch_size * task.seq_len
    print(
        f"listops-seed on listops, batch {c.batch_size}, {args.steps} steps per run, 1 thread; "
        f"median of {args.rounds} rounds"
    )
    for name, t in times.items():
        print(f"  {name:20s} {statistics.median(tokens / s for s in t):9,.0f} tokens/s")
    ratio = median_ratio(times["blocklab.training.loop"], times["plain PyTorch loop"])
    print(f"  blocklab.training.loop time / plain loop time: {ratio:.3f}x (median over rounds)")


if __name__ == "__main__":
    main()
