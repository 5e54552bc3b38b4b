"""The transformer block: residual wiring around attention and the FFN
(docs/concepts.md#residual-connection and #the-block).

Post-norm (original, BERT):          Pre-norm (GPT-2):
    y = LN1(x + MHA(x))                  y = x + MHA(LN1(x))
    z = LN2(y + FFN(y))                  z = y + FFN(LN2(y))

Every layout (these two, sandwich, the parallel blocks) is a row of ``layouts.LAYOUTS``: its steps in
forward order. The residual combine is ``add`` (x + F), ``rezero`` (x + a F, a learned, init 0),
``deepnorm`` (alpha x + F, then the post-norm LN) or ``none`` (F alone).

Two paths compute a block:

- the **module path** interprets the layout's steps, module by module: every stage is a tensor that
  an intervention (``hooks``) may replace. The block owns a norm module per ``Norm`` step, a
  ``Residual`` per ``Sum`` and a hook point per stage, all named as the table names them.
- a **lean path** (``LEAN_PATHS``, registered under a layout's name: pre and post): the same block
  from the memory-lean kernels of kernels.py, which keep inputs and recompute the rest in
  backward. It computes the module path's forward values bit for bit (the kernels use the same ops
  in the same order); observers see every stage, the ones it does not materialise computed beside
  it (``HookPoint.observe``).

Variants are chosen once, at construction; ``forward`` only decides lean or module path: lean
where the config has a lean wiring (``ModelConfig.uses_lean_path``), unless an intervention is
attached or a KV cache is in use (generation).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .attention import KVCache, MultiHeadAttention
from .config import ModelConfig
from .feedforward import FeedForward
from .hooked import HookedModule
from .hooks import HookPoint, any_attached, any_intervention, hook_points, name_hook_points
from .kernels import norm_linear, residual_norm_linear, residual_sum
from .layouts import LAYOUTS, Norm, Sublayer, Sum
from .moe import MixtureOfExperts
from .norms import build_norm
from .position_kinds import POSITION_KINDS
from .rotary import Angles

# ---- the residual combine ---------------------------------------------------------------------


def deepnorm_alpha(n_layers: int) -> float:
    """DeepNet's residual scale alpha = (2N)^(1/4) for an N-layer encoder."""
    return (2 * n_layers) ** 0.25


def deepnorm_beta(n_layers: int) -> float:
    """DeepNet's branch init scale beta = (8N)^(-1/4) for an N-layer encoder."""
    return (8 * n_layers) ** -0.25


class Residual(nn.Module):
    """out = combine(x, F(x)): ``add``, ``rezero`` (key ``scale``), ``deepnorm`` or ``none``."""

    def __init__(self, kind: str = "add", n_layers: int = 1) -> None:
        super().__init__()
        combines: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
            "add": lambda x, f: residual_sum(x, f),
            "rezero": lambda x, f: x + self.scale * f,
            "deepnorm": lambda x, f: residual_sum(x, f, self.alpha),
            "none": lambda x, f: f,
        }
        if kind not in combines:
            raise ValueError(f"Residual kind={kind!r} is not one of: {', '.join(combines)}")
        self.kind = kind
        self.scale = nn.Parameter(torch.zeros(())) if kind == "rezero" else None
        self.alpha = deepnorm_alpha(n_layers) if kind == "deepnorm" else 1.0
        self._combine = combines[kind]

    def forward(self, x: Tensor, branch: Tensor) -> Tensor:  # (B, T, d_model) each
        return self._combine(x, branch)

    def coefficients(self) -> tuple[float | Tensor, float | Tensor]:
        """(a, b) with combine(x, F) = a x + b F: what the activation cache's decomposition of the
        residual stream multiplies each part by."""
        return {"add": (1.0, 1.0), "rezero": (1.0, self.scale), "deepnorm": (self.alpha, 1.0),
                "none": (0.0, 1.0)}[self.kind]

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}" + (f", alpha={self.alpha:.4f}" if self.kind == "deepnorm" else "")


# ---- the block ----------------------------------------------------------------------------------


