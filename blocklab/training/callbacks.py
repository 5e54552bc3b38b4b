"""What a training step shows beyond its loss: the callback interface (``StepContext``, ``Callback``: a
function called on rank 0 every step whose dict joins that step's metrics line) and the per-layer gradient
norms logged at log steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..nn.model import Transformer
from ..tasks import Task
from .train_config import TrainConfig

# ---- per-layer gradient norms, recorded at log steps ----------------------------------------------


def layer_groups(model: Transformer) -> dict[str, list[nn.Parameter]]:
    """Parameters by layer: ``embed`` (embeddings, positions), ``blocks.{i}``, ``head`` (ln_f, head)."""
    groups: dict[str, list[nn.Parameter]] = {}
    for name, p in model.named_parameters():
        parts = name.split(".")
        key = (
            ".".join(parts[:2])
            if parts[0] == "blocks"
            else ("head" if parts[0] in ("ln_f", "head") else "embed")
        )
        groups.setdefault(key, []).append(p)
    return groups


def layer_grad_norms(model: Transformer) -> dict[str, float]:
    """L2 norm of each layer's gradient (before clipping): ``grad_norm/blocks.0`` ..."""
    norms = {}
    for key, params in layer_groups(model).items():
        grads = [p.grad.detach().float().norm() for p in params if p.grad is not None]
        if grads:
            norms[f"grad_norm/{key}"] = float(torch.stack(grads).norm())
    return norms


# ---- callbacks -------------------------------------------------------------------------------------


@dataclass
class StepContext:
    """What a callback sees, after backward and before clipping and the optimizer step.

    ``model.parameters()`` carry this step's gradients in ``.grad`` (averaged over processes
    under DDP). A callback may run its own forward passes (the trainer restores the RNG state
    and train/eval mode afterwards) but must not change parameters or ``.grad``: use
    ``torch.autograd.grad`` for extra gradients, never ``.backward()``.
    """

    step: int  # the update about to be applied, 1-based
    model: Transformer  # the plain model (not the DDP wrapper)
    inputs: Tensor  # this process's batch (b, T)
    targets: Tensor  # (b, T), -100 where not scored
    loss: float  # the global batch's loss
    lr: float
    config: TrainConfig
    task: Task
    logged: bool  # whether this step writes a metrics line anyway (step % log_every == 0)
    attention_mask: Tensor | None = None  # (b, T), 0 at padding, for a task that pads


Callback = Callable[[StepContext], "dict[str, Any] | None"]
"""Called on rank 0 every step; a returned dict is merged into that step's metrics.jsonl line."""
