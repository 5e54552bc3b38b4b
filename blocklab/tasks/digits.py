"""copy, reverse, sort: a digit string in, the transformed string out, position by position."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from blocklab.tasks.base import Task, TaskData, check_int, generator
from blocklab.tasks.vocab import Tokenizer

VOCAB = ["<PAD>", *(str(d) for d in range(10))]
MAX_LENGTH = 256

# digits (N, L) -> output digits (N, L); target at position i is output digit i
OUTPUTS: dict[str, Callable[[Tensor], Tensor]] = {
    "copy": lambda d: d,
    "reverse": lambda d: d.flip(1),
    "sort": lambda d: d.sort(dim=1).values,
}

Key = tuple[int, ...]


def sample_strings(
    gen: torch.Generator, length: int, count: int, exclude: set[Key], distinct: bool
) -> list[Key]:
    """`count` random digit strings not in `exclude` (pairwise distinct if `distinct`)."""
    kept: list[Key] = []
    seen: set[Key] = set()
    while len(kept) < count:
        batch = torch.randint(0, 10, (max(count - len(kept), 64), length), generator=gen)
        for key in map(tuple, batch.tolist()):
            if key in exclude or (distinct and key in seen):
                continue  # resample: held-out strings never appear in train
            seen.add(key)
            kept.append(key)
            if len(kept) == count:
                break
    return kept


class DigitTask(Task):
    """Encoder-style digit transduction: input `3 1 4 1`, targets the output digits aligned
    with the inputs (copy `3 1 4 1`, reverse `1 4 1 3`, sort `1 1 3 4`), every position scored.

    The `n_test` held-out strings are distinct and never appear among the `n_train`
    training strings (sampled with replacement from the rest)."""

    causal = False

    def __init__(self, length: int = 8, n_train: int = 20000, n_test: int = 1000, seed: int = 0) -> None:
        super().__init__(seed, length=length, n_train=n_train, n_test=n_test)
        self.length = check_int(self.name, "length", length, 1, MAX_LENGTH)
        self.n_train = check_int(self.name, "n_train", n_train, 1)
        # at most half of all strings held out, so rejection sampling stays fast
        max_test = 10**length // 2 if length < 10 else None
        self.n_test = check_int(self.name, "n_test", n_test, 1, max_test)
        self.tokenizer = Tokenizer(VOCAB)
        self.seq_len = length

    def example_count(self) -> int:
        """n_train + n_test."""
        return self.n_train + self.n_test

    def make_splits(self) -> tuple[TaskData, TaskData]:
        """Sample held-out strings first, then training strings that avoid them."""
        gen = generator(self.seed)
        test = sample_strings(gen, self.length, self.n_test, set(), distinct=True)
        train = sample_strings(gen, self.length, self.n_train, set(test), distinct=False)
        return self.task_data(train), self.task_data(test)

    def task_data(self, strings: list[Key]) -> TaskData:
        """Digit strings -> (input ids, target ids), both (N, L)."""
        digits = torch.tensor(strings)  # (N, L)
        digit_ids = torch.tensor([self.tokenizer.token_to_id[d] for d in VOCAB[1:]])  # (10,)
        return TaskData(digit_ids[digits], digit_ids[OUTPUTS[self.name](digits)])

    def encode_query(self, text: str) -> tuple[list[int], list[int]]:
        """Input like "3 1 4 1" or "3141" -> (ids, every position); ValueError if malformed."""
        tokens = self.tokenizer.split(text)
        if len(tokens) == 1 and tokens[0].isdecimal():
            tokens = list(tokens[0])  # accept the digits written without spaces
        if len(tokens) != self.length or not all(t in VOCAB[1:] for t in tokens):
            raise ValueError(
                f"{self.name} input is {self.length} digits 0-9 separated by spaces, e.g. "
                f"{' '.join(str(i % 10) for i in range(self.length))!r}; got {text!r}"
                f"{self.tokenizer.unknown_note(' '.join(tokens))}"
            )
        return self.tokenizer.encode(" ".join(tokens)), list(range(self.length))


class CopyTask(DigitTask):
    """Output the input digits unchanged."""

    name = "copy"


class ReverseTask(DigitTask):
    """Output the input digits in reverse order."""

    name = "reverse"


class SortTask(DigitTask):
    """Output the input digits sorted ascending."""

    name = "sort"
