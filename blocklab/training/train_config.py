"""TrainConfig: how a run trains (optimizer, schedule, evaluation, bookkeeping), validated, with
per-task defaults, and the learning-rate schedule it implies.

The field names are the ``blocklab train`` flags (``--batch-size`` / ``--batch_size``) and the
``train`` part of a run's ``config.json``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from ..device import DEVICE_CHOICES, DTYPE_CHOICES, is_device_name
from ..errors import names


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation and bookkeeping of a run; validated (ValueError names field, value, rule).

    The defaults train the listops-seed preset on listops to >= 99% held-out exact match.
    """

    steps: int = 1000  # total optimizer steps; the cosine decays over all of them
    batch_size: int = 128  # global batch: split across processes under torchrun
    lr: float = 5e-3  # peak learning rate, reached after warmup
    warmup: int = 50  # linear warmup steps, from lr/warmup to lr
    min_lr_ratio: float = 0.1  # the cosine ends at lr * min_lr_ratio
    weight_decay: float = 0.01  # AdamW decay on matrices and embeddings (not biases, not norms)
    beta1: float = 0.9
    beta2: float = 0.98
    grad_clip: float = 1.0  # max global gradient norm; 0 turns clipping off
    eval_every: int = 25  # held-out loss and exact match every K steps (and at the end)
    eval_batch_size: int = 1024
    log_every: int = 10  # a metrics.jsonl line (loss, lr, gradient norms, LN statistics)
    checkpoint_every: int = 200  # 0: only the final checkpoint
    keep_checkpoints: int = 2  # newest complete checkpoints kept on disk
    device: str = "auto"  # cpu, cuda (cuda:N), mps, or auto: cuda if present, else mps, else cpu
    dtype: str = "float32"  # the matmuls' dtype: bfloat16 / float16 run them under autocast (weights float32)
    seed: int = 0  # model init, data order, dropout
    target_accuracy: float | None = 0.995  # stop at the first evaluation reaching it; None: never
    threads: int = 0  # torch intra-op threads; 0 = auto (resources.resolve_threads: affinity, quota, OMP)

    def __post_init__(self) -> None:
        for error in _violations(self):
            raise ValueError(error)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field."""
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with some fields changed (validated again)."""
        return train_config_from_dict({**self.to_dict(), **changes})


TRAIN_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(TrainConfig))

FLOAT32_MAX = 3.4028234663852886e38
MAX_THREADS = 1024


def _violations(c: TrainConfig) -> list[str]:
    def is_int(v: object) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    def is_num(v: object) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    # AdamW's first update scales a unit step by lr / (1 - beta1) (its bias correction), as a float32
    # scalar: beyond float32's largest number torch fails instead of diverging
    beta1 = c.beta1 if is_num(c.beta1) and 0 <= c.beta1 < 1 else 0.0
    first_step = c.lr / (1 - beta1**1) if is_num(c.lr) else 0.0
    rules = [
        *[
            (name, is_int(getattr(c, name)) and getattr(c, name) >= 1, "an integer >= 1")
            for name in (
                "steps",
                "batch_size",
                "eval_every",
                "eval_batch_size",
                "log_every",
                "keep_checkpoints",
            )
        ],
        *[
            (name, is_int(getattr(c, name)) and getattr(c, name) >= 0, "an integer >= 0")
            for name in ("warmup", "checkpoint_every", "seed", "threads")
        ],
        ("lr", is_num(c.lr) and c.lr > 0, "a number > 0"),
        ("lr", first_step <= FLOAT32_MAX, f"<= {FLOAT32_MAX * (1 - beta1):.6g} (float32's largest number x "
         "(1 - beta1): AdamW's first step is lr / (1 - beta1), a float32 scalar)"),
        ("threads", not is_int(c.threads) or c.threads <= MAX_THREADS,
         f"at most {MAX_THREADS} (more threads than cores only slows training; the OpenMP runtime aborts "
         "when it cannot start them)"),
        ("seed", not is_int(c.seed) or c.seed < 2**64, "below 2**64 (torch seeds take 64 bits)"),
        ("device", is_device_name(c.device), f"one of: {', '.join(DEVICE_CHOICES)}, cuda:N"),
        ("dtype", c.dtype in DTYPE_CHOICES, f"one of: {', '.join(DTYPE_CHOICES)}"),
        ("min_lr_ratio", is_num(c.min_lr_ratio) and 0 <= c.min_lr_ratio <= 1, "a number in [0, 1]"),
        ("weight_decay", is_num(c.weight_decay) and c.weight_decay >= 0, "a number >= 0"),
        ("beta1", is_num(c.beta1) and 0 <= c.beta1 < 1, "a number in [0, 1)"),
        ("beta2", is_num(c.beta2) and 0 <= c.beta2 < 1, "a number in [0, 1)"),
        ("grad_clip", is_num(c.grad_clip) and c.grad_clip >= 0, "a number >= 0 (0: no clipping)"),
        (
            "target_accuracy",
            c.target_accuracy is None or (is_num(c.target_accuracy) and 0 < c.target_accuracy <= 1),
            "a number in (0, 1], or None for no early stop",
        ),
    ]
    errors = [f"TrainConfig.{name}={getattr(c, name)!r} must be {rule}" for name, ok, rule in rules if not ok]
    return errors


def train_config_from_dict(d: dict[str, Any]) -> TrainConfig:
    """Build a TrainConfig from a dict, rejecting unknown keys by name."""
    unknown = set(d) - set(TRAIN_FIELDS)
    if unknown:
        raise ValueError(
            f"TrainConfig has no field {names(unknown)}; fields are: {', '.join(TRAIN_FIELDS)}"
        )
    return TrainConfig(**d)


# Per-task departures from the TrainConfig defaults (which are tuned for listops). tiny-lm is
# memorisation: it trains all its steps, since exact match reaches 100% long before the loss is small.
TASK_DEFAULTS: dict[str, dict[str, Any]] = {
    "tiny-lm": {
        "steps": 400,
        "batch_size": 64,  # copies of its one sentence
        "warmup": 20,
        "eval_every": 50,
        "checkpoint_every": 100,
        "target_accuracy": None,
    },
}


def task_train_config(task_name: str, **overrides: Any) -> TrainConfig:
    """The TrainConfig for a task: TrainConfig's defaults, the task's (TASK_DEFAULTS), then ``overrides``."""
    return train_config_from_dict({**TASK_DEFAULTS.get(task_name, {}), **overrides})


def lr_at(step: int, c: TrainConfig) -> float:
    """Learning rate of update ``step`` (1-based): ``lr * step / warmup`` up to ``warmup``, then a
    cosine from ``lr`` (step warmup + 1) to ``lr * min_lr_ratio`` (the last step). This is PyTorch's
    LinearLR followed by CosineAnnealingLR(T_max = steps - warmup - 1) in a SequentialLR."""
    if step <= c.warmup:
        return c.lr * step / c.warmup
    progress = (step - c.warmup - 1) / max(1, c.steps - c.warmup - 1)
    return c.lr * (c.min_lr_ratio + (1 - c.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def schedule_warning(c: TrainConfig) -> str | None:
    """What is wrong with the schedule that is not an error (the run still trains), or None."""
    if c.warmup < c.steps:
        return None
    peak = "is reached only at the last step" if c.warmup == c.steps else "is never reached"
    return (f"TrainConfig.warmup={c.warmup} >= steps={c.steps}: the whole run is warmup, so the peak "
            f"learning rate lr={c.lr:g} {peak} and the cosine decay never runs; "
            "lower --warmup or raise --steps")
