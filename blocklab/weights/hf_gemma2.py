"""Gemma 2 (``transformers.Gemma2ForCausalLM``) <-> blocklab's sandwich block with Gemma's RMSNorm.

Gemma's tensors (hf_llama.GEMMA) with two more norms per layer, each on a sublayer's output before its
residual add (layout ``sandwich``):

    model.layers.{i}.input_layernorm            -> blocks.{i}.ln1       (RMSNorm, 1 + w)
    model.layers.{i}.post_attention_layernorm   -> blocks.{i}.ln1_out   (on attention's output)
    model.layers.{i}.pre_feedforward_layernorm  -> blocks.{i}.ln2
    model.layers.{i}.post_feedforward_layernorm -> blocks.{i}.ln2_out   (on the FFN's output)

and its config's own fields: ``attn_logit_softcapping`` -> attn_softcap, ``final_logit_softcapping`` ->
logit_softcap, ``query_pre_attn_scalar`` (scores times its -1/2 power), ``hidden_activation`` (Gemma's
``hidden_act``), and each layer's kind: ``layer_types`` (transformers' default: "sliding_attention" on
layers 0, 2, 4, ..., "full_attention" on the others) with the one ``sliding_window`` -> layer_windows.
A layer type other than those two, or sliding layers without a window, is refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..nn.config import ModelConfig
from .hf_llama import GEMMA, LAYER, LlamaFamily
from .hf_map import hf_value, one_window_layer_types, windows_from_layer_types
from .hf_tokenizer import HFTokenizer

# config.json name -> ModelConfig field (None in config.json: off)
SCORE_FIELDS = {"attn_logit_softcapping": "attn_softcap", "final_logit_softcapping": "logit_softcap",
                "query_pre_attn_scalar": "query_pre_attn_scalar"}


def default_layer_types(n_layers: int) -> list[str]:
    """transformers' Gemma2Config when config.json has no layer_types: layer i slides when i + 1 is odd."""
    return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n_layers)]


@dataclass(frozen=True)
class Gemma2Family(LlamaFamily):
    """Gemma's family with the sandwich block, soft-capping, the query scalar and per-layer windows."""

    @property
    def architecture_fields(self) -> dict[str, Any]:
        """Gemma's, less the fields Gemma 2's config.json sets (caps, scalar, windows)."""
        own = (*SCORE_FIELDS.values(), "layer_windows")
        return {k: v for k, v in super().architecture_fields.items() if k not in own}

    def config_from_hf(self, hf: dict[str, Any]) -> ModelConfig:
        """Gemma's fields (``hidden_activation`` read as Gemma's ``hidden_act``), then Gemma 2's own."""
        base = super().config_from_hf({**hf, "hidden_act": hf_value(hf, self.defaults, "hidden_activation")})
        # null is a value here (no cap), not "the default": read as written, ModelConfig checks it
        scores = {ours: hf.get(theirs, self.defaults[theirs]) for theirs, ours in SCORE_FIELDS.items()}
        return base.replace(**scores, layer_windows=self._layer_windows(hf, base.n_layers))

    def _layer_windows(self, hf: dict[str, Any], n_layers: int) -> tuple[int | None, ...] | None:
        kinds = hf.get("layer_types") or default_layer_types(n_layers)
        return windows_from_layer_types(kinds, hf.get("sliding_window", self.defaults["sliding_window"]),
                                        n_layers)

    def hf_config(self, config: ModelConfig, tokenizer: HFTokenizer | None = None) -> dict[str, Any]:
        """Gemma's config.json with Gemma 2's fields; windows of two sizes have no place in it (one
        sliding_window), so such a model is refused, naming layer_windows."""
        kinds, window = one_window_layer_types(config, self.name)
        out = super().hf_config(config, tokenizer)
        out["hidden_activation"] = out.pop("hidden_act")
        out |= {theirs: getattr(config, ours) for theirs, ours in SCORE_FIELDS.items()}
        scalar = config.d_head if config.query_pre_attn_scalar is None else config.query_pre_attn_scalar
        out["query_pre_attn_scalar"] = int(scalar) if float(scalar).is_integer() else scalar  # as theirs: 256
        out["layer_types"] = kinds
        out["sliding_window"] = self.defaults["sliding_window"] if window is None else window  # unused: none
        return out


GEMMA2_LAYER = {**{hf: ours for hf, ours in LAYER.items() if hf != "post_attention_layernorm"},
                "post_attention_layernorm": "ln1_out", "pre_feedforward_layernorm": "ln2",
                "post_feedforward_layernorm": "ln2_out"}
# transformers' Gemma2Config defaults (Gemma 2 2B's shape)
GEMMA2 = Gemma2Family("gemma2", "Gemma 2", "Gemma2ForCausalLM", {
    **GEMMA.defaults,  # hidden_act: read from hidden_activation
    "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26, "num_attention_heads": 8,
    "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "query_pre_attn_scalar": 256, "sliding_window": 4096, "final_logit_softcapping": 30.0,
    "attn_logit_softcapping": 50.0},
    fixes={**GEMMA.fixes, "norm_position": "sandwich"}, activations=GEMMA.activations, layer=GEMMA2_LAYER)
