"""``model.cfg``: the fields of TransformerLens' ``HookedTransformerConfig`` that TransformerLens code reads
(its own ``patching`` module, notebooks' ``model.cfg.n_layers``), computed from a blocklab model.

Each value is what TransformerLens' config would hold for the same model. Where TransformerLens has no
such thing (an activation or a norm it does not implement, sinusoidal positions), reading the field is a
ValueError naming blocklab's setting: never a near value. A field TransformerLens has and this view does
not is an AttributeError that says so.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .activation_kinds import activation_kind
from .config import ModelConfig
from .layouts import LAYOUTS
from .norm_kinds import NORM_KINDS
from .position_kinds import POSITION_KINDS

# blocklab's pos_encoding -> TransformerLens' positional_embedding_type, where it has the kind


# TransformerLens' MoE (components/mlps/moe.py): softmax over all E, the top k, divided by their sum with
# norm_topk_prob; each expert a gated MLP of d_mlp; no shared expert
MOE_FIELDS = ("num_experts", "experts_per_token", "norm_topk_prob")


def _experts(c: ModelConfig, gated: bool, values: dict[str, Any], refused: dict[str, str]) -> None:
    """TransformerLens' MoE fields for ``c`` into ``values`` (None, None, False without experts, as it holds),
    or each into ``refused`` naming the setting its MoE has no place for."""
    if not c.n_experts:
        values |= {"num_experts": None, "experts_per_token": None, "norm_topk_prob": False}
        return
    why = (f"shared_expert_d_ff={c.shared_expert_d_ff!r} (a shared expert)" if c.shared_expert_d_ff
           else f"router_softmax={c.router_softmax!r}" if c.router_softmax != "before_top_k"
           else f"activation={c.activation!r} (experts that are not gated MLPs)" if not gated else None)
    if why is None:
        values |= {"num_experts": c.n_experts, "experts_per_token": c.experts_per_token,
                   "norm_topk_prob": c.renormalize_top_k}
    else:
        refused |= {name: f"{why} has no place in TransformerLens' MoE" for name in MOE_FIELDS}


def _windows(c: ModelConfig, values: dict[str, Any], refused: dict[str, str]) -> None:
    """TransformerLens' local attention: one window_size, and each layer "local" or "global" (attn_types);
    layers with windows of different sizes are refused by name (it has one size)."""
    windows = [c.window(i) for i in range(c.n_layers)]
    sizes = {w for w in windows if w is not None}
    values["use_local_attn"] = bool(sizes)
    if len(sizes) > 1:
        why = f"layer_windows={c.layer_windows!r} (windows of {len(sizes)} sizes; TransformerLens has one)"
        refused |= {"window_size": why, "attn_types": why}
        return
    values["window_size"] = next(iter(sizes), None)
    values["attn_types"] = [("global" if w is None else "local") for w in windows] if sizes else None


def _rope_scaling(c: ModelConfig, values: dict[str, Any], refused: dict[str, str]) -> None:
    """TransformerLens' rotary scalings: Llama 3's as its NTK-by-parts fields (on every layer), the linear one
    as rotary_scaling_factor (on every layer but its "local" ones). Where blocklab scales other layers than
    TransformerLens would (a local layer's own base left unscaled under Llama 3's; a local layer without
    one scaled under the linear), the field is refused by name."""
    scaling = c.rope_scaling
    if scaling is None:
        values |= {"use_NTK_by_parts_rope": False, "rotary_scaling_factor": 1.0}
        return
    scaled = [c.rotary_of(i)[1] is not None for i in range(c.n_layers)]
    local = [c.window(i) is not None for i in range(c.n_layers)]
    if scaling["rope_type"] == "llama3":
        values["rotary_scaling_factor"] = 1.0
        if not all(scaled):
            refused["use_NTK_by_parts_rope"] = (
                "rope_scaling is Llama 3's on the global layers only (the local ones have their own "
                "base), and TransformerLens scales every layer")
            return
        values |= {"use_NTK_by_parts_rope": True, "NTK_by_parts_factor": scaling["factor"],
                   "NTK_by_parts_low_freq_factor": scaling["low_freq_factor"],
                   "NTK_by_parts_high_freq_factor": scaling["high_freq_factor"],
                   "NTK_original_ctx_len": scaling["original_max_position_embeddings"]}
        return
    values["use_NTK_by_parts_rope"] = False
    if scaled != [not is_local for is_local in local]:
        refused["rotary_scaling_factor"] = ("rope_scaling is linear on layers with a window too, and "
                                            "TransformerLens scales its global layers only")
        return
    values["rotary_scaling_factor"] = scaling["factor"]


class TransformerLensConfig:
    """A read-only view of a model as TransformerLens' ``HookedTransformerConfig`` (``model.cfg``)."""

    def __init__(self, config: ModelConfig, device: torch.device, dtype: torch.dtype,
                 default_prepend_bos: bool, tokenizer_prepends_bos: bool | None,
                 folded_ln: bool = False, use_attn_result: bool = False) -> None:
        c = config
        act = activation_kind(c.activation)
        norm = NORM_KINDS[c.norm]
        grouped = c.kv_heads != c.n_heads
        # attention and the FFN added by one sum (GPT-NeoX, GPT-J)
        positions = POSITION_KINDS[c.pos_encoding]
        parallel = any(connection.others for connection in LAYOUTS[c.norm_position].connections.values())
        values: dict[str, Any] = {
            "n_layers": c.n_layers, "d_model": c.d_model, "n_heads": c.n_heads, "d_head": c.d_head,
            "n_key_value_heads": c.kv_heads if grouped else None, "d_mlp": c.d_ff, "d_vocab": c.vocab_size,
            "d_vocab_out": c.vocab_size, "n_ctx": c.max_seq_len, "eps": c.eps,
            "gated_mlp": act.ffn_kind.gated, "attn_only": False, "parallel_attn_mlp": parallel,
            "original_architecture": None, "model_name": "blocklab", "device": device, "dtype": dtype,
            "default_prepend_bos": default_prepend_bos, "tokenizer_prepends_bos": tokenizer_prepends_bos,
            "use_attn_result": use_attn_result, "use_split_qkv_input": False, "use_hook_mlp_in": False,
            "use_attn_in": False, "use_attn_scale": True, "use_qk_norm": c.qk_norm != "none",
            "final_rms": bool(c.final_norm) and not norm.centres, "rotary_base": c.rotary_base,
            "rotary_base_local": c.local_rotary_base,  # TransformerLens' "local" layers: those with a window
            # a norm on each sublayer's input and output (Gemma 2 and 3: TransformerLens' ln1_post, ln2_post)
            "use_normalization_before_and_after": c.sandwich_norms,
            "rotary_dim": round(c.rotary_fraction * c.d_head) if positions.rotary else None,
            "rotary_adjacent_pairs": c.rotary_style != "half",
            "attn_scale": math.sqrt(c.d_head if c.query_pre_attn_scalar is None else c.query_pre_attn_scalar),
            "attn_scores_soft_cap": -1.0 if c.attn_softcap is None else c.attn_softcap,  # -1: TL's "off"
            "output_logits_soft_cap": -1.0 if c.logit_softcap is None else c.logit_softcap,
        }
        refused: dict[str, str] = {}
        if act.transformerlens is None:
            refused["act_fn"] = f"activation={c.activation!r} ({act.label}) has no TransformerLens act_fn"
        else:
            values["act_fn"] = act.transformerlens
        if norm.in_transformerlens:  # after fold_ln TransformerLens says "LNPre" / "RMSPre": gamma is folded
            folded = folded_ln and norm.transformerlens is not None
            values["normalization_type"] = f"{norm.transformerlens}Pre" if folded else norm.transformerlens
        else:
            refused["normalization_type"] = f"norm={c.norm!r} ({norm.label}) has no TransformerLens " \
                                            "normalization_type"
        if positions.transformerlens is not None:
            values["positional_embedding_type"] = positions.transformerlens
        else:
            refused["positional_embedding_type"] = \
                f"pos_encoding={c.pos_encoding!r} has no TransformerLens positional_embedding_type"
        if "attn" not in LAYOUTS[c.norm_position].connections:  # simplified: attention feeds the FFN
            del values["parallel_attn_mlp"]
            refused["parallel_attn_mlp"] = (f"norm_position={c.norm_position!r} feeds the attention output "
                                            "to the FFN, a block TransformerLens does not have")
        _experts(c, act.ffn_kind.gated, values, refused)
        _windows(c, values, refused)
        if positions.rotary:
            _rope_scaling(c, values, refused)
        object.__setattr__(self, "_values", values)
        object.__setattr__(self, "_refused", refused)

    def __getattr__(self, name: str) -> Any:
        values, refused = self.__dict__["_values"], self.__dict__["_refused"]
        if name in values:
            return values[name]
        if name in refused:
            raise ValueError(f"model.cfg.{name}: {refused[name]}, so blocklab gives none rather than another")
        raise AttributeError(f"model.cfg has no {name!r}: blocklab's view of TransformerLens' config holds "
                             f"{', '.join(sorted([*values, *refused]))}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"model.cfg is read-only (a view of model.config): set {name} there instead")

    def to_dict(self) -> dict[str, Any]:
        """The fields TransformerLens has for this model, as a dict (the refused ones left out)."""
        return dict(self.__dict__["_values"])

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self.__dict__["_values"].items())
        return f"TransformerLensConfig({shown})"
