"""listops-padded: ListOps with 1 to ``max_args`` arguments, so sequences have different lengths
and every batch is padded (``<PAD>`` after the closing ``)``); the answer is predicted at ``)``.

The task pads (``pads = True``), so its splits carry an attention mask and the trainer passes it:
attention never looks at a pad and BatchNorm leaves pads out of its statistics. The lab uses it
to compare LayerNorm and BatchNorm on padded variable-length batches.
"""

from __future__ import annotations

import random

import torch

from blocklab.tasks.base import IGNORE_INDEX, Task, TaskData, check_int
from blocklab.tasks.listops import OPS, VOCAB
from blocklab.tasks.vocab import Tokenizer

Expression = tuple[str, tuple[int, ...]]


def tokens_of(expr: Expression) -> list[str]:
    """``("Max", (1, 6))`` -> ``Max ( 1 , 6 )``."""
    op, args = expr
    inner = " , ".join(str(a) for a in args).split()
    return [op, "(", *inner, ")"]


class PaddedListOpsTask(Task):
    """``n_test`` distinct held-out expressions; ``n_train`` training expressions drawn from the rest
    (with replacement). Arity uniform in 1..max_args; length 2 * arity + 2, padded to the longest."""

    name = "listops-padded"
    causal = False
    pads = True

    def __init__(self, max_args: int = 4, n_train: int = 4000, n_test: int = 400, seed: int = 0) -> None:
        super().__init__(seed, max_args=max_args, n_train=n_train, n_test=n_test)
        self.max_args = check_int(self.name, "max_args", max_args, 2, 8)
        self.n_train = check_int(self.name, "n_train", n_train, 1)
        self.n_test = check_int(self.name, "n_test", n_test, 1, 1000)
        self.tokenizer = Tokenizer(VOCAB)
        self.seq_len = 2 * self.max_args + 2

    def _sample(self, rng: random.Random) -> Expression:
        arity = rng.randint(1, self.max_args)
        return rng.choice(list(OPS)), tuple(rng.randrange(10) for _ in range(arity))

    def _data(self, exprs: list[Expression]) -> TaskData:
        pad = self.tokenizer.pad_id
        inputs = torch.full((len(exprs), self.seq_len), pad, dtype=torch.long)
        targets = torch.full_like(inputs, IGNORE_INDEX)
        for row, expr in enumerate(exprs):
            ids = self.tokenizer.encode(" ".join(tokens_of(expr)))
            inputs[row, : len(ids)] = torch.tensor(ids)
            targets[row, len(ids) - 1] = self.tokenizer.token_to_id[str(OPS[expr[0]](list(expr[1])))]
        return TaskData(inputs, targets)

    def example_count(self) -> int:
        """n_train + n_test."""
        return self.n_train + self.n_test

    def make_splits(self) -> tuple[TaskData, TaskData]:
        """Held-out expressions first (distinct), then training ones that avoid them."""
        rng = random.Random(self.seed)
        test: dict[Expression, None] = {}
        while len(test) < self.n_test:
            test[self._sample(rng)] = None
        train = []
        while len(train) < self.n_train:
            expr = self._sample(rng)
            if expr not in test:
                train.append(expr)
        return self._data(train), self._data(list(test))

    def encode_query(self, text: str) -> tuple[list[int], list[int]]:
        """Input like "Max ( 1 , 6 )" -> (its ids, unpadded, [position of ")"]).

        Unpadded: the model was trained with pads masked out, so a lone sequence needs none.
        """
        tokens = self.tokenizer.split(text)
        args = tokens[2:-1:2]
        ok = (
            len(tokens) >= 4
            and tokens[0] in OPS
            and tokens[1] == "("
            and tokens[-1] == ")"
            and 1 <= len(args) <= self.max_args
            and all(a.isdecimal() and len(a) == 1 for a in args)
            and tokens == tokens_of((tokens[0], tuple(int(a) for a in args)))
        )
        if not ok:
            raise ValueError(
                f'listops-padded input is "OP ( a , b , ... )" with 1 to {self.max_args} digits; got {text!r}'
            )
        ids = self.tokenizer.encode(" ".join(tokens))
        return ids, [len(ids) - 1]
