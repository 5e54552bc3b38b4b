"""Held-out evaluation: loss, exact match, token accuracy, perplexity and bits per character of a model on a
task's split, and those numbers in words.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..device import model_device
from ..tasks import ACCURACY_METRICS, IGNORE_INDEX, TaskData, exact_match


@torch.no_grad()
def evaluate(model: nn.Module, data: TaskData, batch_size: int = 1024, metric: str = "exact_match",
             char_level: bool = False) -> dict[str, float]:
    """Held-out ``loss`` (mean cross-entropy over scored tokens, nats), ``exact_match`` (the fraction of
    examples right at every scored token), ``token_accuracy`` (the fraction of scored tokens right),
    ``perplexity`` (exp(loss)), with ``char_level`` ``bits_per_char`` (loss / ln 2: one token is one
    character), and ``accuracy``: the one of the two the task judges by (``metric``, ACCURACY_METRICS).

    A split that carries an attention mask (a task that pads) is evaluated with it. Each batch moves
    to the model's device; the forward runs in the caller's precision (inside ``Compute.autocast()``
    for mixed precision).
    """
    if metric not in ACCURACY_METRICS:
        raise ValueError(f"metric={metric!r} is not one of: {', '.join(ACCURACY_METRICS)}")
    was_training = model.training
    model.eval()
    device = model_device(model)
    loss_sum, scored, correct, tokens_right = 0.0, 0, 0, 0
    try:
        for start in range(0, len(data), batch_size):
            rows = slice(start, start + batch_size)
            x, y = data.inputs[rows].to(device), data.targets[rows].to(device)
            mask = data.attention_mask
            logits = model(x) if mask is None else model(x, attention_mask=mask[rows].to(device))
            n = int((y != IGNORE_INDEX).sum())
            if n:
                flat = torch.nn.functional.cross_entropy(
                    logits.flatten(0, 1).float(), y.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
                )
                loss_sum += float(flat)
                scored += n
            correct += int(exact_match(logits, y).sum())
            tokens_right += int(((logits.argmax(-1) == y) & (y != IGNORE_INDEX)).sum())
    finally:
        model.train(was_training)
    loss = loss_sum / max(scored, 1)
    numbers = {"loss": loss, "exact_match": correct / max(len(data), 1),
               "token_accuracy": tokens_right / max(scored, 1),
               "perplexity": math.exp(loss) if loss < 700 else math.inf}  # exp overflows a float past ~709
    if char_level:
        numbers["bits_per_char"] = loss / math.log(2)
    return {**numbers, "accuracy": numbers[metric]}


def describe_eval(numbers: dict[str, float], metric: str) -> str:
    """``evaluate``'s numbers in words, the task's metric first: ``token accuracy 93.10% (loss 0.2134,
    perplexity 1.24, 0.308 bits per character)`` or ``exact match 99.75% (loss 0.0123)``."""
    more = [f"loss {numbers['loss']:.4f}"]
    if metric == "token_accuracy":
        more.append(f"perplexity {numbers['perplexity']:.4g}")
    if "bits_per_char" in numbers:
        more.append(f"{numbers['bits_per_char']:.4g} bits per character")
    return f"{ACCURACY_METRICS[metric]} {numbers['accuracy']:.2%} ({', '.join(more)})"
