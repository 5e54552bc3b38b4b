"""Rotary position embedding (RoPE, Su et al. 2021; docs/concepts.md#rotary-positions): each head's
queries and keys are rotated, pair of features by pair, by an angle proportional to the position,
so that q_i . k_j depends on the positions only through i - j.

For a pair (x_a, x_b) of features of one head at position p, with frequency w_m for the pair m:

    x_a' = x_a cos(p w_m) - x_b sin(p w_m)          w_m = base^(-2m / r)
    x_b' = x_b cos(p w_m) + x_a sin(p w_m)          m = 0 .. r/2 - 1

r = ``rotary_dim``: the first r features of each head are rotated, the rest pass unchanged (Pythia
rotates 25% of each head: ``rotary_fraction=0.25``). Which features pair up:

- ``"half"`` (Llama, GPT-NeoX, Mistral, Qwen2): feature m with feature m + r/2 (``rotate_half``).
- ``"interleaved"`` (GPT-J): features 2m and 2m + 1.

Llama 3's ``rope_scaling`` (``{"rope_type": "llama3", "factor", "low_freq_factor",
"high_freq_factor", "original_max_position_embeddings"}``) divides the low frequencies by ``factor``
and blends the middle ones (transformers' ``_compute_llama3_parameters``); the linear one
(``{"rope_type": "linear", "factor"}``: Gemma 3 4B and up, on its global layers) divides every frequency
by ``factor``, positions p read as p / factor (``_compute_linear_scaling_rope_parameters``).

Precision: the frequencies and angles are computed in float32 whatever the model's dtype, then cast,
exactly as ``transformers`` computes them, so imported models give its numbers (a float64 model's
angles are float32-exact, ~1e-7).

Positions are the token's index in its own sequence: ``past + 0, 1, ...`` by default, or the
``position_ids`` a caller gives (a left-padded batch gives each row's first real token position 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

ROTARY_STYLES = ("half", "interleaved")
LLAMA3_KEYS = (
    "rope_type", "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
SCALINGS = {"llama3": LLAMA3_KEYS, "linear": ("rope_type", "factor")}  # rope_type -> its keys


def rotary_dim(d_head: int, fraction: float) -> int:
    """How many features of a head are rotated: int(d_head * fraction), as transformers rounds it."""
    return int(d_head * fraction)


def inverse_frequencies(dim: int, base: float, scaling: dict[str, Any] | None = None) -> Tensor:
    """w_m = base^(-2m / dim), m = 0 .. dim/2 - 1, in float32; Llama 3's or the linear scaling applied
    when given."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim))
    if scaling is None:
        return inv_freq
    if scaling["rope_type"] == "linear":  # (transformers divides the float32 frequencies in place)
        return inv_freq / scaling["factor"]
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)  # the long wavelengths
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, blended, scaled)


@dataclass(frozen=True)
class Angles:
    """One forward's rotation: cos and sin for its positions (``Rotary.angles``) and the rotation that
    applies them, handed to every block's attention."""

    cos: Tensor  # (B|1, 1, T, rotary_dim)
    sin: Tensor
    rotary: Rotary

    def rotate(self, x: Tensor) -> Tensor:  # (B, h, T, d_head)
        return self.rotary.rotate(x, self.cos, self.sin)


class Rotary(nn.Module):
    """The rotation's tables for a model: ``angles(positions)`` gives (cos, sin), ``rotate(x, cos, sin)``
    applies them to (B, h, T, d_head) queries or keys. No parameters; the frequencies are a
    non-persistent float32 buffer (no state-dict key)."""

    def __init__(self, d_head: int, fraction: float = 1.0, base: float = 10000.0, style: str = "half",
                 scaling: dict[str, Any] | None = None) -> None:
        super().__init__()
        if style not in ROTARY_STYLES:
            raise ValueError(f"Rotary style={style!r} is not one of: {', '.join(ROTARY_STYLES)}")
        self.d_head, self.dim, self.style = d_head, rotary_dim(d_head, fraction), style
        self.base, self.scaling = base, scaling
        if self.dim < 2 or self.dim % 2:
            raise ValueError(f"Rotary: {fraction} of d_head {d_head} rotates {self.dim} features; it must "
                             "be an even number >= 2")
        self.register_buffer("inv_freq", inverse_frequencies(self.dim, base, scaling), persistent=False)

    def _apply(self, fn, recurse=True):  # nn.Module's signature
        # .double() would cast the frequencies; they stay float32, as transformers keeps them
        super()._apply(fn, recurse)
        self.inv_freq = inverse_frequencies(self.dim, self.base, self.scaling).to(self.inv_freq.device)
        return self

    def angles(self, positions: Tensor, dtype: torch.dtype) -> Angles:
        """cos and sin of position x frequency for ``positions`` (B, T) or (T,): (B|1, 1, T, rotary_dim)
        each, in ``dtype``, laid out for the style (each angle twice: m and m + r/2, or 2m and 2m + 1)."""
        p = positions if positions.dim() == 2 else positions[None]
        freqs = p[..., None].to(torch.float32) * self.inv_freq.to(p.device)  # (B, T, r/2), float32
        both = torch.cat((freqs, freqs), -1) if self.style == "half" else freqs.repeat_interleave(2, -1)
        return Angles(both.cos()[:, None].to(dtype), both.sin()[:, None].to(dtype), self)

    def rotate(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:  # (B, h, T, d_head)
        """x with its first ``dim`` features rotated (the formula in the module docstring)."""
        rot, rest = x[..., : self.dim], x[..., self.dim:]
        if self.style == "half":
            a, b = rot.chunk(2, dim=-1)
            partner = torch.cat((-b, a), dim=-1)  # rotate_half: (x_a, x_b) -> (-x_b, x_a)
        else:
            pairs = rot.unflatten(-1, (-1, 2))
            partner = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
        rotated = rot * cos + partner * sin
        return rotated if rest.shape[-1] == 0 else torch.cat((rotated, rest), dim=-1)

    def extra_repr(self) -> str:
        return (f"d_head={self.d_head}, dim={self.dim}, base={self.base:g}, style={self.style!r}"
                + (f", scaling={self.scaling}" if self.scaling else ""))


def check_rope_scaling(value: object) -> str | None:
    """Why ``value`` is not a rope_scaling blocklab computes (None: it is one, or None itself)."""
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("rope_type") not in SCALINGS:
        return ("must be null, Llama 3's {'rope_type': 'llama3', 'factor', 'low_freq_factor', "
                "'high_freq_factor', 'original_max_position_embeddings'} or the linear "
                "{'rope_type': 'linear', 'factor'} (other scalings are not computed)")
    keys = SCALINGS[value["rope_type"]]
    if sorted(value) != sorted(keys):
        return f"must have exactly the keys {', '.join(keys)}"
    numbers = [value[k] for k in keys[1:]]
    if not all(isinstance(n, (int, float)) and not isinstance(n, bool) and math.isfinite(n) and n > 0
               for n in numbers):
        return "needs finite numbers > 0 for " + ", ".join(keys[1:])
    if value["rope_type"] == "llama3" and value["high_freq_factor"] <= value["low_freq_factor"]:
        return "needs high_freq_factor > low_freq_factor"
    return None
