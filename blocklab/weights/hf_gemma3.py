"""Gemma 3 text (``transformers.Gemma3ForCausalLM``, model_type ``gemma3_text``) <-> blocklab's sandwich
block with Gemma's RMSNorm and QK-norm per head.

Gemma 2's tensors (hf_gemma2.GEMMA2) with a norm on each head's queries and keys (Gemma's RMSNorm, 1 + w,
d_head wide, shared by the heads: blocklab's ``qk_norm="head"`` with the block's norm variant):

    model.layers.{i}.self_attn.q_norm, k_norm  -> blocks.{i}.attn.q_norm, k_norm

and its config's own fields: ``rope_local_base_freq`` -> local_rotary_base (the sliding layers rotate by
it, unscaled; the full layers by ``rope_theta`` with ``rope_scaling``, as transformers' two rotary
embeddings do), ``layer_types`` as Gemma 2's, or, in a config.json written before layer_types, every
``sliding_window_pattern``-th layer full (transformers' default 6). Gemma 3 caps nothing by default (null
caps read as none); ``attn_logit_softcapping`` other than null is refused by name (transformers' Gemma 3
stores it and never applies it), as are ``use_bidirectional_attention`` (non-causal text attention) and a
rope scaling blocklab does not compute (ModelConfig.rope_scaling computes Llama 3's and the 4B+ models'
linear one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..nn.config import ModelConfig
from .hf_gemma2 import GEMMA2, GEMMA2_LAYER, Gemma2Family
from .hf_llama import QK_NORMS
from .hf_map import PretrainedError, hf_value, require
from .hf_tokenizer import HFTokenizer


def pattern_layer_types(pattern: Any, n_layers: int) -> list[str]:
    """transformers' Gemma3TextConfig without layer_types: layer i slides unless (i + 1) % pattern == 0."""
    if not (isinstance(pattern, int) and not isinstance(pattern, bool) and pattern >= 1):
        raise PretrainedError(f"config.json sliding_window_pattern={pattern!r} must be an integer >= 1 "
                              "(every pattern-th layer full)")
    return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n_layers)]


@dataclass(frozen=True)
class Gemma3Family(Gemma2Family):
    """Gemma 2's family with QK-norm per head and a rotary base of its own on the sliding layers."""

    @property
    def architecture_fields(self) -> dict[str, Any]:
        """Gemma 2's, less local_rotary_base (config.json's rope_local_base_freq), with scores uncapped."""
        fields = {k: v for k, v in super().architecture_fields.items() if k != "local_rotary_base"}
        return {**fields, "attn_softcap": None}

    def config_from_hf(self, hf: dict[str, Any]) -> ModelConfig:
        """Gemma 2's fields, then the sliding layers' rotary base; bidirectional attention and a cap on the
        scores refused (transformers' Gemma3Attention keeps attn_logit_softcapping but never applies it:
        a capped and an uncapped reading would both be wrong somewhere)."""
        require(hf, self.defaults, "use_bidirectional_attention", (False,))
        cap = hf.get("attn_logit_softcapping")
        if cap is not None:
            raise PretrainedError(f"config.json attn_logit_softcapping={cap!r} is not supported: "
                                  "transformers' Gemma 3 does not cap the scores whatever it says, so "
                                  "blocklab reads Gemma 3 with null only (Gemma 2 caps them)")
        base = super().config_from_hf(hf)
        local = base.layer_windows is not None and any(w is not None for w in base.layer_windows)
        # (no sliding layer: transformers' local rotation rotates nothing, and blocklab has no place for it)
        return base.replace(local_rotary_base=float(hf_value(hf, self.defaults, "rope_local_base_freq"))
                            if local else None)

    def _layer_windows(self, hf: dict[str, Any], n_layers: int) -> tuple[int | None, ...] | None:
        if not hf.get("layer_types") and isinstance(n_layers, int):  # written before layer_types
            pattern = hf.get("sliding_window_pattern", self.defaults["sliding_window_pattern"])
            hf = {**hf, "layer_types": pattern_layer_types(pattern, n_layers)}
        return super()._layer_windows(hf, n_layers)

    def hf_config(self, config: ModelConfig, tokenizer: HFTokenizer | None = None) -> dict[str, Any]:
        """Gemma 2's config.json with the sliding layers' base (rotary_base where the model has none of
        its own: the config that reads back then says so and the model is refused by name)."""
        out = super().hf_config(config, tokenizer)
        local = config.local_rotary_base
        out["rope_local_base_freq"] = config.rotary_base if local is None else local
        out["use_bidirectional_attention"] = False
        return out


# transformers' Gemma3TextConfig defaults (Gemma 3 4B's text shape)
GEMMA3 = Gemma3Family("gemma3_text", "Gemma 3", "Gemma3ForCausalLM", {
    **GEMMA2.defaults, "vocab_size": 262208, "max_position_embeddings": 131072, "rope_theta": 1000000.0,
    "final_logit_softcapping": None, "attn_logit_softcapping": None, "rope_local_base_freq": 10000.0,
    "use_bidirectional_attention": False, "sliding_window_pattern": 6},
    fixes={**GEMMA2.fixes, "qk_norm": "head"}, activations=GEMMA2.activations,
    layer={**GEMMA2_LAYER, **QK_NORMS})