class TransformerBlock(HookedModule):
    """One block, wired as ``layouts.LAYOUTS[config.norm_position]`` says: submodules ``attn``, ``ffn``,
    one norm per ``Norm`` step (``ln1``, ``ln2``; sandwich adds ``ln1_out``, ``ln2_out``; the shared
    parallel block has ``ln1`` only) and one ``Residual`` per ``Sum`` (``res1``, ``res2``). Stages:
    ``resid_pre``, then each step's (``attn.*``, ``ffn.*`` for the sublayers), in forward order.
    """

    def __init__(self, config: ModelConfig, layer: int = 0) -> None:
        """``layer``: the block's place in the stack (its window, ``ModelConfig.window``)."""
        super().__init__()
        c = self.config = config
        self.layout = LAYOUTS[c.norm_position]
        fused, positions = c.components_fused, POSITION_KINDS[c.pos_encoding]
        self.attn = MultiHeadAttention(
            c.d_model, c.n_heads, causal=c.causal, bias=c.bias, dropout=c.dropout, fused=fused,
            n_kv_heads=c.n_kv_heads, qkv_bias=c.qkv_bias, o_bias=c.o_bias, rotary=positions.rotary,
            sliding_window=c.window(layer), qk_norm=c.qk_norm, norm=c.norm, eps=c.eps, d_head=c.head_dim,
            alibi=positions.alibi, softcap=c.attn_softcap,
            scale=None if c.query_pre_attn_scalar is None else c.query_pre_attn_scalar ** -0.5)
        self.ffn = FeedForward(c.d_model, c.d_ff, c.activation, bias=c.has_ffn_bias, dropout=c.dropout,
                               fused=fused) \
            if not c.n_experts else MixtureOfExperts(
                c.d_model, c.d_ff, c.activation, c.n_experts, c.experts_per_token, c.router_softmax,
                c.renormalize_top_k, c.shared_expert_d_ff, bias=c.has_ffn_bias, dropout=c.dropout,
                fused=fused)
        for norm in self.layout.norms:
            setattr(self, norm, build_norm(c.norm, c.d_model, c.eps, c.bias, fused=fused))
        for residual in self.layout.residuals:
            setattr(self, residual, Residual(c.residual, c.n_layers))
        self.hook_resid_pre = HookPoint()
        for step in self.layout.steps:
            if not isinstance(step, Sublayer):  # a sublayer's stages are its own hook points
                setattr(self, f"hook_{step.name}", HookPoint())
        self.keep_residual = c.keep_residual  # the lean path's speed mode (kernels.py ledger)
        self._lean_path = LEAN_PATHS[c.norm_position] if c.uses_lean_path else None
        name_hook_points(self)
        self._points = list(hook_points(self).values())

    @property
    def mlp(self) -> FeedForward | MixtureOfExperts:
        """TransformerLens' name for the FFN (``ffn``)."""
        return self.ffn

    def hook_names(self) -> list[str]:
        """Every stage name, in the order a forward pass reaches them (the layout's order)."""
        inner = {"attn": self.attn.stages, "ffn": self.ffn.stages}
        return self.layout.stages(inner | {norm: getattr(self, norm).STAGES for norm in self.layout.norms})

    # -- the module path: the layout's steps, every stage a tensor ------------------------------

    def _module_path(self, x: Tensor, mask: Tensor | None, cache: KVCache | None = None,
                     angles: Angles | None = None) -> Tensor:
        stages = {"resid_pre": self.hook_resid_pre(x)}  # stage name -> tensor, filled in forward order
        pad = _positions(mask, x)
        for step in self.layout.steps:
            stage, value = STEPS[type(step)](self, step, stages, mask, pad, cache, angles)
            stages[stage] = value
        return stages[self.layout.output]

    # -- which path -----------------------------------------------------------------------------

    @property
    def uses_lean_path(self) -> bool:
        """Whether the next plain forward (no intervention, no KV cache) takes the lean path."""
        return self._lean_path is not None and self.attn.use_fast_path and not any_intervention(self._points)

    def forward(
        self, x: Tensor, key_padding_mask: Tensor | None = None, kv_cache: KVCache | None = None,
        angles: Angles | None = None,
    ) -> Tensor:  # (B, T, d_model)
        """key_padding_mask: bool (B, T), True where the token is padding. kv_cache: generation only.
        angles: with rotary positions, the cos and sin of x's positions (``Rotary.angles``)."""
        lean = kv_cache is None and self.uses_lean_path
        if self.config.checkpoint_blocks and kv_cache is None and torch.is_grad_enabled() \
                and not any_attached(self._points):
            # keep only x; the block is recomputed in backward, on the path chosen now (never with
            # hooks attached: the recompute would run them a second time)
            return checkpoint(self._run, x, key_padding_mask, None, lean, angles, use_reentrant=False)
        return self._run(x, key_padding_mask, kv_cache, lean, angles)

    def _run(self, x: Tensor, mask: Tensor | None, cache: KVCache | None, lean: bool,
             angles: Angles | None = None) -> Tensor:
        return self._lean_path(self, x, mask, angles) if lean else self._module_path(x, mask, cache, angles)


# ---- the module path's steps: a function per kind of step, (block, step, stages so far) -> stage --
# Module-level functions of the block (not closures over it), so a copied block runs its own modules.


def _norm(block: TransformerBlock, step: Norm, stages: dict[str, Tensor], mask: Tensor | None,
          pad: Tensor | None, cache: KVCache | None, angles: Angles | None) -> tuple[str, Tensor]:
    return step.name, getattr(block, f"hook_{step.name}")(getattr(block, step.name)(stages[step.reads], pad))


