"""What every toy task provides: a tokenizer, seeded train/test splits, query encoding."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from blocklab.nn.memory import check_data_memory
from blocklab.nn.model import IGNORE_INDEX  # the loss ignores these targets; tasks mark unscored ones
from blocklab.tasks.vocab import Tokenizer

SPLITS = ("train", "test")
# What building the splits costs, per example and per token (data_bytes): the tasks build Python
# tuples or lists of token ids first (a container, its slot, a set entry: ~120-170 bytes an example
# measured, 8 a token), then int64 tensors (inputs, targets, mask, index temporaries: ~30 a token
# measured). The constants round the measured peaks up by about 1.5x.
EXAMPLE_BYTES = 200
TOKEN_BYTES = 48


@dataclass(frozen=True)
class TaskData:
    """One split: token ids and aligned targets (IGNORE_INDEX where not scored); for a task that
    pads, the attention mask (1 at real tokens, 0 at padding; None: nothing is padding)."""

    inputs: Tensor  # (N, T) long
    targets: Tensor  # (N, T) long
    attention_mask: Tensor | None = None  # (N, T) long

    def __post_init__(self) -> None:
        for field in ("inputs", "targets", "attention_mask"):
            value = getattr(self, field)
            if field == "attention_mask" and value is None:
                continue
            if not isinstance(value, Tensor) or value.dim() != 2 or value.dtype != torch.long:
                raise ValueError(f"TaskData.{field} must be a 2-D LongTensor (N, T)")
            if value.shape != self.inputs.shape:
                raise ValueError(
                    f"TaskData.inputs {tuple(self.inputs.shape)} and {field} "
                    f"{tuple(value.shape)} must have the same shape"
                )

    def __len__(self) -> int:
        return self.inputs.shape[0]


# How a task's held-out accuracy counts (``Task.metric``) and its name in the console and the report.
ACCURACY_METRICS = {
    "exact_match": "exact match",  # an example counts when the argmax is right at every scored token
    "token_accuracy": "token accuracy",  # each scored token counts on its own (language modelling)
}


def exact_match(logits: Tensor, targets: Tensor) -> Tensor:
    """(N, T, V) logits, (N, T) targets -> (N,) bool: argmax right at every scored position."""
    if logits.dim() != 3 or targets.shape != logits.shape[:2]:
        raise ValueError(
            f"exact_match needs logits (N, T, V) and targets (N, T); "
            f"got {tuple(logits.shape)} and {tuple(targets.shape)}"
        )
    hit = logits.argmax(dim=-1) == targets  # (N, T)
    return (hit | (targets == IGNORE_INDEX)).all(dim=1)  # (N,); no scored position -> True


def check_int(task: str, option: str, value: object, low: int, high: int | None = None) -> int:
    """Return `value` if it is an int in [low, high], else a ValueError naming the option."""
    in_range = isinstance(value, int) and value >= low and (high is None or value <= high)
    if isinstance(value, bool) or not in_range:
        allowed = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
        raise ValueError(f"{task} option {option}={value!r} must be {allowed}")
    return value


def check_fraction(task: str, option: str, value: object) -> float:
    """Return `value` if it is a number strictly between 0 and 1, else a ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        allowed = "a number strictly between 0 and 1"
        raise ValueError(f"{task} option {option}={value!r} must be {allowed}")
    return float(value)


def held_out_count(total: int, fraction: float) -> int:
    """How many of `total` items go to the held-out split: at least 1, leaving at least 1."""
    return min(max(1, round(total * fraction)), total - 1)


def generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with `seed`, so splits do not touch the global RNG."""
    return torch.Generator().manual_seed(seed)


class Task(ABC):
    """A built-in toy task. Subclasses set `name` and `causal` (and `pads` if their inputs hold
    padding), call `super().__init__` with their validated options, set `tokenizer` and
    `seq_len`, and implement `make_splits` and `encode_query`."""

    name: ClassVar[str]
    causal: ClassVar[bool]  # whether the model must use causal attention
    # whether inputs hold padding (the tokenizer's pad id): then a split with pads carries the
    # attention mask, and training and evaluation pass it to the model
    pads: ClassVar[bool] = False
    # what "accuracy" means for the task (ACCURACY_METRICS): a task that scores every token of a text is
    # judged per token; a whole window right at once is a far stricter (and uninformative) number
    metric: ClassVar[str] = "exact_match"
    tokenizer: Tokenizer
    seq_len: int

    def __init__(self, seed: int, **options: object) -> None:
        self.seed = check_int(self.name, "seed", seed, 0, 2**64 - 1)  # torch generators take 64 bits
        self.options = {**options, "seed": seed}  # constructor kwargs, for to_dict
        self._splits: dict[str, TaskData] | None = None

    @abstractmethod
    def make_splits(self) -> tuple[TaskData, TaskData]:
        """Generate (train, test) from `self.seed`; called once, then cached."""

    @abstractmethod
    def encode_query(self, text: str) -> tuple[list[int], list[int]]:
        """User input -> (input ids, positions whose argmax is the answer); ValueError if bad."""

    @property
    def char_level(self) -> bool:
        """Whether one token is one character (then a language model's loss is also bits per character)."""
        return getattr(self.tokenizer, "level", None) == "char"

    def example_count(self) -> int | None:
        """How many examples the two splits hold together (None: unknown, nothing is estimated)."""
        return None

    def data_bytes(self) -> int | None:
        """Estimated peak bytes while ``make_splits`` runs (module docstring): an upper bound that
        ``tests/tasks/test_tasks.py`` checks against the measured peak of each task."""
        count = self.example_count()
        return None if count is None else count * (EXAMPLE_BYTES + self.seq_len * TOKEN_BYTES)

    def split(self, name: str) -> TaskData:
        """The "train" or "test" split; deterministic from the seed. Do not modify in place.

        The memory guard runs first: InsufficientMemoryError when the data cannot fit."""
        if name not in SPLITS:
            raise ValueError(f"unknown split {name!r}; expected one of: {', '.join(SPLITS)}")
        if self._splits is None:
            needed = self.data_bytes()
            if needed is not None:
                options = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
                check_data_memory(needed, f"task {self.name} ({options})", "ask for fewer or shorter "
                                  "examples")
            splits = [self._with_mask(data) for data in self.make_splits()]
            self._splits = dict(zip(SPLITS, splits, strict=True))
        return self._splits[name]

    def _with_mask(self, data: TaskData) -> TaskData:
        """``data`` with its attention mask if this task pads and the split holds a pad."""
        padding = data.inputs == self.tokenizer.pad_id  # (N, T)
        if not self.pads or not bool(padding.any()):
            return data  # nothing to mask: no mask, so unpadded tasks run exactly as before
        return TaskData(data.inputs, data.targets, (~padding).long())

    def config_overrides(self) -> dict:
        """The ModelConfig fields this task dictates."""
        return {
            "vocab_size": self.tokenizer.vocab_size,
            "max_seq_len": self.seq_len,
            "causal": self.causal,
        }

    def decode_answer(self, pred_ids: list[int]) -> str:
        """Predicted ids at the answer positions -> answer text."""
        return self.tokenizer.decode(pred_ids)

    def example_texts(self, n: int) -> list[str]:
        """The first `n` held-out inputs as text (padding dropped), valid for `encode_query`."""
        rows = self.split("test").inputs[: max(n, 0)].tolist()
        pad = self.tokenizer.pad_id
        return [self.tokenizer.decode([i for i in row if i != pad]) for row in rows]

    def to_dict(self) -> dict:
        """The task name and its options (JSON-serialisable, for a run's config.json)."""
        return {"name": self.name, **self.options}

    def __repr__(self) -> str:
        options = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"{type(self).__name__}({options})"
