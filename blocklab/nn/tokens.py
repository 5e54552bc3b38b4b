"""What blocklab asks of a tokenizer, and a batch of texts as padded ids with an attention mask.

Two kinds satisfy ``TextTokenizer``: the tasks' vocabulary tokenizer (``blocklab.tasks.vocab``)
and a Hugging Face ``tokenizers`` tokenizer (``blocklab.weights.hf_tokenizer``: BERT WordPiece, GPT-2
byte-level BPE). A model knows its tokenizer through ``Transformer.tokenizer``, which the loaders set.

Padding (``encode_batch(texts, padding=...)``):

    "right"  ids then pads:  [a b c] [d e P]     encoders (BERT, MiniLM), training batches
    "left"   pads then ids:  [a b c] [P d e]     generation: every row's last real token sits in the
                                                  last column, so the next token is appended after it

The attention mask is 1 on real tokens and 0 on padding (the Hugging Face convention).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor

PADDING_SIDES = ("right", "left")


class BatchEncoding(NamedTuple):
    """Texts as one padded batch: ``ids, attention_mask = tokenizer.encode_batch(texts)``."""

    ids: Tensor  # (B, T) long
    attention_mask: Tensor  # (B, T) long, 1 = real token, 0 = padding


class TextTokenizer(Protocol):
    """The interface every blocklab tokenizer has (tasks' vocabulary tokenizer, Hugging Face's)."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def pad_id(self) -> int: ...

    @property
    def eos_id(self) -> int | None: ...

    # optional: ``bos_id`` (int | None), the beginning-of-sequence token's id (Hugging Face tokenizers), and
    # ``default_prepend_bos`` (bool, else True): TransformerLens' default for the model (False for GPT-NeoX)

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str], padding: str = "right") -> BatchEncoding: ...

    def decode(self, ids: Sequence[int] | Tensor, skip_special_tokens: bool = False) -> str: ...

    def tokens(self, ids: Sequence[int] | Tensor) -> list[str]: ...

    def str_tokens(self, ids: Sequence[int] | Tensor) -> list[str]: ...

    def to_dict(self) -> dict[str, Any]: ...


def bos_to_prepend(tokenizer: TextTokenizer) -> int | None:
    """The id TransformerLens' ``prepend_bos=True`` puts before each text for this tokenizer: its BOS
    token (GPT-2's ``<|endoftext|>``), or None when it has none or its encoding adds it already
    (Llama's ``<s>``). A vocabulary tokenizer declares no BOS (a task writes its own ``<BOS>``)."""
    bos = getattr(tokenizer, "bos_id", None)
    if bos is None:
        return None
    return None if tokenizer.encode("a")[:1] == [bos] else bos


# ``prepend_bos`` meaning "the tokenizer's own ids, as transformers gives them" (``tokenize``'s default)
AS_TOKENIZED = "as tokenized"
PrependBos = bool | None | str


def encode_texts(tokenizer: TextTokenizer, texts: str | Sequence[str], prepend_bos: PrependBos = None,
                 padding: str = "right") -> BatchEncoding:
    """Texts -> (ids (B, T), attention_mask (B, T)), padded on ``padding``'s side, each row as
    TransformerLens' ``to_tokens`` gives it: ``prepend_bos`` True puts the BOS token first (unless the
    tokenizer adds it itself), False leaves none (one the tokenizer adds is taken off: Llama's ``<s>``),
    None follows the tokenizer's ``default_prepend_bos`` (TransformerLens' default for the model: True,
    False for GPT-NeoX); ``AS_TOKENIZED``: the tokenizer's own ids."""
    check_padding(padding)
    texts = [texts] if isinstance(texts, str) else list(texts)
    bos_id = getattr(tokenizer, "bos_id", None)
    if prepend_bos is True and bos_id is None:
        raise ValueError("prepend_bos=True, but this tokenizer has no BOS token")
    if prepend_bos not in (True, False, None, AS_TOKENIZED):
        raise ValueError(f"prepend_bos={prepend_bos!r} must be True, False or None (the model's default)")
    batch = tokenizer.encode_batch(texts, padding)
    if prepend_bos == AS_TOKENIZED or bos_id is None:
        return batch
    rows = [row[mask.bool()].tolist() for row, mask in zip(batch.ids, batch.attention_mask, strict=True)]
    if prepends_bos(tokenizer, prepend_bos):
        rows = [[bos_id, *row] for row in rows]
    elif not _wants_bos(tokenizer, prepend_bos) and bos_to_prepend(tokenizer) is None:  # it adds its own
        rows = [row[1:] if row[:1] == [bos_id] else row for row in rows]
    else:
        return batch
    return pad_batch(rows, tokenizer.pad_id, padding)


