"""The input embedding x0 (docs/concepts.md#the-stack): a token part and a position part, and how each
is sized.

    x0  = tok + pos (+ token type)   (then embed_ln for BERT's layout)
    tok = scale * E[token]           E: (vocab, d_model), key ``embed.weight``
    pos = PE[position]               sinusoidal (fixed) or learned (key ``pos.weight``)

Why the sizes matter. The first block sees the sum tok + pos, and a LayerNorm (or attention's
softmax) cannot tell the two apart: whichever part is larger dominates what the block reads. A
sinusoidal row has entries in [-1, 1] with mean square 1/2, so ``||PE[p]|| = sqrt(d_model / 2)``.
Token embeddings drawn from N(0, 0.02^2) (GPT-2's and BERT's init) have ``||tok|| = 0.02 sqrt(d)``:
with sinusoidal positions the token part is then ~3% of x0 and the model first has to grow its
embeddings 35-fold before the input carries its tokens. So the defaults follow the source that
pairs sinusoidal positions with its token embeddings: Vaswani et al. 2017, section 3.4, multiply
the embedding weights by sqrt(d_model); their code (tensor2tensor) draws them from N(0, 1/d_model),
so each entry of the token part starts at std 1, the same order as the position code's 1/sqrt(2).

Three fields of ModelConfig say how (the same words in the CLI, config.json and the docs):

- ``embed_scale``: the factor on the looked-up rows. ``"sqrt_d_model"``: tok = sqrt(d_model) E[t]
  (Vaswani et al.); ``"none"``: tok = E[t] (GPT-2, BERT: their layouts have no factor, so imported
  models use "none").
- ``embed_std``: the standard deviation of each entry of the token part *at initialisation*,
  after the factor: E ~ N(0, (embed_std / scale)^2). 1.0 with "sqrt_d_model" is tensor2tensor's
  N(0, 1/d) times sqrt(d); 1.0 with "none" is ``nn.Embedding``'s own N(0, 1); 0.02 with "none" is
  GPT-2's and BERT's N(0, 0.02^2). The factor also sets how fast the token part moves: Adam moves
  E by about lr per step, hence the token part by about scale * lr.
- ``pos_std``: learned positions only, the std of their table at initialisation (None: the same as
  ``embed_std``). GPT-2's released code draws wte from N(0, 0.02^2) and wpe from N(0, 0.01^2).

A token-type table (BERT's segments) starts like the token part, N(0, embed_std^2).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig
from .position_kinds import POSITION_KINDS

# embed_scale name -> the factor on E[token], as a function of d_model (names: config.EMBED_SCALES)
SCALE_FACTORS: dict[str, Callable[[int], float]] = {
    "none": lambda d_model: 1.0,
    "sqrt_d_model": lambda d_model: math.sqrt(d_model),
}


def embed_scale_factor(config: ModelConfig) -> float:
    """The factor on the token embedding rows: 1 or sqrt(d_model)."""
    return SCALE_FACTORS[config.embed_scale](config.d_model)


def learned_pos_std(config: ModelConfig) -> float:
    """The init std of a learned position table: ``pos_std``, or ``embed_std`` when unset."""
    return config.pos_std if config.pos_std is not None else config.embed_std


class TokenEmbedding(nn.Embedding):
    """tok = scale * E[token]; key ``embed.weight (vocab, d_model)`` (the head may share it)."""

    def __init__(self, vocab_size: int, d_model: int, scale: float = 1.0) -> None:
        super().__init__(vocab_size, d_model)
        self.scale = scale

    def forward(self, tokens: Tensor) -> Tensor:  # (B, T) ids -> (B, T, d_model)
        rows = super().forward(tokens)
        return rows if self.scale == 1.0 else rows * self.scale

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, scale={self.scale:g}"

    @property
    def W_E(self) -> Tensor:
        """(vocab, d): what x0 adds for each token, the rows times their factor (TransformerLens' name)."""
        return self.weight if self.scale == 1.0 else self.weight * self.scale


TABLE_SLICE = 1 << 13  # positions computed in float64 at a time (a few MB of temporaries)


def sinusoidal_table(max_seq_len: int, d_model: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(p / 10000^(2i/d)); (max_seq_len, d).

    Computed in float64 a slice of positions at a time and stored at ``dtype``: the table costs its own
    bytes (what the memory guard counts), never a float64 copy of the whole."""
    pe = torch.empty(max_seq_len, d_model, dtype=dtype)
    freq = torch.pow(10000.0, torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (ceil(d/2),)
    for start in range(0, max_seq_len, TABLE_SLICE):
        pos = torch.arange(start, min(start + TABLE_SLICE, max_seq_len), dtype=torch.float64)[:, None]
        angle = pos / freq  # (slice, ceil(d/2))
        pe[start : start + len(pos), 0::2] = torch.sin(angle).to(dtype)
        pe[start : start + len(pos), 1::2] = torch.cos(angle[:, : d_model // 2]).to(dtype)
    return pe


def lookup_positions(table: Tensor, seq_len: int, start: int, position_ids: Tensor | None) -> Tensor:
    """Rows of a position table: ``start .. start + seq_len`` (T, d), or ``table[position_ids]`` (B, T, d)."""
    if position_ids is None:
        return table[start : start + seq_len]
    return F.embedding(position_ids, table)


class SinusoidalPositions(nn.Module):
    """Fixed positional encoding; a non-persistent buffer, so it adds no state-dict key."""

    def __init__(self, max_seq_len: int, d_model: int) -> None:
        super().__init__()
        self.max_seq_len, self.d_model = max_seq_len, d_model
        self.register_buffer("pe", sinusoidal_table(max_seq_len, d_model), persistent=False)

    def _apply(self, fn, recurse=True):  # nn.Module's signature
        # .double() etc. would cast the float32 table; rebuild it from float64 at the new dtype (a move to
        # another device keeps its values, so it is not rebuilt)
        dtype = self.pe.dtype
        super()._apply(fn, recurse)
        if self.pe.dtype != dtype:
            self.pe = sinusoidal_table(self.max_seq_len, self.d_model, self.pe.dtype).to(self.pe.device)
        return self

    def forward(self, seq_len: int, start: int = 0, position_ids: Tensor | None = None) -> Tensor:
        """(T, d_model) for positions start..start+T, or (B, T, d_model) for ``position_ids`` (B, T)."""
        return lookup_positions(self.pe, seq_len, start, position_ids)

    @property
    def W_pos(self) -> Tensor:
        """(max_seq_len, d): what x0 adds at each position (TransformerLens' name)."""
        return self.pe


class LearnedPositions(nn.Embedding):
    """Learned positional embedding; key ``pos.weight (max_seq_len, d_model)``."""

    def forward(self, seq_len: int, start: int = 0, position_ids: Tensor | None = None) -> Tensor:  # type: ignore[override]
        """(T, d_model) for positions start..start+T, or (B, T, d_model) for ``position_ids`` (B, T)."""
        return lookup_positions(self.weight, seq_len, start, position_ids)

    @property
    def W_pos(self) -> Tensor:
        """(max_seq_len, d): what x0 adds at each position (TransformerLens' name)."""
        return self.weight


def build_positions(config: ModelConfig) -> nn.Module | None:
    """The positional encoding x0 adds, as the config names it (None for a kind that adds nothing to x0:
    rotary and ALiBi act inside attention, rotary.py and alibi.py)."""
    kind = POSITION_KINDS[config.pos_encoding]
    if not kind.adds_to_x0:
        return None
    table = LearnedPositions if kind.learned else SinusoidalPositions
    return table(config.max_seq_len, config.d_model)


def build_token_embedding(config: ModelConfig) -> TokenEmbedding:
    """The token embedding with the config's factor (``embed_scale``)."""
    return TokenEmbedding(config.vocab_size, config.d_model, embed_scale_factor(config))


def init_embeddings(
    config: ModelConfig, embed: TokenEmbedding, pos: nn.Module | None, token_type: nn.Embedding | None
) -> None:
    """Draw the tables: E ~ N(0, (embed_std/scale)^2), learned positions ~ N(0, pos_std^2) (None:
    embed_std), token types ~ N(0, embed_std^2). In that order (the order the modules are built)."""
    nn.init.normal_(embed.weight, mean=0.0, std=config.embed_std / embed.scale)
    if isinstance(pos, LearnedPositions):
        nn.init.normal_(pos.weight, mean=0.0, std=learned_pos_std(config))
    if token_type is not None:
        nn.init.normal_(token_type.weight, mean=0.0, std=config.embed_std)


# ---- what the tracer and diagnose report --------------------------------------------------------

TOKEN_SHARE = "||tok|| / (||tok|| + ||pos||) per position (L2 norms over d_model; 1 without a position code)"


@dataclass
class EmbeddingParts:
    """The two parts of x0 at each position: their L2 norms and the token part's share (TOKEN_SHARE).

    The parts are before the token-type embedding, embed_ln and dropout (BERT's layout adds those)."""

    tok_l2: Tensor  # (...,) ||tok|| at each position
    pos_l2: Tensor  # (...,) ||pos||
    tok_share: Tensor  # (...,) ||tok|| / (||tok|| + ||pos||), in [0, 1]


def embedding_parts(tok: Tensor, pos: Tensor | None) -> EmbeddingParts:
    """Norms and token share of the ``tok`` and ``pos`` stages (..., d_model), in float64."""
    tok_l2 = tok.detach().to(torch.float64).norm(dim=-1)
    pos_l2 = pos.detach().to(torch.float64).norm(dim=-1) if pos is not None else torch.zeros_like(tok_l2)
    return EmbeddingParts(tok_l2=tok_l2, pos_l2=pos_l2, tok_share=tok_l2 / (tok_l2 + pos_l2))  # 0/0: nan
