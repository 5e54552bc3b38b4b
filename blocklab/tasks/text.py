"""text: character-level language modelling on a text file: the user's (option ``path``), or by default
the one shipped with blocklab, the opening of Shakespeare's *Coriolanus* (50 KB, public domain;
``tasks/data/SOURCES.md`` says where it comes from).

The whole corpus is held in memory and cut into windows, about 32 bytes a character plus 32 a
token of each training window while the splits are built; so a file larger than ``max_mb``
(default 32 MB) is refused before it is read: raise the cap with ``--task-option max_mb=N``.
Only regular files are read (not a device such as /dev/zero, a pipe or a folder).
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import torch
from torch import Tensor

from blocklab.files.reading import read_regular_bytes
from blocklab.tasks.base import (
    IGNORE_INDEX,
    Task,
    TaskData,
    check_fraction,
    check_int,
    generator,
    held_out_count,
)
from blocklab.tasks.vocab import Tokenizer

DEFAULT_CORPUS = Path(__file__).parent / "data" / "coriolanus.txt"
DEFAULT_MAX_MB = 32
# Measured per unit: 16 in this project's long-lived venv, 26 in a fresh one (CI's clean checkout: the
# same code, a higher peak), so the estimate allows 32 (tests/tasks/test_tasks.py bounds it both ways).
CHAR_BYTES = 32  # the text, its ids as a list and a tensor, the held-out windows
WINDOW_TOKEN_BYTES = 32  # a training window's index and token tensors


def read_text(path: str | Path | None, max_mb: int = DEFAULT_MAX_MB) -> str:
    """The file's UTF-8 text (None: the shipped corpus); ValueError if the path is missing, not a regular
    file (a folder, a device, a pipe: refused without reading or waiting), larger than ``max_mb``
    megabytes, unreadable or empty. Never reads more than the cap (``files.reading``, the one reader)."""
    if path is None:
        path = DEFAULT_CORPUS
    if str(path) == "":
        raise ValueError("text option path is empty: give the text file to model (or leave it out for "
                         "the shipped corpus)")
    where = f"text option path={str(path)!r}"
    limit = max_mb * 1024 * 1024
    try:
        what = f"the text task's corpus: a text file of at most max_mb={max_mb} MB, --task-option max_mb=N"
        data = read_regular_bytes(path, what, limit)
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise ValueError(f"{where}: no such file") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{where}: not UTF-8 text ({e.reason})") from None
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    except OSError as e:
        raise ValueError(f"{where}: cannot read ({e.strerror})") from None
    if not text:
        raise ValueError(f"{where}: the file is empty")
    return text


class TextTask(Task):
    """Next-character prediction. The first (1 - test_fraction) of the file gives the train
    windows (`n_train` seeded random starts, overlapping; default: as many as cover it once),
    the rest the held-out windows (stride seq_len, the last one padded); no window crosses
    the boundary, so the splits share no character."""

    name = "text"
    causal = True
    metric = "token_accuracy"
    pads = True  # the last held-out window

    def __init__(
        self,
        path: str | None = None,
        seq_len: int = 64,
        test_fraction: float = 0.1,
        n_train: int | None = None,
        seed: int = 0,
        max_mb: int = DEFAULT_MAX_MB,
    ) -> None:
        path = None if path is None else str(path)
        # max_mb is recorded only when raised, so run folders written before it existed still resume
        raised = {} if max_mb == DEFAULT_MAX_MB else {"max_mb": max_mb}
        super().__init__(
            seed, path=path, seq_len=seq_len, test_fraction=test_fraction, n_train=n_train, **raised
        )
        self.seq_len = check_int(self.name, "seq_len", seq_len, 1)
        self.test_fraction = check_fraction(self.name, "test_fraction", test_fraction)
        self.n_train = None if n_train is None else check_int(self.name, "n_train", n_train, 1)
        self.max_mb = check_int(self.name, "max_mb", max_mb, 1)
        self.text = read_text(path, self.max_mb)
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

    def train_windows(self) -> int:
        """n_train, or by default as many windows as cover the train part once."""
        return self.n_train or math.ceil(self.boundary / self.seq_len)

    def data_bytes(self) -> int:
        """The corpus and its ids (per character) and the training windows (per token): module docstring."""
        return len(self.text) * CHAR_BYTES + self.train_windows() * (self.seq_len + 1) * WINDOW_TOKEN_BYTES

    def make_splits(self) -> tuple[TaskData, TaskData]:
        """Random windows from the train part, strided windows over the held-out part."""
        ids = torch.tensor(self.tokenizer.encode(self.text))  # (L,)
        train_ids, test_ids = ids[: self.boundary], ids[self.boundary :]
        window = self.seq_len + 1  # inputs and their next-token targets
        n_train = self.train_windows()
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
