"""How far the trainer's AdamW (fused, issue 17) moves a run from the one-tensor-at-a-time AdamW it replaced.

The default model (listops-seed on listops) starts from one set of weights and takes the same batches
with the trainer's parameter groups (``make_optimizer``: decay on matrices and embeddings), the default
lr held constant and gradient clipping at 1.0, once per AdamW implementation:

- ``for-loop``: ``foreach=False, fused=False``, the update one parameter at a time (what blocklab used
  before; PyTorch's default for CPU tensors);
- ``foreach``: one multi-tensor update per group (the trainer's fallback where no fused kernel exists);
- ``fused``: one kernel for every parameter (the trainer's default).

It prints, after 1, 10 and ``--steps`` steps, the largest difference of any weight from the for-loop run
(absolute, and in units of float32's spacing at 1, 2^-23) and the training loss of each. The first step
differs in the last bits; later steps carry those bits through a chaotic training run, so what to read
is that the loss curves agree while the weights part by rounding.

    .venv/bin/python benchmarks/optimizer_bits.py [--steps 100]
"""

from __future__ import annotations

import argparse

import torch

import blocklab as bl
from blocklab.tasks import get_task
from blocklab.training.loop import TrainConfig, make_optimizer

IMPLEMENTATIONS: dict[str, dict[str, bool]] = {
    "for-loop": {"foreach": False, "fused": False},
    "foreach": {"foreach": True},
    "fused": {"fused": True},
}
ULP_AT_1 = 2.0**-23  # float32's spacing at 1.0


def run(kind: str, steps: int, checkpoints: set[int]) -> dict[int, tuple[float, list[torch.Tensor]]]:
    """Train ``steps`` steps with AdamW ``kind``; at each checkpoint step, the loss and the weights."""
    torch.manual_seed(0)
    task = get_task("listops")
    model = bl.Transformer(bl.preset("listops-seed", **task.config_overrides()))
    c = TrainConfig()
    trainers = make_optimizer(model, c).param_groups  # the trainer's groups: which weights decay
    groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in trainers]
    opt = torch.optim.AdamW(groups, lr=c.lr, betas=(c.beta1, c.beta2), **IMPLEMENTATIONS[kind])
    data = task.split("train")
    order = torch.randperm(len(data.inputs), generator=torch.Generator().manual_seed(0))
    seen: dict[int, tuple[float, list[torch.Tensor]]] = {}
    for step in range(1, steps + 1):
        idx = order[((step - 1) * c.batch_size) % (len(order) - c.batch_size) :][: c.batch_size]
        _, loss = model(data.inputs[idx], data.targets[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), c.grad_clip)
        opt.step()
        if step in checkpoints:
            seen[step] = (loss.item(), [p.detach().clone() for p in model.parameters()])
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    torch.set_num_threads(1)  # one thread: the reductions' order is the implementations' own
    checkpoints = sorted({1, min(10, args.steps), args.steps})
    runs = {kind: run(kind, args.steps, set(checkpoints)) for kind in IMPLEMENTATIONS}
    print(f"listops-seed on listops, batch {TrainConfig().batch_size}, lr {TrainConfig().lr} constant, "
          "clip 1.0, one thread")
    print("loss: the batch loss at that step (before its update); max |dw|: the weights after the step "
          "against the for-loop AdamW's")
    print(f"  {'step':>5}  {'AdamW':9}  {'loss':>9}  {'max |dw|':>9}  {'in 2^-23':>9}")
    for step in checkpoints:
        base = runs["for-loop"][step][1]
        for kind, seen in runs.items():
            loss, weights = seen[step]
            diff = max((w - b).abs().max().item() for w, b in zip(weights, base, strict=True))
            print(f"  {step:5d}  {kind:9}  {loss:9.6f}  {diff:9.2e}  {diff / ULP_AT_1:9.1f}")


if __name__ == "__main__":
    main()
