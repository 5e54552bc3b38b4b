"""Word- and character-level tokenizer over a fixed vocabulary (blocklab.nn.tokens's TextTokenizer)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from torch import Tensor

from blocklab.nn.tokens import BatchEncoding, id_list, pad_batch

LEVELS = ("word", "char")
MAX_LISTED = 40  # vocabulary entries shown in an error message before truncating


class Tokenizer:
    """Maps text to ids over a fixed vocabulary; word level splits on whitespace,
    char level maps each character. The pad token (and the end-of-sequence token, when there is
    one) is an ordinary vocabulary entry; nothing is added around the text.

    `token_to_id` (dict str -> int) and `id_to_token` (dict int -> str) are the lookups.
    """

    def __init__(
        self, vocab: Sequence[str], pad_token: str = "<PAD>", level: str = "word",
        eos_token: str | None = None,
    ) -> None:
        if level not in LEVELS:
            raise ValueError(f"Tokenizer.level={level!r} must be one of: {', '.join(LEVELS)}")
        vocab = list(vocab)
        if not vocab:
            raise ValueError("Tokenizer.vocab is empty; it needs at least the pad token")
        for token in vocab:
            if not isinstance(token, str) or not token:
                raise ValueError(f"Tokenizer.vocab entry {token!r} must be a non-empty string")
            if level == "word" and any(c.isspace() for c in token):
                raise ValueError(f"word-level token {token!r} must not contain whitespace")
            if level == "char" and token != pad_token and len(token) != 1:
                raise ValueError(f"char-level token {token!r} must be a single character")
        duplicates = sorted(t for t, count in Counter(vocab).items() if count > 1)
        if duplicates:
            raise ValueError(f"Tokenizer.vocab has duplicate tokens: {duplicates}")
        if pad_token not in vocab:
            raise ValueError(f"Tokenizer.pad_token={pad_token!r} is not in the vocabulary")
        if eos_token is not None and eos_token not in vocab:
            raise ValueError(f"Tokenizer.eos_token={eos_token!r} is not in the vocabulary")
        self.vocab: list[str] = vocab
        self.pad_token = pad_token
        self.eos_token = eos_token
        self.level = level
        self.token_to_id: dict[str, int] = {t: i for i, t in enumerate(vocab)}
        self.id_to_token: dict[int, str] = dict(enumerate(vocab))

    @property
    def vocab_size(self) -> int:
        """Number of tokens, padding included."""
        return len(self.vocab)

    @property
    def pad_id(self) -> int:
        """Id of the pad token."""
        return self.token_to_id[self.pad_token]

    @property
    def eos_id(self) -> int | None:
        """Id of the end-of-sequence token, or None when the vocabulary has none."""
        return None if self.eos_token is None else self.token_to_id[self.eos_token]

    def split(self, text: str) -> list[str]:
        """Text -> tokens (whitespace split or characters), without checking the vocabulary."""
        pieces = text.split() if self.level == "word" else list(text)
        if not pieces:
            raise ValueError(f"empty input {text!r}: nothing to tokenize")
        return pieces

    def encode(self, text: str) -> list[int]:
        """Text -> token ids; an unknown token is a ValueError naming it and the vocabulary."""
        ids = []
        for position, token in enumerate(self.split(text)):
            if token not in self.token_to_id:
                raise ValueError(f"unknown token {token!r} at position {position}; {self.describe_vocab()}")
            ids.append(self.token_to_id[token])
        return ids

    def encode_batch(self, texts: Sequence[str], padding: str = "right") -> BatchEncoding:
        """Texts -> (ids (B, T), attention_mask (B, T)), padded with the pad id on ``padding``'s side."""
        return pad_batch([self.encode(t) for t in texts], self.pad_id, padding)

    def unknown_note(self, text: str) -> str:
        """For error messages: ``"; unknown token 'x' at position 2; vocabulary (...)"``, or ``""``."""
        try:
            self.encode(text)
        except ValueError as error:
            return f"; {error}" if str(error).startswith("unknown token") else ""
        return ""

    def tokens(self, ids: Sequence[int] | Tensor) -> list[str]:
        """Token ids -> token strings, one per id (for labelling rows)."""
        return [self.id_to_token[i] for i in id_list(ids, self.vocab_size)]

    def str_tokens(self, ids: Sequence[int] | Tensor) -> list[str]:
        """Each id as the text it decodes to: here the vocabulary entry itself (``tokens``)."""
        return self.tokens(ids)

    def decode(self, ids: Sequence[int] | Tensor, skip_special_tokens: bool = False) -> str:
        """Token ids -> text (tokens joined by spaces at word level, concatenated at char level). Every
        token is a word of the tasks' text (``<PAD>`` and ``<EOS>`` included: nothing is added around a
        text), so none is special in ``transformers``' sense and ``skip_special_tokens`` leaves out none."""
        return (" " if self.level == "word" else "").join(self.tokens(ids))

    def describe_vocab(self) -> str:
        """The vocabulary as shown in error messages, truncated when large."""
        shown = [repr(t) if self.level == "char" else t for t in self.vocab[:MAX_LISTED]]
        more = self.vocab_size - len(shown)
        tail = f" ... and {more} more" if more else ""
        return f"vocabulary ({self.vocab_size} tokens): {' '.join(shown)}{tail}"

    def to_dict(self) -> dict:
        """JSON-serialisable form (stored in checkpoints); ``eos_token`` only when there is one."""
        d = {"vocab": list(self.vocab), "pad_token": self.pad_token, "level": self.level}
        return d | ({"eos_token": self.eos_token} if self.eos_token is not None else {})

    @classmethod
    def from_dict(cls, d: dict) -> Tokenizer:
        """Inverse of `to_dict`."""
        unknown = set(d) - {"vocab", "pad_token", "level", "eos_token"}
        if "vocab" not in d or unknown:
            keys = sorted(d)
            raise ValueError(f"tokenizer dict needs 'vocab' (+ pad_token, level, eos_token); got keys {keys}")
        return cls(d["vocab"], d.get("pad_token", "<PAD>"), d.get("level", "word"), d.get("eos_token"))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tokenizer) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, level={self.level!r})"
