"""ModelConfig: one validated dataclass for every block and stack variant (the named presets: presets.py).

Field names are the public API: they are the CLI flags (``--d-model`` / ``--d_model``) and
the keys of a run's ``config.json``. The shape fields default to the ``listops-seed`` preset.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from ..errors import names
from .activation_kinds import ACTIVATION_KINDS
from .attention import QK_NORMS
from .attention_fields import SOFTCAP_FIELDS, attention_violations, is_int, is_positive_number, position_kind
from .ffn_kinds import MOE_FIELDS, ROUTINGS, moe_violations, resolve_d_ff
from .init_schemes import INIT_SCHEMES
from .layouts import LAYOUTS, Layout, block_formula, block_title
from .norm_kinds import NORM_KINDS, NormKind, is_layer_norm
from .position_kinds import POSITION_KINDS
from .residual_kinds import RESIDUAL_KINDS, ResidualKind
from .rotary import ROTARY_STYLES

# One list per variant, next to what chooses among them. The norm kinds are their records' table
# (norm_kinds.NORM_KINDS: the per-position LayerNorm kinds, BatchNorm, no norm).
NORMS = tuple(NORM_KINDS)  # as the package ships it; validation reads the table itself
_NO_NORM = next(name for name, kind in NORM_KINDS.items() if not kind.normalises)  # for messages
NORM_POSITIONS = tuple(LAYOUTS)  # the block layouts (layouts.LAYOUTS: where the norms sit, how it is wired)
RESIDUALS = tuple(RESIDUAL_KINDS)  # residual_kinds.py: one record each
# rotary (rotary.py) and alibi (alibi.py) act inside attention: nothing is added to x0
POS_ENCODINGS = tuple(POSITION_KINDS)
FUSED_CHOICES = (True, False, "auto")
DEFAULT_EPS = 1e-5

# The lean block wiring (block.LEAN_PATHS) exists for these; elsewhere the block runs module by module.
LEAN_NORM_POSITIONS = tuple(name for name, layout in LAYOUTS.items() if layout.lean)
LEAN_RESIDUALS = ("add", "deepnorm")
# fused="auto" takes the lean path from LEAN_MIN_D_MODEL up. On a CPU the lean path is never faster (its
# autograd Functions recompute in backward and carry Python overhead); what it buys is memory: about 40%
# fewer activation bytes per token. So it is taken from the width where its extra time is at most
# LEAN_MAX_TIME_COST of a step in every measured shape and norm position (benchmarks/fused_by_shape.py
# measures both paths across d_model and prints the width this rule gives; docs/performance.md shows it).
LEAN_MAX_TIME_COST = 0.05
LEAN_MIN_D_MODEL = 384
EMBED_SCALES = ("sqrt_d_model", "none")  # the factor on the token embedding (embedding.SCALE_FACTORS)

# The fields that take one of a few names, and those names (validation and the CLI's --help use it).
CHOICES: dict[str, Collection[str]] = {
    "activation": ACTIVATION_KINDS.keys(),  # live, as norm
    "norm": NORM_KINDS.keys(),  # live: a kind added to the table is a choice
    "norm_position": NORM_POSITIONS,
    "residual": RESIDUALS,
    "pos_encoding": POS_ENCODINGS,
    "embed_scale": EMBED_SCALES,
    "rotary_style": ROTARY_STYLES,
    "qk_norm": QK_NORMS,
    "init": tuple(INIT_SCHEMES),
    "router_softmax": ROUTINGS.keys(),
}


@dataclass(frozen=True)
class ModelConfig:
    """Every choice of the stack; validated at construction (ValueError names field, value, rule)."""

    vocab_size: int = 18  # listops vocabulary
    max_seq_len: int = 8
    d_model: int = 64
    n_heads: int = 4
    n_kv_heads: int | None = None  # key/value heads, each shared by n_heads / n_kv_heads queries (None: all)
    head_dim: int | None = None  # each head's width d_k (None: d_model / n_heads; Qwen3-0.6B: 128 of 1024/16)
    n_layers: int = 2
    d_ff: int = 256  # or a ratio times d_model: 4.0, "4x", "8/3x" (resolved to an int)
    activation: str = "relu"
    norm: str = "standard"
    norm_position: str = "post"
    residual: str = "add"
    eps: float = DEFAULT_EPS
    bias: bool = True
    qkv_bias: bool | None = None  # biases on q, k and v (None: as bias; Qwen2 has them, without any other)
    o_bias: bool | None = None  # a bias on attention's output projection (None: as bias; GPT-J has none)
    ffn_bias: bool | None = None  # biases in the FFN's linear layers (None: as bias; StableLM's MLP has none)
    causal: bool = False
    sliding_window: int | None = None  # causal attention to the last N positions only (Mistral); None: all
    # each layer's own window, one per layer, None: that layer global (Gemma 2: 4096 on layers 0, 2, ...)
    layer_windows: tuple[int | None, ...] | None = None
    # a norm (the block's variant) on q and k before the scores: per head (Qwen3) or over all heads
    # (OLMo 2); blocklab/nn/attention.py
    qk_norm: str = "none"
    # Gemma 2 (blocklab/nn/attention.py): the scores cap * tanh(s / cap) after the scale, before the mask; the
    # logits the same after the head; the scores scaled by query_pre_attn_scalar^-1/2 (None: d_head^-1/2)
    attn_softcap: float | None = None
    logit_softcap: float | None = None
    query_pre_attn_scalar: float | None = None
    pos_encoding: str = "sinusoidal"
    # rotary only (blocklab/nn/rotary.py): the share of each head rotated, the base of the frequencies,
    # which features pair up, and Llama 3's frequency scaling
    rotary_fraction: float = 1.0
    rotary_base: float = 10000.0
    rotary_style: str = "half"
    rope_scaling: dict[str, Any] | None = None
    # the base of the layers with a window, unscaled (Gemma 3: 10000 local, 1e6 global); None: rotary_base
    local_rotary_base: float | None = None
    # how big the token part of x0 is next to the position part (blocklab/nn/embedding.py says why)
    embed_scale: str = "sqrt_d_model"  # tok = factor * E[token]: "sqrt_d_model" (Vaswani et al.) or "none"
    embed_std: float = 1.0  # std of the token part at init, after the factor: E ~ N(0, (std/factor)^2)
    pos_std: float | None = None  # learned positions' init std (None: embed_std); learned only
    # an attention mask given to forward sets each row's positions, counted from its first real token
    # (OPT's forward does; GPT-2's, Llama's and BERT's count from 0 whatever the mask, as blocklab's default)
    positions_from_mask: bool = False
    tie_embeddings: bool = False
    head_bias: bool = False  # a bias on the output head (GPT-J, Phi); a tied head keeps its own bias
    final_norm: bool | None = None  # None: as the layout says (off for post-norm, on for the others)
    dropout: float = 0.0
    type_vocab_size: int = 0  # BERT's token-type (segment) embeddings; 0 = none
    embed_norm: bool = False  # a LayerNorm on the embeddings (BERT)
    # memory-lean autograd functions (blocklab/nn/kernels.py), same forward values: true, false, or "auto"
    # (lean from LEAN_MIN_D_MODEL up, where the memory saved costs little time; module by module below)
    fused: bool | str = "auto"
    keep_residual: bool = False  # lean path's speed mode: keep the residual sum (d floats/token) for backward
    checkpoint_blocks: bool = False  # recompute each block in backward: memory flat in depth
    init: str = "torch"  # how the linear weights start (init_schemes.INIT_SCHEMES; why torch: its docstring)
    # a mixture of experts in place of the FFN (blocklab/nn/moe.py): n_experts FFNs of d_ff, each token sent
    # to experts_per_token of them; the other fields apply only with n_experts >= 1 (ffn_kinds.MOE_FIELDS)
    n_experts: int = 0  # 0: one dense FFN
    experts_per_token: int = 2  # k of top-k
    router_softmax: str = "before_top_k"  # ffn_kinds.ROUTINGS: softmax over all E, or over the k largest
    renormalize_top_k: bool = True  # divide the k weights by their sum (Mixtral; Qwen2-MoE does not)
    shared_expert_d_ff: int = 0  # a shared expert every token goes through, behind a sigmoid gate (Qwen2-MoE)
    router_aux_loss_coef: float = 0.01  # the load-balancing loss' weight in training (Switch Transformer)
    # fields that were derived from others (not given): ``replace`` derives them again
    _derived: frozenset[str] = field(default=frozenset(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        set_ = lambda name, value: object.__setattr__(self, name, value)  # frozen
        set_("d_ff", resolve_d_ff(self.d_ff, self.d_model) if isinstance(self.d_model, int) else self.d_ff)
        if isinstance(self.layer_windows, list):  # as JSON gives it back
            set_("layer_windows", tuple(self.layer_windows))
        if isinstance(self.rope_scaling, dict):  # a copy: changing the caller's dict changes no config
            set_("rope_scaling", dict(self.rope_scaling))
        for name in ("eps", "embed_std", "pos_std", "rotary_fraction", "rotary_base", "local_rotary_base",
                     "router_aux_loss_coef", *SOFTCAP_FIELDS):
            value = getattr(self, name)
            if isinstance(value, int) and not isinstance(value, bool):
                set_(name, float(value))
        known = isinstance(self.norm_position, str) and self.norm_position in LAYOUTS
        if self.final_norm is None and known:  # post-norm's last block ends in a norm
            set_("final_norm", LAYOUTS[self.norm_position].final_norm and _normalises(self.norm))
            set_("_derived", frozenset({"final_norm"}))
        for error in _violations(self):
            raise ValueError(error)

    def __hash__(self) -> int:  # rope_scaling is a dict: hash it by its JSON text
        return hash(tuple(json.dumps(v, sort_keys=True) if isinstance(v, dict) else v
                          for v in (getattr(self, name) for name in FIELDS)))

    @property
    def d_head(self) -> int:
        """Per-head width d_k: ``head_dim``, or d_model / n_heads when unset."""
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    @property
    def score_divisor(self) -> tuple[float, str]:
        """What q . k is divided by in every head, and its name: sqrt(d_k), or sqrt(query_pre_attn_scalar)
        (Gemma 2; 1: GPT-Neo's and GPT-BigCode's unscaled scores)."""
        if self.query_pre_attn_scalar is None:
            return math.sqrt(self.d_head), "sqrt(d_k)"
        scalar = self.query_pre_attn_scalar
        return math.sqrt(scalar), f"sqrt(query_pre_attn_scalar = {scalar:g})"

    def window(self, layer: int) -> int | None:
        """Layer ``layer``'s sliding window (``layer_windows``, else ``sliding_window``); None: global."""
        return self.sliding_window if self.layer_windows is None else self.layer_windows[layer]

    def rotary_of(self, layer: int) -> tuple[float, dict[str, Any] | None]:
        """Layer ``layer``'s rotary base and scaling: with a window, ``local_rotary_base`` unscaled where
        it is set (Gemma 3's local layers); else ``rotary_base`` with ``rope_scaling``."""
        if self.local_rotary_base is not None and self.window(layer) is not None:
            return self.local_rotary_base, None
        return self.rotary_base, self.rope_scaling

    @property
    def sandwich_norms(self) -> bool:
        """Whether each sublayer has a norm on its input and one on its output (Gemma 2 and 3's block: what
        TransformerLens calls ln1 and ln1_post, its hook_attn_out after the second)."""
        return {"ln1", "ln1_out"} <= set(LAYOUTS[self.norm_position].norms)

    @property
    def output_norms_only(self) -> bool:
        """Whether each sublayer's one norm is on its output (OLMo 2's block: what TransformerLens calls ln1
        and ln2 there)."""
        norms = LAYOUTS[self.norm_position].norms
        return "ln1_out" in norms and "ln1" not in norms

    @property
    def kv_heads(self) -> int:
        """Key/value heads: ``n_kv_heads``, or one per query head when unset."""
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads

    @property
    def has_qkv_bias(self) -> bool:
        """Whether q, k and v have biases: ``qkv_bias``, or as ``bias`` when unset."""
        return self.bias if self.qkv_bias is None else self.qkv_bias

    @property
    def has_o_bias(self) -> bool:
        """Whether attention's output projection has a bias: ``o_bias``, or as ``bias`` when unset."""
        return self.bias if self.o_bias is None else self.o_bias

    @property
    def has_ffn_bias(self) -> bool:
        """Whether the FFN's (each expert's) linears have biases: ``ffn_bias``, or as ``bias`` if unset."""
        return self.bias if self.ffn_bias is None else self.ffn_bias

    @property
    def _block_kinds(self) -> tuple[Layout, ResidualKind, NormKind]:
        return LAYOUTS[self.norm_position], RESIDUAL_KINDS[self.residual], NORM_KINDS[self.norm]

    @property
    def block_title(self) -> str:
        """The block in words, from its layout, residual kind and norm kind ("pre-norm, ReZero")."""
        return block_title(*self._block_kinds)

    @property
    def block_formula(self) -> str:
        """The block as math, headed by its title: ``post-norm, no residual: y = LN1(MHA(x)), ...``."""
        return f"{self.block_title}: {block_formula(*self._block_kinds)}"

    @property
    def uses_lean_path(self) -> bool:
        """Whether each block runs its lean wiring (kernels.py) rather than module by module."""
        wired = (self.norm_position in LEAN_NORM_POSITIONS and self.residual in LEAN_RESIDUALS
                 and is_layer_norm(self.norm) and self.dropout == 0 and self.n_experts == 0)
        return wired and self.components_fused

    @property
    def components_fused(self) -> bool:
        """``fused`` resolved: "auto" is true from LEAN_MIN_D_MODEL up."""
        return self.d_model >= LEAN_MIN_D_MODEL if self.fused == "auto" else bool(self.fused)

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed (validated again); fields this config derived (final_norm
        left unset) are derived again, so ``replace(norm_position="pre")`` gets pre-norm's final norm;
        a learned table's ``pos_std`` goes with it (``changed_from``)."""
        kept = {k: v for k, v in self.to_dict().items() if k not in self._derived}
        return from_dict(changed_from(kept, changes))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field."""
        return {name: getattr(self, name) for name in FIELDS}


FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(ModelConfig) if f.init)
# Fields whose unset value (None) stands for one derived from other fields, and the property resolving
# it: two configs whose fields resolve alike build the same model (n_kv_heads=None and n_kv_heads=n_heads).
RESOLVED_BY: dict[str, str] = {"n_kv_heads": "kv_heads", "qkv_bias": "has_qkv_bias", "o_bias": "has_o_bias",
                               "ffn_bias": "has_ffn_bias", "head_dim": "d_head"}


def resolved(config: ModelConfig, name: str) -> Any:
    """Field ``name`` of ``config`` as the model is built with it (``RESOLVED_BY``: unset resolved)."""
    return getattr(config, RESOLVED_BY.get(name, name))


def _violations(c: ModelConfig) -> list[str]:
    """Every rule the config breaks, as messages naming field, value and what is allowed."""
    errors: list[str] = []

    def need(ok: bool, message: str) -> None:
        if not ok:
            errors.append(f"ModelConfig.{message}")

    for name in ("vocab_size", "max_seq_len", "d_model", "n_heads", "n_layers", "d_ff"):
        value = getattr(c, name)
        need(is_int(value) and value >= 1, f"{name}={value!r} must be an integer >= 1")
    if errors:
        return errors
    if c.head_dim is None:
        need(c.d_model % c.n_heads == 0, f"n_heads={c.n_heads} must divide d_model={c.d_model} "
             "(or set head_dim: each head's width)")
    else:
        need(is_int(c.head_dim) and c.head_dim >= 1,
             f"head_dim={c.head_dim!r} must be an integer >= 1 (or unset: d_model / n_heads)")
    if errors:
        return errors
    for name, allowed in CHOICES.items():
        value = getattr(c, name)
        need(isinstance(value, str) and value in allowed,  # (a list is no key of a table: TypeError)
             f"{name}={value!r} is not one of: {', '.join(allowed)}")
    need(isinstance(c.eps, float) and math.isfinite(c.eps) and c.eps > 0,
         f"eps={c.eps!r} must be a finite number > 0")
    need(is_positive_number(c.embed_std), f"embed_std={c.embed_std!r} must be a finite number > 0")
    if c.pos_std is not None:
        need(is_positive_number(c.pos_std), f"pos_std={c.pos_std!r} must be a finite number > 0 (or unset)")
        need(getattr(position_kind(c), "learned", False),
             f"pos_std={c.pos_std!r} initialises learned positions, but pos_encoding={c.pos_encoding!r} "
             "has none: leave pos_std unset or use pos_encoding='learned'")
    for name in ("bias", "causal", "tie_embeddings", "head_bias", "final_norm", "embed_norm",
                 "positions_from_mask", "keep_residual", "checkpoint_blocks"):
        value = getattr(c, name)
        need(isinstance(value, bool), f"{name}={value!r} must be true or false")
    attention_violations(c, need)
    need(isinstance(c.fused, bool) or c.fused == "auto", f"fused={c.fused!r} must be true, false or 'auto'")
    need(
        isinstance(c.dropout, (int, float)) and not isinstance(c.dropout, bool) and 0 <= c.dropout < 1,
        f"dropout={c.dropout!r} must be a number in [0, 1)",
    )
    need(is_int(c.type_vocab_size) and c.type_vocab_size >= 0,
         f"type_vocab_size={c.type_vocab_size!r} must be an integer >= 0")
    _residual_violations(c, need)
    for message in moe_violations(c.n_experts, {name: getattr(c, name) for name in MOE_FIELDS}):
        need(False, message)
    if not errors:  # the rules across fields read fields already known to be valid
        _inapplicable_fields(c, need)
    return errors


def _residual_violations(c: ModelConfig, need: Callable[[bool, str], None]) -> None:
    """ReZero has no norm; DeepNorm normalises the stream after each connection."""
    if c.residual == "rezero":
        need(not _normalises(c.norm),
             f"residual='rezero' uses no LayerNorm, so norm={c.norm!r} must be {_NO_NORM!r}")
    if c.residual == "deepnorm":
        on_stream = [name for name, layout in LAYOUTS.items() if layout.norm_on_stream]
        need(c.norm_position in on_stream, "residual='deepnorm' normalizes the residual stream after each "
             f"connection, so norm_position={c.norm_position!r} must be one that does: "
             + ", ".join(map(repr, on_stream)))
        need(_normalises(c.norm),
             f"residual='deepnorm' normalizes after each residual, so norm={c.norm!r} is not allowed")


def _inapplicable_fields(c: ModelConfig, need: Callable[[bool, str], None]) -> None:
    """A field that cannot apply to the chosen variant is refused, never ignored."""
    if not _normalises(c.norm):
        need(not c.embed_norm, f"embed_norm=True needs a norm, but norm={c.norm!r}")
        need(not c.final_norm, f"final_norm=True needs a norm, but norm={c.norm!r}")
        need(c.eps == DEFAULT_EPS, f"eps={c.eps!r} has no effect with norm={c.norm!r} (no norm uses it)")
    if c.keep_residual:
        need(c.uses_lean_path, "keep_residual=True keeps the lean path's residual sum, but "
             + _why_no_lean_path(c))
    if c.residual == "deepnorm":
        default = ModelConfig.__dataclass_fields__["init"].default
        need(c.init == default, f"init={c.init!r} would be overwritten: residual='deepnorm' draws its "
             f"blocks' weights itself (Xavier scaled by beta); leave init {default!r}")


def _normalises(norm: object) -> bool:
    """Whether the norm kind ``norm`` normalises (a name no kind has counts as one: refused elsewhere)."""
    kind = NORM_KINDS.get(norm) if isinstance(norm, str) else None
    return kind is None or kind.normalises


def _why_no_lean_path(c: ModelConfig) -> str:
    """Why ``c`` runs its blocks module by module (for messages)."""
    if c.norm_position not in LEAN_NORM_POSITIONS:
        return f"norm_position={c.norm_position!r} has no lean wiring (only {', '.join(LEAN_NORM_POSITIONS)})"
    if c.residual not in LEAN_RESIDUALS:
        return f"residual={c.residual!r} has no lean wiring (only {', '.join(LEAN_RESIDUALS)})"
    if not is_layer_norm(c.norm):
        return f"norm={c.norm!r} has no lean wiring (only the LayerNorm variants)"
    if c.dropout:
        return f"dropout={c.dropout!r} has no lean wiring (only dropout 0)"
    if c.n_experts:
        return f"n_experts={c.n_experts!r} has no lean wiring (a mixture of experts runs module by module)"
    if c.fused == "auto":
        return (f"fused='auto' runs d_model={c.d_model} module by module (lean from {LEAN_MIN_D_MODEL}); "
                "set fused=true")
    return "fused=False"


# Fields added after blocklab first saved configs, and the value every model saved before then was
# built with: a checkpoint's config without the field describes a model with this value.
SAVED_BEFORE: dict[str, Any] = {"embed_scale": "none", "embed_std": 0.02, "init": "default"}


def from_saved_dict(d: dict[str, Any]) -> ModelConfig:
    """A config read back from a file blocklab wrote: fields the file predates take the value its
    model was built with (``SAVED_BEFORE``), not today's defaults."""
    return from_dict({**SAVED_BEFORE, **d})


def changed_from(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``changes``; a ``pos_std`` of base's learned positions goes when the changes
    take the learned table away without giving a pos_std (gpt2's 0.01 describes its learned table)."""
    value = changes.get("pos_encoding")  # None: the changes keep base's positions
    kind = POSITION_KINDS.get(value) if isinstance(value, str) else None
    if kind is not None and not kind.learned and "pos_std" not in changes:
        base = {k: v for k, v in base.items() if k != "pos_std"}
    return {**base, **changes}


def from_dict(d: dict[str, Any]) -> ModelConfig:
    """Build a config from a dict, rejecting unknown keys by name."""
    unknown = set(d) - set(FIELDS)
    if unknown:
        raise ValueError(f"ModelConfig has no field {names(unknown)}; fields are: {', '.join(FIELDS)}")
    return ModelConfig(**d)
