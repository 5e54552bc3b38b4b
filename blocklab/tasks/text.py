"""text: character-level language modelling on a text file the user gives."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import torch
from torch import Tensor

from blocklab.tasks.base import (
    IGNORE_INDEX,
    Task,
    TaskData,
    check_fraction,
    check_int,
    generator,
    held_out_count,
)
from blocklab.tasks.tokenizer import Tokenizer


def read_text(path: str | Path | None) -> str:
    """The file's UTF-8 text; ValueError if the path is missing, unreadable or empty."""
    if path is None or str(path) == "":
        raise ValueError("text option path is required: the text file to model")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"text option path={str(path)!r}: no such file") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"text option path={str(path)!r}: not UTF-8 text ({e.reason})") from None
    except OSError as e:
        raise ValueError(f"text option path={str(path)!r}: cannot read ({e.strerror})") from None
    if not text:
        raise ValueError(f"text option path={str(path)!r}: the file is empty")
    return text


class TextTask(Task):
    """Next-character prediction. The first (1 - test_fraction) of the file gives the train
    windows (`n_train` seeded random starts, overlapping; default: as many as cover it once),
    the rest the held-out windows (stride seq_len, the last one padded); no window crosses
    the boundary, so the splits share no character."""

    name = "text"
    causal = True
    pads = True  # the last held-out window

    def __init__(
        self,
        path: str | None = None,
        seq_len: int = 64,
        test_fraction: float = 0.1,
        n_train: int | None = None,
        seed: int = 0,
    ) -> None:
        path = None if path is None else str(path)
        super().__init__(seed, path=path, seq_len=seq_len, test_fraction=test_fraction, n_train=n_train)
        self.seq_len = check_int(self.name, "seq_len", seq_len, 1)
        self.test_fraction = check_fraction(self.name, "test_fraction", test_fraction)
        self.n_train = None if n_train is None else check_int(self.name, "n_train", n_train, 1)
        self.text = read_text(path)
        self.tokenizer = Tokenizer(["<PAD>", *sorted(set(self.text))], level="char")
        if not self.fits(len(self.text)):
            need = next(n for n in itertools.count(seq_len + 3) if self.fits(n))
            raise ValueError(
                f"text file {path!r} has {len(self.text)} characters; seq_len={seq_len} "
                f"with test_fraction={test_fraction} needs at least {need} (lower seq_len)"
            )
        self.boundary = self.train_chars(len(self.text))

    def train_chars(self, total: int) -> int:
        """How many leading characters of a `total`-character file are for training."""
        return total - held_out_count(total, self.test_fraction)

    def fits(self, total: int) -> bool:
        """Whether the train part holds one full window and the held-out part two characters."""
        return self.train_chars(total) >= self.seq_len + 1 and total - self.train_chars(total) >= 2

    def make_splits(self) -> tuple[TaskData, TaskData]:
        """Random windows from the train part, strided windows over the held-out part."""
        ids = torch.tensor(self.tokenizer.encode(self.text))  # (L,)
        train_ids, test_ids = ids[: self.boundary], ids[self.boundary :]
        window = self.seq_len + 1  # inputs and their next-token targets
        n_train = self.n_train or math.ceil(len(train_ids) / self.seq_len)
        gen = generator(self.seed)
        starts = torch.randint(0, len(train_ids) - window + 1, (n_train,), generator=gen)
        chunks = train_ids[starts[:, None] + torch.arange(window)]  # (n_train, T + 1)
        train = TaskData(chunks[:, :-1], chunks[:, 1:])
        return train, self.strided_windows(test_ids)

    def strided_windows(self, ids: Tensor) -> TaskData:
        """Non-overlapping windows over `ids`; the last one padded (targets IGNORE_INDEX)."""
        n = math.ceil((len(ids) - 1) / self.seq_len)
        inputs = torch.full((n, self.seq_len), self.tokenizer.pad_id)
        targets = torch.full((n, self.seq_len), IGNORE_INDEX)
        for row, start in enumerate(range(0, len(ids) - 1, self.seq_len)):
            chunk = ids[start : start + self.seq_len + 1]  # windows share one boundary token
            inputs[row, : len(chunk) - 1] = chunk[:-1]
            targets[row, : len(chunk) - 1] = chunk[1:]
        return TaskData(inputs, targets)

    def encode_query(self, text: str) -> tuple[list[int], list[int]]:
        """A prompt of 1..seq_len characters -> (ids, [last position]): predict the next one."""
        if len(text) > self.seq_len:
            raise ValueError(f"text input has {len(text)} characters; at most seq_len={self.seq_len} allowed")
        ids = self.tokenizer.encode(text)
        return ids, [len(ids) - 1]
