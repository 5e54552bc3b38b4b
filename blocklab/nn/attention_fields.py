"""The rules of ModelConfig's attention fields (config.py calls them): grouped-query heads, the q/k/v
biases, each layer's window, the score caps and scalar, QK-norm, and the rotary positions' options, with
each layer's rotary base (``local_rotary_base``: Gemma 3's local layers rotate by a base of their own).

Every rule reports through ``need(ok, message)``, the message naming field, value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from .norm_kinds import is_layer_norm, layer_norm_variants
from .position_kinds import POSITION_KINDS, PositionKind
from .rotary import check_rope_scaling, rotary_dim

# the fields scaling or capping the scores and logits (Gemma 2): each a number > 0, or None (off)
SOFTCAP_FIELDS = ("attn_softcap", "logit_softcap", "query_pre_attn_scalar")
# the fields that apply to rotary positions only (refused with any other position kind)
ROTARY_FIELDS = ("rotary_fraction", "rotary_base", "rotary_style", "rope_scaling", "local_rotary_base")
Need = Callable[[bool, str], None]


def is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_positive_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def position_kind(c: Any) -> PositionKind | None:
    """The config's position kind; None for a value that is none (refused by its CHOICES check)."""
    return POSITION_KINDS.get(c.pos_encoding) if isinstance(c.pos_encoding, str) else None


def attention_violations(c: Any, need: Need) -> None:
    """Grouped-query heads, the q/k/v biases, the sliding window, QK-norm and rotary positions' options."""
    if c.n_kv_heads is not None:
        need(is_int(c.n_kv_heads) and c.n_kv_heads >= 1 and c.n_heads % c.n_kv_heads == 0,
             f"n_kv_heads={c.n_kv_heads!r} must be an integer >= 1 dividing n_heads={c.n_heads} "
             "(or unset: one key/value head per query head)")
    for name in ("qkv_bias", "o_bias", "ffn_bias"):
        value = getattr(c, name)
        need(value is None or isinstance(value, bool),
             f"{name}={value!r} must be true, false or unset (as bias)")
    if c.sliding_window is not None:
        need(is_int(c.sliding_window) and c.sliding_window >= 1,
             f"sliding_window={c.sliding_window!r} must be an integer >= 1 (or unset: no window)")
        need(c.causal, f"sliding_window={c.sliding_window!r} limits causal attention, but causal=False")
    if c.layer_windows is not None:
        _layer_window_violations(c, need)
    for name in SOFTCAP_FIELDS:
        value = getattr(c, name)
        need(value is None or is_positive_number(value),
             f"{name}={value!r} must be a finite number > 0 (or unset: off)")
    if c.qk_norm != "none":
        need(is_layer_norm(c.norm), f"qk_norm={c.qk_norm!r} normalises q and k with the block's norm "
             f"variant, but norm={c.norm!r} is not one: use {', '.join(layer_norm_variants())}")
    _rotary_violations(c, need)


def _rotary_violations(c: Any, need: Need) -> None:
    """The rotary fields apply to rotary positions only; their values; a local base needs local layers."""
    rotary = getattr(position_kind(c), "rotary", False)
    defaults = {f.name: f.default for f in dataclasses.fields(c)}
    for name in ROTARY_FIELDS:
        if not rotary and getattr(c, name) != defaults[name]:
            need(False, f"{name}={getattr(c, name)!r} applies to rotary positions, but "
                 f"pos_encoding={c.pos_encoding!r}: leave it unset or use pos_encoding='rotary'")
    if not rotary:
        return
    need(is_positive_number(c.rotary_base), f"rotary_base={c.rotary_base!r} must be a finite number > 0")
    fraction_ok = is_positive_number(c.rotary_fraction) and c.rotary_fraction <= 1
    need(fraction_ok, f"rotary_fraction={c.rotary_fraction!r} must be a number in (0, 1]")
    if fraction_ok:
        dim = rotary_dim(c.d_head, c.rotary_fraction)
        need(dim >= 2 and dim % 2 == 0, f"rotary_fraction={c.rotary_fraction!r} of d_head={c.d_head} rotates "
             f"{dim} features; it must rotate an even number >= 2")
    problem = check_rope_scaling(c.rope_scaling)
    need(problem is None, f"rope_scaling={c.rope_scaling!r} {problem}")
    local = c.local_rotary_base
    if local is not None:
        need(is_positive_number(local), f"local_rotary_base={local!r} must be a finite number > 0 (or unset: "
             "every layer rotates by rotary_base)")
        windows = c.layer_windows if isinstance(c.layer_windows, tuple) else ()
        need(c.sliding_window is not None or any(w is not None for w in windows),
             f"local_rotary_base={local!r} is the rotary base of the layers with a window, but no layer has "
             "one (sliding_window and layer_windows unset): leave it unset")


def _layer_window_violations(c: Any, need: Need) -> None:
    """One window per layer, each an integer >= 1 or None (global), causal only, and no second window."""
    w = c.layer_windows
    if not isinstance(w, tuple) or len(w) != c.n_layers:
        need(False, f"layer_windows={w!r} must list one window per layer ({c.n_layers}: n_layers), each an "
             "integer >= 1 or None (that layer global)")
        return
    need(all(v is None or (is_int(v) and v >= 1) for v in w),
         f"layer_windows={w!r}: each must be an integer >= 1 or None (that layer global)")
    need(c.causal, f"layer_windows={w!r} limit causal attention, but causal=False")
    need(c.sliding_window is None, f"layer_windows={w!r} give every layer its window, so sliding_window="
         f"{c.sliding_window!r} must be unset (None)")
