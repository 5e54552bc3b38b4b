"""listops: `OP ( a , b , c )` -> the answer digit, predicted at the closing `)`."""

from __future__ import annotations

from itertools import product

import torch

from blocklab.tasks.base import (
    IGNORE_INDEX,
    Task,
    TaskData,
    check_fraction,
    generator,
    held_out_count,
)
from blocklab.tasks.vocab import Tokenizer

OPS = {"Max": max, "Min": min, "First": lambda xs: xs[0], "Last": lambda xs: xs[-1]}
DIGITS = [str(d) for d in range(10)]
VOCAB = ["<PAD>", *DIGITS, *OPS, "(", ")", ","]
SEQ_LEN = 8
ANSWER_POSITION = SEQ_LEN - 1  # the ")": the model has seen the whole expression
FORMAT = 'listops input is 8 space-separated tokens "OP ( a , b , c )", OP in ' + (
    f'{"/".join(OPS)}, a, b, c digits 0-9, e.g. "Max ( 1 , 6 , 2 )"'
)


def expression(op: str, args: tuple[int, int, int]) -> list[str]:
    """The 8 tokens of `op` applied to three digits."""
    a, b, c = (str(x) for x in args)
    return [op, "(", a, ",", b, ",", c, ")"]


class ListOpsTask(Task):
    """All 4 * 10^3 = 4000 distinct expressions; a seeded permutation sends
    `test_fraction` of them to the held-out split and the rest to train."""

    name = "listops"
    causal = False

    def __init__(self, test_fraction: float = 0.1, seed: int = 0) -> None:
        super().__init__(seed, test_fraction=test_fraction)
        self.test_fraction = check_fraction(self.name, "test_fraction", test_fraction)
        self.tokenizer = Tokenizer(VOCAB)
        self.seq_len = SEQ_LEN

    def example_count(self) -> int:
        """Every expression: 4 operators x 10**3 argument triples."""
        return len(OPS) * 10**3

    def make_splits(self) -> tuple[TaskData, TaskData]:
        """Enumerate every expression, then split by a seeded permutation."""
        ids, answers = [], []
        for op, args in product(OPS, product(range(10), repeat=3)):
            ids.append(self.tokenizer.encode(" ".join(expression(op, args))))
            answers.append(self.tokenizer.token_to_id[str(OPS[op](args))])
        inputs = torch.tensor(ids)  # (4000, 8)
        targets = torch.full_like(inputs, IGNORE_INDEX)
        targets[:, ANSWER_POSITION] = torch.tensor(answers)
        order = torch.randperm(len(inputs), generator=generator(self.seed))
        n_test = held_out_count(len(inputs), self.test_fraction)
        test, train = order[:n_test], order[n_test:]
        return TaskData(inputs[train], targets[train]), TaskData(inputs[test], targets[test])

    def encode_query(self, text: str) -> tuple[list[int], list[int]]:
        """Input like "Max ( 1 , 6 , 2 )" -> (8 ids, [7]); ValueError describing the format."""
        tokens = self.tokenizer.split(text)
        ok = (
            len(tokens) == SEQ_LEN
            and tokens[0] in OPS
            and all(tokens[i] in DIGITS for i in (2, 4, 6))
            and tokens == expression(tokens[0], (tokens[2], tokens[4], tokens[6]))
        )
        if not ok:
            raise ValueError(f"{FORMAT}; got {text!r}{self.tokenizer.unknown_note(text)}")
        return self.tokenizer.encode(text), [ANSWER_POSITION]
