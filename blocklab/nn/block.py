"""The transformer block: residual wiring around attention and the FFN
(docs/concepts.md#residual-connection and #the-block).

Post-norm (original, BERT):          Pre-norm (GPT-2):
    y = LN1(x + MHA(x))                  y = x + MHA(LN1(x))
    z = LN2(y + FFN(y))                  z = y + FFN(LN2(y))

Sandwich adds a norm after each sublayer inside the residual: y = x + LN1_out(MHA(LN1(x))).
The residual combine is ``add`` (x + F), ``rezero`` (x + a F, a learned, init 0), ``deepnorm``
(alpha x + F, then the post-norm LN) or ``none`` (F alone).

This file is the one place the block is wired:

- ``LAYOUTS``, per norm position: which stage is each residual's x and F(x), which stage each
  norm reads, which stage is the block's output, the order a forward pass reaches the stages,
  and the formula. Diagnostics, the tracer, the activation cache and the docs read this table;
  nothing else keeps a copy.
- the **module path** (``_post``, ``_pre``, ``_sandwich``): module by module, every stage a
  tensor that an intervention (``hooks``) may replace.
- the **lean path** (``_post_lean``, ``_pre_lean``): the same block from the memory-lean kernels
  of kernels.py, which keep inputs and recompute the rest in backward. It computes the module
  path's forward values bit for bit (the kernels use the same ops in the same order); observers
  see every stage, the ones it does not materialise computed beside it (``HookPoint.observe``).

Variants are chosen once, at construction; ``forward`` only decides lean or module path: lean
where the config has a lean wiring (``ModelConfig.uses_lean_path``), unless an intervention is
attached or a KV cache is in use (generation).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .attention import KVCache, MultiHeadAttention
from .cache import HookedModule
from .config import ModelConfig
from .feedforward import FeedForward
from .hooks import HookPoint, any_attached, any_intervention, hook_points, name_hook_points
from .kernels import norm_linear, residual_norm_linear, residual_sum
from .norms import build_norm

# ---- the one table of stages ------------------------------------------------------------------


@dataclass(frozen=True)
class Connection:
    """One residual connection ``out = combine(x, F(x))``, by stage name within the block."""

    sublayer: str  # "attn" or "ffn"
    x: str  # the stage holding x: the identity path's input
    branch: str  # the stage holding F(x), the branch as it is added
    out: str  # the stage holding the sum
    residual: str  # the Residual module that combines them ("res1", "res2")


@dataclass(frozen=True)
class Layout:
    """How a norm position wires the block, by stage name (docs/concepts.md#the-block)."""

    formula: str
    connections: dict[str, Connection]  # "attn", "ffn"
    norm_inputs: dict[str, str]  # each norm's stage -> the stage it normalises
    output: str  # the stage holding the block's output: the next block's resid_pre
    order: tuple[str, ...]  # the stages in forward order; "attn", "ffn": the sublayer's own, in its order

    def connection_into(self, out: str) -> Connection:
        """The residual connection whose sum is stage ``out`` (``resid_mid`` or ``resid_post``)."""
        return next(c for c in self.connections.values() if c.out == out)

    def stages(self) -> list[str]:
        """Every stage of the block in the order a forward pass reaches it (``attn.q``, ...)."""
        sublayers = {"attn": MultiHeadAttention.STAGES, "ffn": FeedForward.STAGES}
        order: list[str] = []
        for stage in self.order:
            order += [f"{stage}.{inner}" for inner in sublayers[stage]] if stage in sublayers else [stage]
        return order


LAYOUTS: dict[str, Layout] = {
    "post": Layout(
        "post-norm: y = LN1(x + MHA(x)), z = LN2(y + FFN(y))",
        {"attn": Connection("attn", "resid_pre", "attn.out", "resid_mid", "res1"),
         "ffn": Connection("ffn", "ln1", "ffn.out", "resid_post", "res2")},
        {"ln1": "resid_mid", "ln2": "resid_post"},
        output="ln2",
        order=("resid_pre", "attn", "resid_mid", "ln1", "ffn", "resid_post", "ln2"),
    ),
    "pre": Layout(
        "pre-norm: y = x + MHA(LN1(x)), z = y + FFN(LN2(y))",
        {"attn": Connection("attn", "resid_pre", "attn.out", "resid_mid", "res1"),
         "ffn": Connection("ffn", "resid_mid", "ffn.out", "resid_post", "res2")},
        {"ln1": "resid_pre", "ln2": "resid_mid"},
        output="resid_post",
        order=("resid_pre", "ln1", "attn", "resid_mid", "ln2", "ffn", "resid_post"),
    ),
    "sandwich": Layout(
        "sandwich: y = x + LN1_out(MHA(LN1(x))), z = y + LN2_out(FFN(LN2(y)))",
        {"attn": Connection("attn", "resid_pre", "ln1_out", "resid_mid", "res1"),
         "ffn": Connection("ffn", "resid_mid", "ln2_out", "resid_post", "res2")},
        {"ln1": "resid_pre", "ln2": "resid_mid", "ln1_out": "attn.out", "ln2_out": "ffn.out"},
        output="resid_post",
        order=("resid_pre", "ln1", "attn", "ln1_out", "resid_mid", "ln2", "ffn", "ln2_out", "resid_post"),
    ),
}


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
    """One block: submodules ``attn``, ``ln1``, ``ffn``, ``ln2`` (+ ``ln1_out``, ``ln2_out`` for
    sandwich; ``res1``, ``res2`` hold the residual combine). Stages: ``resid_pre``, ``attn.*``,
    ``resid_mid``, ``ln1``, ``ffn.*``, ``resid_post``, ``ln2`` (and ``ln1_out``, ``ln2_out``).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        c = config
        self.config = c
        self.layout = LAYOUTS[c.norm_position]
        fused = c.components_fused
        norm = lambda: build_norm(c.norm, c.d_model, c.eps, c.bias, fused=fused)  # noqa: E731
        self.attn = MultiHeadAttention(c.d_model, c.n_heads, causal=c.causal, bias=c.bias, dropout=c.dropout,
                                       fused=fused)
        self.ffn = FeedForward(c.d_model, c.d_ff, c.activation, bias=c.bias, dropout=c.dropout, fused=fused)
        self.ln1, self.ln2 = norm(), norm()
        if c.norm_position == "sandwich":
            self.ln1_out, self.ln2_out = norm(), norm()
            self.hook_ln1_out, self.hook_ln2_out = HookPoint(), HookPoint()
        self.res1 = Residual(c.residual, c.n_layers)
        self.res2 = Residual(c.residual, c.n_layers)
        for stage in ("resid_pre", "resid_mid", "ln1", "resid_post", "ln2"):
            setattr(self, f"hook_{stage}", HookPoint())
        self.keep_residual = c.keep_residual  # the lean path's speed mode (kernels.py ledger)
        module_paths = {"post": self._post, "pre": self._pre, "sandwich": self._sandwich}
        lean_paths = {"post": self._post_lean, "pre": self._pre_lean}
        self._module_path = module_paths[c.norm_position]
        self._lean_path = lean_paths[c.norm_position] if c.uses_lean_path else None
        name_hook_points(self)
        self._points = list(hook_points(self).values())

    def hook_names(self) -> list[str]:
        """Every stage name, in the order a forward pass reaches them (LAYOUTS' order)."""
        return self.layout.stages()

    # -- the module path: every stage a tensor --------------------------------------------------

    def _post(self, x: Tensor, mask: Tensor | None, cache: KVCache | None = None) -> Tensor:
        pad = _positions(mask, x)
        x = self.hook_resid_pre(x)
        x = self.hook_ln1(self.ln1(self.hook_resid_mid(self.res1(x, self.attn(x, mask, cache))), pad))
        return self.hook_ln2(self.ln2(self.hook_resid_post(self.res2(x, self.ffn(x))), pad))

    def _pre(self, x: Tensor, mask: Tensor | None, cache: KVCache | None = None) -> Tensor:
        pad = _positions(mask, x)
        x = self.hook_resid_pre(x)
        x = self.hook_resid_mid(self.res1(x, self.attn(self.hook_ln1(self.ln1(x, pad)), mask, cache)))
        return self.hook_resid_post(self.res2(x, self.ffn(self.hook_ln2(self.ln2(x, pad)))))

    def _sandwich(self, x: Tensor, mask: Tensor | None, cache: KVCache | None = None) -> Tensor:
        pad = _positions(mask, x)
        x = self.hook_resid_pre(x)
        attn = self.hook_ln1_out(self.ln1_out(self.attn(self.hook_ln1(self.ln1(x, pad)), mask, cache), pad))
        x = self.hook_resid_mid(self.res1(x, attn))
        ffn = self.hook_ln2_out(self.ln2_out(self.ffn(self.hook_ln2(self.ln2(x, pad))), pad))
        return self.hook_resid_post(self.res2(x, ffn))

    # -- the lean path: the kernels of kernels.py, same forward values --------------------------
    # Observers see a stage the kernels return but whose gradient they do not carry whole (the sum
    # y, LN2(y): the rest of their gradient stays inside ResidualNormLinear) as a detached tensor.

    def _pre_lean(self, x: Tensor, mask: Tensor | None) -> Tensor:  # (B, T, d_model)
        """y = x + MHA(LN1(x)); z = y + FFN(LN2(y)), keeping 9d + H floats per token (10d + H with
        keep_residual) for backward."""
        attn, ffn, ln1, ln2 = self.attn, self.ffn, self.ln1, self.ln2
        x = self.hook_resid_pre(x)
        self.hook_ln1.observe(lambda: ln1(x))
        q, k, v = norm_linear(x, ln1.kernel, ln1.weight, ln1.bias, attn.qkv_weights(), attn.qkv_bias())
        c = attn.context(*attn.split_heads(q, k, v), mask)[0]  # (B, T, d): heads concatenated, before o
        attn.observe_output(c)
        y, z, *h = residual_norm_linear(
            x, c, attn.o.weight, attn.o.bias, self.res1.alpha, ln2.kernel, ln2.weight, ln2.bias,
            ffn.in_weights(), ffn.in_bias(), keep_sum=self.keep_residual,
        )  # y = x + o(c): resid_mid; z = LN2(y); h = W1 z + b1: ffn.hidden
        self.hook_resid_mid.see(y.detach())
        self.hook_ln2.see(z.detach())
        return self.hook_resid_post(self.res2(y, ffn.from_hidden(*h)))

    def _post_lean(self, x: Tensor, mask: Tensor | None) -> Tensor:  # (B, T, d_model)
        """y = LN1(x + MHA(x)); z = LN2(y + FFN(y)), keeping 10d + H + 2 floats per token (LN2 keeps
        its input, mean and rstd; 11d + H + 2 with keep_residual) for backward."""
        attn, ffn, ln1 = self.attn, self.ffn, self.ln1
        x = self.hook_resid_pre(x)
        q, k, v = norm_linear(x, None, None, None, attn.qkv_weights(), attn.qkv_bias())
        c = attn.context(*attn.split_heads(q, k, v), mask)[0]
        attn.observe_output(c)
        s, y, *h = residual_norm_linear(
            x, c, attn.o.weight, attn.o.bias, self.res1.alpha, ln1.kernel, ln1.weight, ln1.bias,
            ffn.in_weights(), ffn.in_bias(), keep_sum=self.keep_residual,
        )  # s = alpha x + o(c): resid_mid; y = LN1(s); h = W1 y + b1
        self.hook_resid_mid.see(s.detach())
        self.hook_ln1.see(y.detach())
        out = self.hook_resid_post(self.res2(y, ffn.from_hidden(*h)))
        return self.hook_ln2(self.ln2(out))  # LN2 keeps its input, mean and rstd: d + 2 more

    # -- which path -----------------------------------------------------------------------------

    @property
    def uses_lean_path(self) -> bool:
        """Whether the next plain forward (no intervention, no KV cache) takes the lean path."""
        return self._lean_path is not None and self.attn.use_fast_path and not any_intervention(self._points)

    def forward(
        self, x: Tensor, key_padding_mask: Tensor | None = None, kv_cache: KVCache | None = None
    ) -> Tensor:  # (B, T, d_model)
        """key_padding_mask: bool (B, T), True where the token is padding. kv_cache: generation only."""
        lean = kv_cache is None and self.uses_lean_path
        if self.config.checkpoint_blocks and kv_cache is None and torch.is_grad_enabled() \
                and not any_attached(self._points):
            # keep only x; the block is recomputed in backward, on the path chosen now (never with
            # hooks attached: the recompute would run them a second time)
            return checkpoint(self._run, x, key_padding_mask, None, lean, use_reentrant=False)
        return self._run(x, key_padding_mask, kv_cache, lean)

    def _run(self, x: Tensor, mask: Tensor | None, cache: KVCache | None, lean: bool) -> Tensor:
        return self._lean_path(x, mask) if lean else self._module_path(x, mask, cache)


def _positions(key_padding_mask: Tensor | None, x: Tensor) -> Tensor | None:
    """The padding mask of x's own positions (with a KV cache the key mask also covers the past)."""
    if key_padding_mask is None:
        return None
    return key_padding_mask[:, -x.shape[1]:]