def _sublayer(block: TransformerBlock, step: Sublayer, stages: dict[str, Tensor], mask: Tensor | None,
              pad: Tensor | None, cache: KVCache | None, angles: Angles | None) -> tuple[str, Tensor]:
    x = stages[step.reads]
    return step.out, block.attn(x, mask, cache, angles) if step.name == "attn" else block.ffn(x)


def _sum(block: TransformerBlock, step: Sum, stages: dict[str, Tensor], mask: Tensor | None,
         pad: Tensor | None, cache: KVCache | None, angles: Angles | None) -> tuple[str, Tensor]:
    first, *rest = step.branches
    branch = stages[first]
    for other in rest:  # the parallel block: the branches' sum, in the layout's order
        branch = branch + stages[other]
    total = getattr(block, step.residual)(stages[step.x], branch)
    return step.name, getattr(block, f"hook_{step.name}")(total)


STEPS: dict[type, Callable[..., tuple[str, Tensor]]] = {Norm: _norm, Sublayer: _sublayer, Sum: _sum}


# ---- the lean paths: the kernels of kernels.py, same forward values ------------------------------
# Observers see a stage the kernels return but whose gradient they do not carry whole (the sum
# y, LN2(y): the rest of their gradient stays inside ResidualNormLinear) as a detached tensor.


def _pre_lean(block: TransformerBlock, x: Tensor, mask: Tensor | None, angles: Angles | None
              ) -> Tensor:  # (B, T, d_model)
    """y = x + MHA(LN1(x)); z = y + FFN(LN2(y)), keeping 9d + H floats per token (10d + H with
    keep_residual) for backward."""
    attn, ffn, ln1, ln2 = block.attn, block.ffn, block.ln1, block.ln2
    x = block.hook_resid_pre(x)
    ln1.observe_stages(x)
    block.hook_ln1.observe(lambda: ln1.normalize(x))
    q, k, v = norm_linear(x, ln1.kernel, ln1.gamma, ln1.bias, attn.qkv_weights(), attn.qkv_bias())
    c = attn.context(*attn.split_heads(q, k, v, angles), mask)[0]  # (B, T, d): heads concatenated, before o
    attn.observe_output(c)
    y, z, *h = residual_norm_linear(
        x, c, attn.o.weight, attn.o.bias, block.res1.alpha, ln2.kernel, ln2.gamma, ln2.bias,
        ffn.in_weights(), ffn.in_bias(), keep_sum=block.keep_residual,
    )  # y = x + o(c): resid_mid; z = LN2(y); h = W1 z + b1: ffn.hidden
    block.hook_resid_mid.see(y.detach())
    ln2.observe_stages(y)
    block.hook_ln2.see(z.detach())
    return block.hook_resid_post(block.res2(y, ffn.from_hidden(*h)))


def _post_lean(block: TransformerBlock, x: Tensor, mask: Tensor | None, angles: Angles | None
               ) -> Tensor:  # (B, T, d_model)
    """y = LN1(x + MHA(x)); z = LN2(y + FFN(y)), keeping 10d + H + 2 floats per token (LN2 keeps
    its input, mean and rstd; 11d + H + 2 with keep_residual) for backward."""
    attn, ffn, ln1 = block.attn, block.ffn, block.ln1
    x = block.hook_resid_pre(x)
    q, k, v = norm_linear(x, None, None, None, attn.qkv_weights(), attn.qkv_bias())
    c = attn.context(*attn.split_heads(q, k, v, angles), mask)[0]
    attn.observe_output(c)
    s, y, *h = residual_norm_linear(
        x, c, attn.o.weight, attn.o.bias, block.res1.alpha, ln1.kernel, ln1.gamma, ln1.bias,
        ffn.in_weights(), ffn.in_bias(), keep_sum=block.keep_residual,
    )  # s = alpha x + o(c): resid_mid; y = LN1(s); h = W1 y + b1
    block.hook_resid_mid.see(s.detach())
    ln1.observe_stages(s)
    block.hook_ln1.see(y.detach())
    out = block.hook_resid_post(block.res2(y, ffn.from_hidden(*h)))
    return block.hook_ln2(block.ln2(out))  # LN2 keeps its input, mean and rstd: d + 2 more


# The lean wirings, by layout name: each layout whose table row says ``lean`` has one here (a test checks
# both ways), and each computes that layout's module path's forward values.
LEAN_PATHS: dict[str, Callable[[TransformerBlock, Tensor, Tensor | None, Angles | None], Tensor]] = {
    "pre": _pre_lean,
    "post": _post_lean,
}


def _positions(key_padding_mask: Tensor | None, x: Tensor) -> Tensor | None:
    """The padding mask of x's own positions (with a KV cache the key mask also covers the past)."""
    if key_padding_mask is None:
        return None
    return key_padding_mask[:, -x.shape[1]:]
