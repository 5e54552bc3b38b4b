"""One table per model family maps Hugging Face tensors to blocklab's, used in both directions.

Each ``WeightMap`` row says: the Hugging Face tensor ``hf`` is blocklab's tensors ``ours``
concatenated along dim 0 (GPT-2's ``c_attn`` packs q, k, v this way; every other row has one
tensor), then transposed when ``conv1d`` (GPT-2's ``Conv1D`` stores ``(in, out)``, the
transpose of ``nn.Linear``'s ``(out, in)``). Import splits and transposes back.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from ..nn.config import ModelConfig


class PretrainedError(ValueError):
    """A model folder or file that cannot be used: names the file and the key or field at fault."""


# The biases of most families: attention's output projection has one where every linear has one (o_bias
# unset: as bias), the head has none. A family module's ARCHITECTURE takes them (import sets them, export
# refuses a model that differs: its weights would have no place in the family's files).
PLAIN_BIASES: dict[str, Any] = {"o_bias": None, "ffn_bias": None, "head_bias": False}
# Plain attention and logits, as every family but Gemma 2 and 3 has them: scores scaled by d_head^-1/2,
# nothing capped, every layer's attention alike, one rotary base (the same ARCHITECTURE role: a model that
# differs is refused by name).
PLAIN_SCORES: dict[str, Any] = {"attn_softcap": None, "logit_softcap": None, "query_pre_attn_scalar": None,
                                "layer_windows": None, "local_rotary_base": None}


@dataclass(frozen=True)
class WeightMap:
    """Hugging Face tensor ``hf`` = cat(blocklab tensors ``ours``, dim 0), transposed if ``conv1d``;
    with ``heads`` > 0, interleaved group by group instead: [q_0 k_0 v_0 q_1 k_1 v_1 ...] (GPT-NeoX's
    query_key_value), each part cut in ``heads`` blocks of equal rows (the parts' blocks may differ in size:
    Falcon's group of several query heads, then its one key and value head). ``skip``: leading rows of the
    Hugging Face tensor no token reaches (OPT's position table starts at row 2), dropped on import, zeros on
    export."""

    hf: str
    ours: tuple[str, ...]
    conv1d: bool = False
    heads: int = 0
    skip: int = 0


def renamed(hf_prefix: str, ours_prefix: str, modules: dict[str, str], conv1d: bool = False,
            params: tuple[str, ...] = ("weight", "bias")) -> list[WeightMap]:
    """One row per parameter of each renamed module: ``{hf_prefix}{hf_name}.weight`` <-> ours."""
    return [
        WeightMap(f"{hf_prefix}{hf}.{p}", (f"{ours_prefix}{us}.{p}",), conv1d)
        for hf, us in modules.items()
        for p in params
    ]


def same_dropouts(hf: dict[str, Any], defaults: dict[str, Any], fields: tuple[str, ...]) -> float:
    """The one dropout probability blocklab has, from config.json's several (residual, embedding,
    attention); PretrainedError naming them when they differ."""
    values = {field: float(hf_value(hf, defaults, field)) for field in fields}
    if len(set(values.values())) > 1:
        given = ", ".join(f"{k}={v!r}" for k, v in values.items())
        raise PretrainedError(f"config.json {given}: blocklab has one dropout probability for all of them; "
                              "set them equal")
    return values[fields[0]]


def head_rows(hf_name: str, config: ModelConfig) -> list[WeightMap]:
    """The LM head's rows: its weight unless tied to the embedding, and its bias where it has one."""
    params = (() if config.tie_embeddings else ("weight",)) + (("bias",) if config.head_bias else ())
    return renamed("", "", {hf_name: "head"}, params=params)


def to_hf(state: dict[str, Tensor], rows: list[WeightMap]) -> dict[str, Tensor]:
    """blocklab state dict -> Hugging Face tensors (contiguous, as safetensors wants)."""
    out = {}
    for row in rows:
        parts = [state[k] for k in row.ours]
        if row.heads:  # each part (heads, its rows per head, ...) side by side -> one tensor, head by head
            t = torch.cat([p.unflatten(0, (row.heads, -1)) for p in parts], 1).flatten(0, 1)
        else:
            t = torch.cat(parts) if len(parts) > 1 else parts[0]
        if row.skip:
            t = torch.cat([t.new_zeros(row.skip, *t.shape[1:]), t])
        out[row.hf] = (t.t() if row.conv1d and t.dim() == 2 else t).detach().contiguous()
    return out


def from_hf(hf: dict[str, Tensor], rows: list[WeightMap], shapes: dict[str, torch.Size]) -> dict[str, Tensor]:
    """Hugging Face tensors (already checked against ``to_hf``'s shapes) -> blocklab state dict."""
    out = {}
    for row in rows:
        t = hf[row.hf]
        t = t.t() if row.conv1d and t.dim() == 2 else t
        t = t[row.skip:]
        if row.heads:  # head by head: (heads, the parts' rows per head, ...), cut into the parts
            sizes = [shapes[k][0] // row.heads for k in row.ours]
            parts = t.unflatten(0, (row.heads, -1)).split(sizes, dim=1)
            for key, part in zip(row.ours, parts, strict=True):
                out[key] = part.flatten(0, 1).contiguous()
            continue
        sizes = [shapes[k][0] for k in row.ours]
        for key, part in zip(row.ours, torch.split(t, sizes), strict=True):
            out[key] = part.contiguous()
    return out


class Family(Protocol):
    """What each family module (hf_bert, hf_gpt2, hf_gpt_neox) or object (hf_llama's) provides."""

    MODEL_TYPE: str
    name: str  # in words: "GPT-2", "OLMo 2"
    default_prepend_bos: bool  # TransformerLens' default for the family: text gets the BOS token first
    IGNORED: tuple[str, ...]  # regexes of Hugging Face keys blocklab does not use (pooler, buffers)
    # (optional) regex -> why: keys of a part blocklab does not implement and whose absence would change what
    # the model computes (a head): the folder is refused, naming it, rather than loaded without it
    REFUSED: dict[str, str]

    def config_from_hf(self, hf: dict[str, Any]) -> ModelConfig: ...
    def hf_config(self, config: ModelConfig) -> dict[str, Any]: ...
    def weight_map(self, config: ModelConfig) -> list[WeightMap]: ...
    def normalize_key(self, key: str) -> str: ...
    def export_key(self, key: str) -> str: ...


def is_ignored(key: str, patterns: tuple[str, ...]) -> bool:
    """Whether a Hugging Face key matches one of a family's ignored patterns."""
    return any(re.fullmatch(p, key) for p in patterns)


def refused_part(keys: list[str], family: Family) -> tuple[str, str] | None:
    """The first key of a part the family refuses (``Family.REFUSED``) and why, or None."""
    for pattern, why in getattr(family, "REFUSED", {}).items():
        key = next((k for k in keys if re.fullmatch(pattern, k)), None)
        if key is not None:
            return key, why
    return None


def _type_rule(default: Any) -> tuple[Callable[[Any], bool], str] | None:
    """How a config.json value must look, judged by the type of ``transformers``' default for it."""
    if isinstance(default, bool):
        return (lambda v: isinstance(v, bool)), "true or false"
    if isinstance(default, int) or default is None:  # None: an optional size (GPT-2's n_inner)
        return (lambda v: isinstance(v, int) and not isinstance(v, bool)), "an integer"
    if isinstance(default, float):
        return (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)), \
            "a finite number"
    if isinstance(default, str):
        return (lambda v: isinstance(v, str)), "a string"
    return None


def hf_value(hf: dict[str, Any], defaults: dict[str, Any], name: str) -> Any:
    """A config.json field, or the ``transformers`` default when config.json leaves it out; a value of
    the wrong type (``"false"`` for a boolean, ``"768"`` for a size) is refused naming the field."""
    if name not in hf or hf[name] is None:
        return defaults[name]
    value, rule = hf[name], _type_rule(defaults[name])
    if rule is not None and not rule[0](value):
        raise PretrainedError(f"config.json {name}={value!r} must be {rule[1]}")
    return value


def require(hf: dict[str, Any], defaults: dict[str, Any], name: str, allowed: tuple[Any, ...]) -> Any:
    """A config.json field that blocklab supports only with certain values."""
    value = hf_value(hf, defaults, name)
    if value not in allowed:
        supported = ", ".join(map(repr, allowed))
        raise PretrainedError(f"config.json {name}={value!r} is not supported; blocklab supports {supported}")
    return value


def check_exportable(config: ModelConfig, family: str, needed: dict[str, Any]) -> None:
    """ValueError naming every ModelConfig field whose value the family's layout cannot express."""
    wrong = [f"{name}={getattr(config, name)!r} (needs {want!r})"
             for name, want in needed.items() if getattr(config, name) != want]
    if wrong:
        raise PretrainedError(f"this model has no {family} layout: ModelConfig " + ", ".join(wrong))


def export_activation(config: ModelConfig, names: dict[str, str]) -> str:
    """The Hugging Face name of the model's activation (inverse of a family's ACTIVATIONS table)."""
    inverse = {ours: hf for hf, ours in reversed(names.items())}  # first listed name wins
    if config.activation not in inverse:
        raise PretrainedError(
            f"ModelConfig.activation={config.activation!r} has no Hugging Face name; "
            f"exportable: {', '.join(inverse)}")
    return inverse[config.activation]


# ---- each layer's window, as config.json files say it ------------------------------------------------
LAYER_TYPES = ("sliding_attention", "full_attention")  # transformers' layer kinds: a window, or none


def windows_from_layer_types(kinds: Any, window: Any, n_layers: int) -> tuple[int | None, ...] | None:
    """Each layer's window from config.json's layer_types (sliding_attention: ``window``; full_attention:
    none), as Gemma 2 and Qwen2 read it; None when no layer slides. Another kind, another length, or
    sliding layers without a window refused by name."""
    if not isinstance(kinds, list) or len(kinds) != n_layers or any(k not in LAYER_TYPES for k in kinds):
        raise PretrainedError(f"config.json layer_types={kinds!r} must name one of "
                              f"{', '.join(LAYER_TYPES)} for each of the {n_layers} layers")
    if "sliding_attention" not in kinds:
        return None
    if window is None:
        raise PretrainedError("config.json sliding_window=None leaves the layers layer_types calls "
                              "sliding_attention without a window")
    return tuple(window if kind == "sliding_attention" else None for kind in kinds)


def one_window_layer_types(config: ModelConfig, family: str) -> tuple[list[str], int | None]:
    """layer_types and the one sliding_window (None: no layer slides) that give ``config``'s windows; windows
    of two sizes have no place in a config.json with one sliding_window, refused naming layer_windows."""
    windows = [config.window(i) for i in range(config.n_layers)]
    sizes = sorted({w for w in windows if w is not None})
    if len(sizes) > 1:
        raise PretrainedError(f"this model has no {family} layout: ModelConfig layer_windows="
                              f"{config.layer_windows!r} ({family} has one sliding_window for all of its "
                              "sliding layers)")
    return ["full_attention" if w is None else "sliding_attention" for w in windows], (sizes or [None])[0]


def window_fields(windows: tuple[int | None, ...] | None) -> dict[str, Any]:
    """ModelConfig's window fields for each layer's window: the same on every layer as sliding_window
    (Mistral's form), else layer_windows."""
    if windows is not None and len(set(windows)) == 1:
        return {"sliding_window": windows[0], "layer_windows": None}
    return {"sliding_window": None, "layer_windows": windows}
