"""``model.tokenizer`` called as TransformerLens and ``transformers`` code calls a Hugging Face tokenizer.

TransformerLens hands its users ``transformers``' tokenizer with three settings of its own
(``HookedTransformer.set_tokenizer``): the padding side "right" unless the folder says otherwise, the
end-of-text token as the pad token when there is none, and as the BOS token when there is none. A
blocklab ``HFTokenizer`` answers the same calls with the same results:

- ``tokenizer(texts, padding=True, truncation=True, max_length=8, return_tensors="pt")`` -> a dict
  (also readable as attributes: ``.input_ids``) of ``input_ids`` and ``attention_mask``, lists or
  tensors, padded on ``padding_side`` (the call's, else the tokenizer's);
- ``decode`` / ``batch_decode`` keep special tokens unless ``skip_special_tokens=True``, and clean up
  spaces before punctuation when ``clean_up_tokenization_spaces`` says so (the folder's setting);
- ``bos_token`` / ``eos_token`` / ``pad_token`` / ``unk_token`` (and their ``_id``s),
  ``all_special_tokens``, ``all_special_ids``, ``special_tokens_map``, ``convert_ids_to_tokens``,
  ``convert_tokens_to_ids``, ``tokenize``, ``get_vocab``, ``len(tokenizer)``.

What it does not do is refused by name: text pairs, a keyword it does not know (``return_offsets_mapping``,
``return_token_type_ids``, ...), tensors other than PyTorch's. ``token_type_ids`` are not returned
(causal models do not read them; a BERT forward takes ``token_type_ids=`` itself).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..nn.tokens import id_list

ID_LIMIT = 2**32  # ids the tokenizers library takes (u32); one beyond the vocabulary decodes to ""
PADDING = {False: None, "do_not_pad": None, True: "longest", "longest": "longest", "max_length": "max_length"}
TRUNCATION = {
    None: False,
    False: False,
    "do_not_truncate": False,
    True: True,
    "longest_first": True,
    "only_first": True,
}
SIDES = ("right", "left")
CALL_KEYWORDS = (
    "text",
    "add_special_tokens",
    "padding",
    "truncation",
    "max_length",
    "return_tensors",
    "return_attention_mask",
    "padding_side",
)
# transformers' clean_up_tokenization: the spaces its word-level tokenizers leave before punctuation
CLEAN_UPS = (
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
)


class TokenizerOutput(dict):
    """transformers' ``BatchEncoding`` as code reads it: ``out["input_ids"]`` or ``out.input_ids``."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(
                f"the tokenizer's output has no {name!r}; it holds {', '.join(self)}"
            ) from None


def clean_up_tokenization(text: str) -> str:
    for before, after in CLEAN_UPS:
        text = text.replace(before, after)
    return text


def _choice(table: dict[Any, Any], value: Any, what: str) -> Any:
    if (value is None or isinstance(value, bool | str)) and value in table:
        return table[value]
    allowed = ", ".join(repr(k) for k in table)
    raise ValueError(f"{what}={value!r} is not one of: {allowed}")


