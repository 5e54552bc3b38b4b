"""The names of hook points: blocklab's stage names (a hook point's module path without ``hook_``) and
TransformerLens's names for the same tensors, ``TRANSFORMERLENS_ALIASES``, the one table of them
(docs/tracer.md shows it), with the translations both ways and the layout TransformerLens gives q, k and v
under its names. hooks.py selects and attaches by these names; the cache reads by them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch import Tensor

if TYPE_CHECKING:  # annotations only (hooks.py imports this module)
    from .hooks import HookFn


def stage_name(module_path: str) -> str:
    """``blocks.0.attn.hook_q`` -> ``blocks.0.attn.q``."""
    parts = module_path.split(".")
    parts[-1] = parts[-1].removeprefix("hook_")
    return ".".join(parts)



# ---- TransformerLens's names ----------------------------------------------------------------------


@dataclass(frozen=True)
class Alias:
    """A TransformerLens hook name and the blocklab stage holding the same tensor (``{i}``: a layer,
    ``{e}``: an expert)."""

    transformerlens: str  # "blocks.{i}.attn.hook_pattern" ({e}: an expert of a mixture)
    blocklab: str | None  # "blocks.{i}.attn.weights"; None: blocklab has no such stage
    note: str = ""  # where the two differ (shape, meaning), or why there is no stage
    # TransformerLens' layout of the tensor where it is not blocklab's (a key of TRANSFORMERLENS_LAYOUTS:
    # "positions_first", "positions_flat"): under this name the cache gives, and a hook receives and
    # returns, TransformerLens' layout
    layout: str = ""
    # whether this is TransformerLens' name for the stage in every layout (a hook's ``.name``); False: the
    # name reads the stage only where TransformerLens has it (a HookedEncoder's post-norm block output)
    names_stage: bool = True
    # the TransformerLens model class that alone has this hook (ENCODER: BERT's; DECODER); None: both
    only_in: str | None = None
    # a ModelConfig flag on which TransformerLens' model means another tensor by this name (the note says
    # which): there the name reads the row that holds only_when that flag, or is refused where none does
    unlike_when: str = ""
    # the TransformerLens model class that means another tensor by this name (ENCODER), refused there
    unlike_in: str | None = None
    # a ModelConfig flag this row alone applies on (TransformerLens' name on such a model for another stage
    # than the table's usual row): "" applies on every model
    only_when: str = ""


_HEADS_FIRST = ("(B, T, h, d_head) under this name, as TransformerLens; blocklab's own name gives "
                "(B, h, T, d_k), heads before positions")
_LN_BEFORE_AFFINE = ("the normalised vector before gamma and beta, (B, T, d) in both (the norm's output "
                     "after them is blocklab's stage without .normalized)")
_LN_SCALE = "the norm's denominator per position, (B, T, 1) in both (LayerNorm and RMSNorm)"
# TransformerLens 3 runs QK-norm on rows it reshapes by variant ((B T h, d_head) per head, (B, T, h d_head)
# over all heads) and hooks it before gamma: refused rather than given in another shape or scale
_QK_NORM_TL3 = ("TransformerLens 3's {q}_norm hooks its scale and its output before gamma on rows reshaped "
                "by variant; blocklab gives the normalised {q} after gamma as "
                "blocks.{{i}}.attn.hook_{q}_normed and its denominator as blocks.{{i}}.attn.{q}_norm.scale")
_OUTPUT_NORM = "; on a block with norms on the outputs alone (OLMo 2) the row below"
_ON_OUTPUT = ("the block with norms on the sublayers' outputs alone (OLMo 2), whose output norm "
              "TransformerLens calls ln1 / ln2: as the row above, of that norm")
_COPY = "a copy that feeds {what} alone (TransformerLens's {flag}); blocklab has one {stage} (replace {alt})"

ENCODER, DECODER = "HookedEncoder", "HookedTransformer"  # TransformerLens' BERT, and its causal models
_MLM_HEAD = ("HookedEncoder's MLM head (dense, GELU, LayerNorm, then the unembedding with its bias): "
             "blocklab's BERT is the encoder alone (BertModel), its logits the tied head on the final hidden "
             "state")
TRANSFORMERLENS_ALIASES: tuple[Alias, ...] = (
    Alias("hook_tokens", None, "the input ids: no stage"),
    Alias("hook_embed", "tok", "the token part of x0 (blocklab's cache['embed'] is x0 itself); refused on a "
          "model with an embedding LayerNorm, where TransformerLens' (BLOOM's) is the token part after that "
          "norm: blocklab's x0, 'embed', where no position adds to it", only_in=DECODER,
          unlike_when="embed_norm"),
    Alias("hook_pos_embed", "pos", "the position part of x0", only_in=DECODER),
    Alias("embed.hook_embed", "tok", "HookedEncoder (BERT)", only_in=ENCODER),
    Alias("embed.hook_pos_embed", "pos", "HookedEncoder (BERT)", only_in=ENCODER),
    Alias("embed.hook_token_type_embed", None, "BERT's segment part of x0: no stage of its own"),
    Alias("hook_full_embed", "embed", "HookedEncoder (BERT): x0 after the embedding LayerNorm",
          only_in=ENCODER),
    Alias("embed.ln.hook_scale", "embed_ln.scale", "the embedding LayerNorm (BERT's, BLOOM's); " + _LN_SCALE),
    Alias("embed.ln.hook_normalized", "embed_ln.normalized",
          "the embedding LayerNorm (BERT's, BLOOM's); " + _LN_BEFORE_AFFINE),
    Alias("blocks.{i}.hook_resid_pre", "blocks.{i}.resid_pre"),
    Alias("blocks.{i}.hook_attn_in", None, _COPY.format(what="attention", flag="use_attn_in, one per head",
                                                        stage="resid_pre", alt="ln1 in pre-norm")),
    Alias("blocks.{i}.hook_q_input", None, "a copy of resid_pre per head for q alone (use_split_qkv_input)"),
    Alias("blocks.{i}.hook_k_input", None, "a copy of resid_pre per head for k alone (use_split_qkv_input)"),
    Alias("blocks.{i}.hook_v_input", None, "a copy of resid_pre per head for v alone (use_split_qkv_input)"),
    Alias("blocks.{i}.ln1.hook_scale", "blocks.{i}.ln1.scale", _LN_SCALE + _OUTPUT_NORM,
          unlike_when="output_norms_only"),
    Alias("blocks.{i}.ln1.hook_normalized", "blocks.{i}.ln1.normalized", _LN_BEFORE_AFFINE + _OUTPUT_NORM,
          unlike_when="output_norms_only"),
    Alias("blocks.{i}.ln1.hook_scale", "blocks.{i}.ln1_out.scale", _ON_OUTPUT, only_when="output_norms_only"),
    Alias("blocks.{i}.ln1.hook_normalized", "blocks.{i}.ln1_out.normalized", _ON_OUTPUT,
          only_when="output_norms_only"),
    Alias("blocks.{i}.attn.hook_q", "blocks.{i}.attn.q", _HEADS_FIRST, layout="positions_first"),
    Alias("blocks.{i}.attn.hook_k", "blocks.{i}.attn.k", _HEADS_FIRST, layout="positions_first"),
    Alias("blocks.{i}.attn.hook_v", "blocks.{i}.attn.v", _HEADS_FIRST, layout="positions_first"),
    Alias("blocks.{i}.attn.hook_q_normed", "blocks.{i}.attn.q_norm", "QK-norm only; " + _HEADS_FIRST,
          layout="positions_first"),
    Alias("blocks.{i}.attn.hook_k_normed", "blocks.{i}.attn.k_norm", "QK-norm only; " + _HEADS_FIRST,
          layout="positions_first"),
    Alias("blocks.{i}.attn.q_norm.hook_normalized", None, _QK_NORM_TL3.format(q="q")),
    Alias("blocks.{i}.attn.k_norm.hook_normalized", None, _QK_NORM_TL3.format(q="k")),
    Alias("blocks.{i}.attn.q_norm.hook_scale", None, _QK_NORM_TL3.format(q="q")),
    Alias("blocks.{i}.attn.k_norm.hook_scale", None, _QK_NORM_TL3.format(q="k")),
    Alias("blocks.{i}.attn.hook_rot_q", "blocks.{i}.attn.rot_q", "rotary positions only; " + _HEADS_FIRST,
          layout="positions_first"),
    Alias("blocks.{i}.attn.hook_rot_k", "blocks.{i}.attn.rot_k", "rotary positions only; " + _HEADS_FIRST,
          layout="positions_first"),
    Alias("blocks.{i}.attn.hook_attn_scores", "blocks.{i}.attn.scores",
          "(B, h, T, T), -inf where masked, in both"),
    Alias("blocks.{i}.attn.hook_pattern", "blocks.{i}.attn.weights", "(B, h, T, T) in both"),
    Alias("blocks.{i}.attn.hook_z", "blocks.{i}.attn.z", "(B, T, h, d_head) in both"),
    Alias("blocks.{i}.attn.hook_result", "blocks.{i}.attn.result",
          "(B, T, h, d_model) in both, without Wo's bias"),
    Alias("blocks.{i}.hook_attn_out", "blocks.{i}.attn.out", "on the sandwich block (Gemma 2, 3) the row "
          "below", unlike_when="sandwich_norms"),
    Alias("blocks.{i}.hook_attn_out", "blocks.{i}.ln1_out", "the sandwich block (Gemma 2, 3): after "
          "TransformerLens' ln1_post, what is added to the stream", only_when="sandwich_norms"),
    Alias("blocks.{i}.ln1_post.hook_scale", "blocks.{i}.ln1_out.scale", "sandwich norm; " + _LN_SCALE),
    Alias("blocks.{i}.ln1_post.hook_normalized", "blocks.{i}.ln1_out.normalized",
          "sandwich norm; " + _LN_BEFORE_AFFINE),
    Alias("blocks.{i}.hook_resid_mid", "blocks.{i}.resid_mid"),
    Alias("blocks.{i}.hook_mlp_in", None,
          _COPY.format(what="the MLP", flag="use_hook_mlp_in", stage="resid_mid", alt="ln2 in pre-norm")),
    Alias("blocks.{i}.ln2.hook_scale", "blocks.{i}.ln2.scale", _LN_SCALE + _OUTPUT_NORM,
          unlike_when="output_norms_only"),
    Alias("blocks.{i}.ln2.hook_normalized", "blocks.{i}.ln2.normalized", _LN_BEFORE_AFFINE + _OUTPUT_NORM,
          unlike_when="output_norms_only"),
    Alias("blocks.{i}.ln2.hook_scale", "blocks.{i}.ln2_out.scale", _ON_OUTPUT, only_when="output_norms_only"),
    Alias("blocks.{i}.ln2.hook_normalized", "blocks.{i}.ln2_out.normalized", _ON_OUTPUT,
          only_when="output_norms_only"),
    Alias("blocks.{i}.mlp.hook_pre", "blocks.{i}.ffn.hidden", "gated: the gate's pre-activation in both"),
    Alias("blocks.{i}.mlp.hook_pre_linear", "blocks.{i}.ffn.linear", "gated: the linear branch, x W3 + b3"),
    Alias("blocks.{i}.mlp.hook_mid", None, "SoLU's LayerNorm input: blocklab has no SoLU"),
    Alias("blocks.{i}.mlp.hook_post", "blocks.{i}.ffn.act"),
    Alias("blocks.{i}.mlp.hook_expert_weights", None, "a mixture's softmax of the router logits over all E "
          "experts before top-k, (B T, E): blocklab has the logits, blocks.{i}.ffn.router_logits (B, T, E), "
          "and the k weights each chosen expert's output is multiplied by, blocks.{i}.ffn.expert_weights"),
    Alias("blocks.{i}.mlp.hook_expert_indices", "blocks.{i}.ffn.expert_indices", "a mixture's k experts per "
          "token: (B T, k) under this name, as TransformerLens; blocklab's own name gives (B, T, k)",
          layout="positions_flat"),
    Alias("blocks.{i}.mlp.experts.{e}.hook_gate", "blocks.{i}.ffn.experts.{e}.hidden",
          "an expert's gate pre-activation on its tokens, (N_e, d_ff) in both, the same rows"),
    Alias("blocks.{i}.mlp.experts.{e}.hook_pre", "blocks.{i}.ffn.experts.{e}.linear",
          "an expert's linear branch (TransformerLens' expert names it hook_pre), (N_e, d_ff)"),
    Alias("blocks.{i}.mlp.experts.{e}.hook_post", "blocks.{i}.ffn.experts.{e}.act",
          "an expert's act(gate) * linear, (N_e, d_ff)"),
    Alias("blocks.{i}.hook_mlp_out", "blocks.{i}.ffn.out", "on the sandwich block (Gemma 2, 3) the row "
          "below", unlike_when="sandwich_norms"),
    Alias("blocks.{i}.hook_mlp_out", "blocks.{i}.ln2_out", "the sandwich block (Gemma 2, 3): after "
          "TransformerLens' ln2_post, what is added to the stream", only_when="sandwich_norms"),
    Alias("blocks.{i}.ln2_post.hook_scale", "blocks.{i}.ln2_out.scale", "sandwich norm; " + _LN_SCALE),
    Alias("blocks.{i}.ln2_post.hook_normalized", "blocks.{i}.ln2_out.normalized",
          "sandwich norm; " + _LN_BEFORE_AFFINE),
    Alias("blocks.{i}.hook_resid_post", "blocks.{i}.resid_post"),
    Alias("blocks.{i}.hook_normalized_resid_post", "blocks.{i}.ln2",
          "HookedEncoder (post-norm): the block output", names_stage=False, only_in=ENCODER),
    Alias("ln_final.hook_scale", "ln_f.scale", _LN_SCALE),
    Alias("ln_final.hook_normalized", "ln_f.normalized", _LN_BEFORE_AFFINE),
    Alias("mlm_head.ln.hook_scale", None, _MLM_HEAD, only_in=ENCODER),
    Alias("mlm_head.ln.hook_normalized", None, _MLM_HEAD, only_in=ENCODER),
    Alias("unembed.hook_in", "ln_f", "what the head reads: the final hidden state; refused on a "
          "bidirectional model (causal=False), where TransformerLens' (HookedEncoder's) is the output of its "
          "MLM head, which blocklab's has not", unlike_in=ENCODER),
    Alias("unembed.hook_out", "logits", "the head's output; with a logit soft-cap (Gemma 2) the row below; "
          "refused on a bidirectional model (causal=False), where TransformerLens' (HookedEncoder's) is its "
          "MLM head's logits", unlike_when="logit_softcap", unlike_in=ENCODER),
    Alias("unembed.hook_out", "head.uncapped", "a logit soft-cap (Gemma 2): the logits before the cap, as "
          "TransformerLens' (its cap follows the hook); blocklab's logits are after it",
          only_when="logit_softcap", only_in=DECODER),
)


def _alias_pattern(template: str) -> re.Pattern[str]:
    """``blocks.{i}.hook_resid_pre`` -> a regex matching it with any layer (a number or a glob), and any
    expert for ``{e}``."""
    pattern = re.escape(template)
    for index in _INDICES.values():
        pattern = pattern.replace(re.escape("{" + index + "}"), rf"(?P<{index}>[^.]+)")
    return re.compile(pattern + "$")


_INDICES = {"blocks": "i", "experts": "e"}  # the part a number follows -> its place in a template


_ALIASES = [(_alias_pattern(a.transformerlens), a) for a in TRANSFORMERLENS_ALIASES]
_USUAL = [a for a in TRANSFORMERLENS_ALIASES if not a.only_when]  # the rows of every model
# TransformerLens's short names for cache[name, layer] (utils.get_act_name): the hook's own name
# ("pattern", "attn_out", "mlp_out", "pre", "post", ...), where it names one stage of a block (an expert's
# hooks have none: get_act_name gives no expert)
_BLOCK_ROWS = [a for a in _USUAL
               if a.transformerlens.startswith("blocks.{i}.") and "{e}" not in a.transformerlens]
_SHORT_NAMES: dict[str, str] = {  # short name -> TransformerLens' full name ("blocks.{i}.attn.hook_pattern")
    short: a.transformerlens
    for a in _BLOCK_ROWS if a.blocklab
    for short in [a.transformerlens.rsplit(".", 1)[1].removeprefix("hook_")]
    if sum(b.transformerlens.endswith(f".hook_{short}") for b in _BLOCK_ROWS) == 1
}
# ... -> the stage in a block it reads on most models (short_alias: on a given one)
SHORT_ALIASES: dict[str, str] = {short: blocklab_name_usual.removeprefix("blocks.{i}.")
                                 for short, full in _SHORT_NAMES.items()
                                 for blocklab_name_usual in [next(a.blocklab for a in _USUAL
                                                                  if a.transformerlens == full)]}


def short_alias(short: str, config: object | None) -> str | None:
    """The stage in a block (``attn.out``) that TransformerLens' short name (``attn_out``) means on a model
    of ``config`` (``blocklab_name``'s rows and refusals), or None where it is no short name."""
    if short not in _SHORT_NAMES:
        return None
    return blocklab_name(_SHORT_NAMES[short].format(i=0), config).removeprefix("blocks.0.")


# blocklab stage (with {i}) -> TransformerLens' name for it: the first alias naming that stage
_TL_NAMES = {a.blocklab: a.transformerlens for a in reversed(_USUAL) if a.blocklab and a.names_stage}
# blocklab stages (with {i}) that TransformerLens lays out otherwise under its name -> that layout
_LAYOUT_OF = {a.blocklab: a.layout for a in TRANSFORMERLENS_ALIASES if a.layout}


def _template(name: str) -> tuple[str, dict[str, str]]:
    """``blocks.3.ffn.experts.1.act`` -> (``blocks.{i}.ffn.experts.{e}.act``, {"i": "3", "e": "1"}); a stage
    outside the blocks unchanged."""
    parts, indices = name.split("."), {}
    for j in range(1, len(parts) - 1):
        index = _INDICES.get(parts[j - 1])
        if index and index not in indices and parts[j].isdigit():
            indices[index], parts[j] = parts[j], "{" + index + "}"
    return ".".join(parts), indices


def heads_swapped(tensor: Tensor) -> Tensor:
    """(..., h, T, d) <-> (..., T, h, d): a view, so an in-place edit lands in the stage itself."""
    return tensor.transpose(-3, -2)


# TransformerLens' layouts of a stage that differ from blocklab's: (blocklab's -> TransformerLens', and
# TransformerLens' back to blocklab's given blocklab's tensor), views where torch can, so that an in-place
# edit lands in the stage itself
TRANSFORMERLENS_LAYOUTS: dict[str, tuple[Callable[[Tensor], Tensor], Callable[[Tensor, Tensor], Tensor]]] = {
    # (B, h, T, d_k) <-> (B, T, h, d_head): q, k, v, their normed and rotated forms
    "positions_first": (heads_swapped, lambda t, ours: heads_swapped(t)),
    # (B, T, k) <-> (B T, k): TransformerLens' mixture flattens the positions
    "positions_flat": (lambda t: t.reshape(-1, t.shape[-1]), lambda t, ours: t.reshape(ours.shape)),
}


def relaid_for_transformerlens(stage: str) -> bool:
    """Whether TransformerLens' name for blocklab's ``stage`` lays it out otherwise (q, k, v as
    (B, T, h, d_head), a mixture's expert indices as (B T, k)). Asked by that name (or a glob written as
    TransformerLens writes names), the cache and the hooks give TransformerLens' layout."""
    return _template(stage)[0] in _LAYOUT_OF


def in_transformerlens_view(stage: str, tensor: Tensor) -> Tensor:
    """blocklab's ``stage`` tensor in TransformerLens' layout (unchanged where the two agree)."""
    layout = _LAYOUT_OF.get(_template(stage)[0])
    return TRANSFORMERLENS_LAYOUTS[layout][0](tensor) if layout else tensor


def in_transformerlens_layout(fn: HookFn, stage: str) -> HookFn:
    """``fn`` as TransformerLens would call it on ``stage``: it receives the stage in TransformerLens'
    layout, and what it returns is laid back out as blocklab's."""
    layout = _LAYOUT_OF.get(_template(stage)[0])
    if not layout:
        return fn
    to_theirs, to_ours = TRANSFORMERLENS_LAYOUTS[layout]

    def relaid(x: Tensor, hook: str) -> Tensor | None:
        out = fn(to_theirs(x), hook)
        return None if out is None else to_ours(out, x)

    return relaid


def _applies(alias: Alias, config: object | None) -> bool:
    """Whether ``alias`` is TransformerLens' name for its stage on a model of ``config``: causal (or no
    config) HookedTransformer's names, else HookedEncoder's; none where a flag in ``unlike_when`` is set
    or the model class is ``unlike_in`` (another tensor there)."""
    only = not alias.only_when or bool(getattr(config, alias.only_when, False))
    return alias.only_in in (None, _kind(config)) and only and not _unlike(alias, config)


def _kind(config: object | None) -> str:
    """TransformerLens' model class for a model of ``config``: HookedTransformer if causal (or no config)."""
    return DECODER if getattr(config, "causal", True) else ENCODER


def _unlike(alias: Alias, config: object | None) -> str:
    """Why TransformerLens' model of ``config`` means another tensor by ``alias``'s name ("" where it means
    blocklab's): the flag set (``unlike_when``) or the model class (``unlike_in``)."""
    if alias.unlike_when and getattr(config, alias.unlike_when, False):
        return f"{alias.unlike_when}=True"
    return f"TransformerLens' {alias.unlike_in}" if alias.unlike_in == _kind(config) else ""


def transformerlens_names(name: str, config: object | None) -> list[str]:
    """Every TransformerLens name of a blocklab stage, in the table's order, as TransformerLens' model of
    ``config`` has them (a causal model: HookedTransformer; else HookedEncoder): ``ln_f`` ->
    ``ln_final.hook_normalized``, ``unembed.hook_in``; none for a stage it has no name for, or whose name
    there means another tensor (``hook_embed`` with an embedding norm)."""
    template, indices = _template(name)
    return [a.transformerlens.format(**indices) for a in TRANSFORMERLENS_ALIASES
            if a.blocklab == template and _applies(a, config)]


def transformerlens_name(name: str, config: object | None = None) -> str:
    """TransformerLens' name for a blocklab stage (``blocks.0.attn.weights`` ->
    ``blocks.0.attn.hook_pattern``), or the name itself where TransformerLens has none; with ``config``,
    the name TransformerLens' model of that config has for it (see ``transformerlens_names``)."""
    template, indices = _template(name)
    if config is None:
        found = _TL_NAMES.get(template)
    else:
        found = next((a.transformerlens for a in TRANSFORMERLENS_ALIASES
                      if a.blocklab == template and a.names_stage and _applies(a, config)), None)
    if found is None:
        return name
    return found.format(**indices)


def blocklab_name(name: str, config: object | None = None) -> str:
    """A stage name (or glob) written as TransformerLens or as a hook point's module path, in
    blocklab's words: ``blocks.0.attn.hook_pattern`` -> ``blocks.0.attn.weights``,
    ``blocks.*.hook_resid_pre`` -> ``blocks.*.resid_pre``, ``blocks.0.ffn.hook_out`` ->
    ``blocks.0.ffn.out``. A blocklab name comes back unchanged (none has a ``hook_`` part).

    A TransformerLens name that has no blocklab stage is a ValueError saying why, as is one that
    TransformerLens' model of ``config`` uses for another tensor than blocklab's stage (``unlike_when``,
    ``unlike_in``).
    """
    if "hook_" not in name:
        return name
    unlike = None  # a row whose name means another tensor on this model, if no row for it follows
    for pattern, alias in _ALIASES:
        match = pattern.match(name)
        if match is None or (alias.only_when and not getattr(config, alias.only_when, False)):
            continue
        if alias.blocklab is None:
            raise ValueError(f"{name!r} (TransformerLens) has no blocklab stage: {alias.note}")
        if _unlike(alias, config):
            unlike = unlike or alias
            continue
        return alias.blocklab.format(**match.groupdict())
    if unlike is not None:
        raise ValueError(f"{name!r} (TransformerLens) is another tensor on this model "
                         f"({_unlike(unlike, config)}) than blocklab's {unlike.blocklab!r}: {unlike.note}")
    return stage_name(name)
