"""tiny-lm: memorise `<BOS> I like transformers <EOS>` by causal next-token prediction."""

from __future__ import annotations

import torch

from blocklab.tasks.base import Task, TaskData
from blocklab.tasks.vocab import Tokenizer

VOCAB = ["<PAD>", "<BOS>", "<EOS>", "I", "like", "transformers"]
SENTENCE = "<BOS> I like transformers <EOS>"


class TinyLMTask(Task):
    """One sentence, inputs `<BOS> I like transformers`, targets `I like transformers <EOS>`.

    This is a memorisation task: there is nothing to generalise to, so the held-out
    split is the training sentence itself (`split("test")` equals `split("train")`),
    and `seed` changes nothing. It exists to watch a tiny model learn, not to test it.
    """

    name = "tiny-lm"
    causal = True
    metric = "token_accuracy"

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed)
        self.tokenizer = Tokenizer(VOCAB, eos_token="<EOS>")
        self.seq_len = len(SENTENCE.split()) - 1  # 4: the last token is only a target

    def example_count(self) -> int:
        """The sentence, once per split."""
        return 2

    def make_splits(self) -> tuple[TaskData, TaskData]:
        """The sentence shifted by one; test is deliberately the same sentence."""
        ids = torch.tensor([self.tokenizer.encode(SENTENCE)])  # (1, 5)
        data = TaskData(ids[:, :-1], ids[:, 1:])  # (1, 4) each
        return data, data

    def encode_query(self, text: str) -> tuple[list[int], list[int]]:
        """A prefix like "<BOS> I" -> (ids, [last position]): predict the next word."""
        ids = self.tokenizer.encode(text)
        bos, pad = self.tokenizer.token_to_id["<BOS>"], self.tokenizer.pad_id
        if ids[0] != bos or pad in ids or len(ids) > self.seq_len:
            raise ValueError(
                f"tiny-lm input starts with <BOS>, has no <PAD> and at most {self.seq_len} "
                f"tokens, e.g. '<BOS> I like'; got {text!r}"
            )
        return ids, [len(ids) - 1]

    def example_texts(self, n: int) -> list[str]:
        """Every prefix of the held-out sentence, shortest first (there is only one sentence)."""
        words = SENTENCE.split()[: self.seq_len]
        return [" ".join(words[:k]) for k in range(1, len(words) + 1)][: max(n, 0)]