class TransformersTokenizerCalls:
    """The calls above, for ``HFTokenizer`` (mixin: it holds ``_tok``, the ``tokenizers`` library's
    tokenizer, and ``special_tokens``, name -> text)."""

    _tok: Any
    special_tokens: dict[str, str]
    padding_side: str = "right"
    truncation_side: str = "right"
    clean_up_tokenization_spaces: bool = False

    # -- special tokens, with TransformerLens' fallbacks ------------------------------------------

    def _special(self, name: str) -> str | None:
        own = self.special_tokens.get(name)
        if own is None and name in ("pad_token", "bos_token"):  # set_tokenizer: the end-of-text token
            return self.special_tokens.get("eos_token")
        return own

    bos_token = property(lambda self: self._special("bos_token"), doc="The BOS token (else end of text).")
    eos_token = property(lambda self: self._special("eos_token"), doc="The end-of-text token.")
    pad_token = property(lambda self: self._special("pad_token"), doc="The pad token (else end of text).")
    unk_token = property(lambda self: self._special("unk_token"), doc="The unknown token.")
    bos_token_id = property(lambda self: self.convert_tokens_to_ids(self.bos_token))
    eos_token_id = property(lambda self: self.convert_tokens_to_ids(self.eos_token))
    pad_token_id = property(lambda self: self.convert_tokens_to_ids(self.pad_token))
    unk_token_id = property(lambda self: self.convert_tokens_to_ids(self.unk_token))

    @property
    def special_tokens_map(self) -> dict[str, str]:
        names = [*self.special_tokens, "pad_token", "bos_token"]
        return {name: token for name in dict.fromkeys(names) if (token := self._special(name)) is not None}

    @property
    def all_special_tokens(self) -> list[str]:
        return list(dict.fromkeys(self.special_tokens_map.values()))

    @property
    def all_special_ids(self) -> list[int]:
        return [i for t in self.all_special_tokens if (i := self.convert_tokens_to_ids(t)) is not None]

    # -- lookups -------------------------------------------------------------------------------

    def convert_tokens_to_ids(self, tokens: str | None | Sequence[str]) -> Any:
        if tokens is None or isinstance(tokens, str):
            return None if tokens is None else self._tok.token_to_id(tokens)
        return [self._tok.token_to_id(t) for t in tokens]

    def convert_ids_to_tokens(
        self, ids: int | Sequence[int] | Tensor, skip_special_tokens: bool = False
    ) -> Any:
        if isinstance(ids, int) or isinstance(ids, Tensor) and ids.dim() == 0:
            return self._tok.id_to_token(int(ids))
        special = set(self.all_special_ids) if skip_special_tokens else set()
        return [self._tok.id_to_token(i) for i in id_list(ids, ID_LIMIT) if i not in special]

    def tokenize(self, text: str, add_special_tokens: bool = False) -> list[str]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).tokens

    def get_vocab(self) -> dict[str, int]:
        return self._tok.get_vocab(with_added_tokens=True)

    def __len__(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    # -- text in -------------------------------------------------------------------------------

    def __call__(
        self,
        text: str | Sequence[str],
        text_pair: Any = None,
        add_special_tokens: bool = True,
        padding: bool | str = False,
        truncation: bool | str | None = None,
        max_length: int | None = None,
        return_tensors: str | None = None,
        return_attention_mask: bool | None = None,
        padding_side: str | None = None,
        **other: Any,
    ) -> TokenizerOutput:
        """Texts -> ``{"input_ids", "attention_mask"}``, as a ``transformers`` tokenizer's call."""
        if other:
            raise TypeError(
                f"tokenizer(...) does not take {', '.join(sorted(other))}; blocklab's tokenizer takes "
                f"{', '.join(CALL_KEYWORDS)}"
            )
        if text_pair is not None:
            raise ValueError(
                "tokenizer(text, text_pair): text pairs are not supported; encode each text alone"
            )
        single = isinstance(text, str)
        texts = [text] if single else list(text)
        if not all(isinstance(t, str) for t in texts):
            raise ValueError("tokenizer(...) takes a text or a list of texts")
        pad_to, truncate = _choice(PADDING, padding, "padding"), _choice(TRUNCATION, truncation, "truncation")
        side = padding_side if padding_side is not None else self.padding_side
        if side not in SIDES:
            raise ValueError(f"padding_side={side!r} is not one of: {', '.join(SIDES)}")
        if (pad_to == "max_length" or truncate) and not (isinstance(max_length, int) and max_length >= 1):
            raise ValueError(
                f"padding='max_length' and truncation need max_length (an integer >= 1); got {max_length!r}"
            )
        if return_tensors not in (None, "pt"):
            raise ValueError(
                f"return_tensors={return_tensors!r}: blocklab returns PyTorch tensors ('pt') or lists (None)"
            )
        rows = self._encoded(texts, add_special_tokens, max_length if truncate else None)
        rows, masks = self._padded(rows, pad_to, max_length, side)
        out = TokenizerOutput(input_ids=list(rows))
        if return_attention_mask is not False:
            out["attention_mask"] = list(masks)
        if return_tensors == "pt":
            if len({len(r) for r in rows}) > 1:
                raise ValueError("return_tensors='pt' needs rows of one length: pass padding=True")
            return TokenizerOutput({k: torch.tensor(v, dtype=torch.long) for k, v in out.items()})
        return TokenizerOutput({k: v[0] for k, v in out.items()}) if single else out

    def _padded(
        self, rows: list[list[int]], pad_to: str | None, max_length: int | None, side: str
    ) -> tuple[list[list[int]], list[list[int]]]:
        """The rows padded to the longest or to ``max_length`` on ``side``, and their attention masks."""
        if pad_to is None:
            return rows, [[1] * len(r) for r in rows]
        width = max(map(len, rows), default=0) if pad_to == "longest" else int(max_length or 0)
        pad = self.pad_token_id
        if pad is None and any(len(r) < width for r in rows):
            raise ValueError(
                "padding needs a pad token; this tokenizer has neither a pad nor an end-of-text token"
            )
        fills = [max(0, width - len(r)) for r in rows]
        pairs = list(zip(rows, fills, strict=True))
        if side == "right":
            return [r + [pad] * f for r, f in pairs], [[1] * len(r) + [0] * f for r, f in pairs]
        return [[pad] * f + r for r, f in pairs], [[0] * f + [1] * len(r) for r, f in pairs]

    def _encoded(self, texts: list[str], add_special_tokens: bool, max_length: int | None) -> list[list[int]]:
        """Each text's ids; cut to ``max_length`` by the library itself, as transformers does: the text is
        cut and the special tokens still added (BERT: ``[CLS]``, one token, ``[SEP]`` at 3)."""
        if max_length is None:
            return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=add_special_tokens)]
        self._tok.enable_truncation(max_length, direction=self.truncation_side)
        try:
            return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=add_special_tokens)]
        finally:
            self._tok.no_truncation()

    # -- text out ------------------------------------------------------------------------------

    def decode(
        self,
        ids: int | Sequence[int] | Tensor,
        skip_special_tokens: bool = False,
        clean_up_tokenization_spaces: bool | None = None,
    ) -> str:
        """Ids -> text, special tokens kept unless ``skip_special_tokens`` (transformers' default); an id
        beyond the vocabulary adds nothing, as in transformers."""
        ids = [int(ids)] if isinstance(ids, int) or isinstance(ids, Tensor) and ids.dim() == 0 else ids
        ids = id_list(ids, ID_LIMIT)
        if skip_special_tokens:  # the folder's special tokens too: vocab.json + merges.txt registers none
            special = set(self.all_special_ids)
            ids = [i for i in ids if i not in special]
        text = self._tok.decode(ids, skip_special_tokens=skip_special_tokens)
        clean = (
            self.clean_up_tokenization_spaces
            if clean_up_tokenization_spaces is None
            else clean_up_tokenization_spaces
        )
        return clean_up_tokenization(text) if clean else text

    def batch_decode(
        self,
        sequences: Sequence[Sequence[int]] | Tensor,
        skip_special_tokens: bool = False,
        clean_up_tokenization_spaces: bool | None = None,
    ) -> list[str]:
        return [self.decode(row, skip_special_tokens, clean_up_tokenization_spaces) for row in sequences]