def _wants_bos(tokenizer: TextTokenizer, prepend_bos: PrependBos) -> bool:
    return getattr(tokenizer, "default_prepend_bos", True) if prepend_bos is None else bool(prepend_bos)


def prepends_bos(tokenizer: TextTokenizer, prepend_bos: PrependBos) -> bool:
    """Whether ``encode_texts`` puts a BOS token before each text that the tokenizer itself does not."""
    return prepend_bos != AS_TOKENIZED and _wants_bos(tokenizer, prepend_bos) and \
        bos_to_prepend(tokenizer) is not None


def positions_from_mask(mask: Tensor) -> Tensor:
    """(B, T) attention mask -> (B, T) position ids counted from each row's first real token (pads: 0)."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def check_padding(padding: str) -> None:
    """ValueError unless ``padding`` is "right" or "left"."""
    if padding not in PADDING_SIDES:
        raise ValueError(f"padding={padding!r} must be one of: {', '.join(PADDING_SIDES)}")


def pad_batch(rows: Sequence[Sequence[int]], pad_id: int, padding: str = "right") -> BatchEncoding:
    """Id lists of different lengths -> (ids (B, T), attention_mask (B, T)), padded on ``padding``'s side."""
    check_padding(padding)
    if not rows:
        raise ValueError("nothing to encode: no inputs")
    length = max(len(r) for r in rows)
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    mask = torch.zeros(len(rows), length, dtype=torch.long)
    for i, row in enumerate(rows):
        span = slice(0, len(row)) if padding == "right" else slice(length - len(row), length)
        ids[i, span] = torch.tensor(list(row), dtype=torch.long)
        mask[i, span] = 1
    return BatchEncoding(ids, mask)


def id_list(ids: Sequence[int] | Tensor, vocab_size: int) -> list[int]:
    """A 1-D id sequence as Python ints, each checked to be in [0, vocab_size)."""
    if isinstance(ids, Tensor):
        if ids.dim() != 1:
            raise ValueError(f"expected a 1-D sequence of token ids, got shape {tuple(ids.shape)}")
        ids = ids.tolist()
    ids = list(ids)
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < vocab_size:
            raise ValueError(f"token id {i!r} out of range for vocab_size={vocab_size}")
    return ids


def to_str_tokens(
    tokenizer: TextTokenizer, inputs: str | Sequence[str] | Sequence[int] | Tensor,
    prepend_bos: bool | None = None,
) -> list[str] | list[list[str]]:
    """Each token as the text it stands for: a text or 1-D ids -> list[str]; several texts or
    (B, T) ids -> one list per row (padding kept for ids, texts are not padded). Texts get the
    BOS token first as ``encode_texts`` says (``prepend_bos``)."""
    def of_text(text: str) -> list[str]:
        batch = encode_texts(tokenizer, text, prepend_bos)
        return tokenizer.str_tokens(batch.ids[0])

    if isinstance(inputs, str):
        return of_text(inputs)
    if isinstance(inputs, Tensor):
        if inputs.dim() == 2:
            return [tokenizer.str_tokens(row) for row in inputs]
        return tokenizer.str_tokens(inputs)
    items = list(inputs)
    if items and all(isinstance(item, str) for item in items):
        return [of_text(item) for item in items]
    return tokenizer.str_tokens(items)


def to_string(
    tokenizer: TextTokenizer, ids: Sequence[int] | Tensor, attention_mask: Tensor | None = None
) -> str | list[str]:
    """Ids -> text: 1-D ids -> str; (B, T) ids -> one str per row, without the positions where
    ``attention_mask`` is 0 (padding). Special tokens are kept, as TransformerLens' ``to_string`` and
    ``transformers``' ``decode`` keep them (GPT-2's BOS ``<|endoftext|>``, BERT's ``[CLS]``)."""
    ids = ids if isinstance(ids, Tensor) else torch.tensor(list(ids), dtype=torch.long)
    if attention_mask is not None and attention_mask.shape != ids.shape:
        raise ValueError(f"attention_mask {tuple(attention_mask.shape)} must have the shape of ids "
                         f"{tuple(ids.shape)}")
    keep = torch.ones_like(ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    if ids.dim() == 1:
        return tokenizer.decode(ids[keep])
    return [tokenizer.decode(row[k]) for row, k in zip(ids, keep, strict=True)]
