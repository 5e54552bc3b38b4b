"""The transformer block: residual wiring around attention and the FFN
(docs/concepts.md#residual-connection and #the-block).

Post-norm (original, BERT):          Pre-norm (GPT-2):
    y = LN1(x + MHA(x))                  y = x + MHA(LN1(x))
    z = LN2(y + FFN(y))                  z = y + FFN(LN2(y))

Sandwich adds a norm after each sublayer inside the residual: y = x + LN1_out(MHA(LN1(x))).
The residual combine is ``add`` (x + F), ``rezero`` (x + a F, a learned, init 0), ``deepnorm``
(alpha x + F, then the post-norm LN) or ``none`` (F alone). Variants are chosen once here,
at construction; ``forward`` never branches on a string.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .attention import KVCache, MultiHeadAttention
from .config import ModelConfig
from .feedforward import FeedForward
from .hooks import HookedModule, HookPoint, any_attached, hook_points, name_hook_points
from .kernels import fused_block_forward
from .norms import build_norm


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
            "add": lambda x, f: x + f,
            "rezero": lambda x, f: x + self.scale * f,
            "deepnorm": lambda x, f: self.alpha * x + f,
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

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}" + (f", alpha={self.alpha:.4f}" if self.kind == "deepnorm" else "")


class TransformerBlock(HookedModule):
    """One block: submodules ``attn``, ``ln1``, ``ffn``, ``ln2`` (+ ``ln1_out``, ``ln2_out`` for
    sandwich; ``res1``, ``res2`` hold the residual combine). Stages: ``resid_pre``, ``attn.*``,
    ``resid_mid``, ``ln1``, ``ffn.*``, ``resid_post``, ``ln2`` (and ``ln1_out``, ``ln2_out``).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        c = config
        self.config = c
        norm = lambda: build_norm(c.norm, c.d_model, c.eps, c.bias, fused=c.fused)  # noqa: E731
        self.attn = MultiHeadAttention(
            c.d_model, c.n_heads, causal=c.causal, bias=c.bias, dropout=c.dropout, fused=c.fused
        )
        self.ffn = FeedForward(c.d_model, c.d_ff, c.activation, bias=c.bias, dropout=c.dropout, fused=c.fused)
        self.ln1, self.ln2 = norm(), norm()
        if c.norm_position == "sandwich":
            self.ln1_out, self.ln2_out = norm(), norm()
            self.hook_ln1_out, self.hook_ln2_out = HookPoint(), HookPoint()
        self.res1 = Residual(c.residual, c.n_layers)
        self.res2 = Residual(c.residual, c.n_layers)
        for stage in ("resid_pre", "resid_mid", "ln1", "resid_post", "ln2"):
            setattr(self, f"hook_{stage}", HookPoint())
        self._forward = {"post": self._post, "pre": self._pre, "sandwich": self._sandwich}[c.norm_position]
        self._fused = fused_block_forward(c)  # memory-lean wiring (blocklab/kernels.py), or None
        name_hook_points(self)
        self._points = list(hook_points(self).values())

    def _post(self, x: Tensor, mask: Tensor | None, cache: KVCache | None = None) -> Tensor:
        x = self.hook_resid_pre(x)
        x = self.hook_ln1(self.ln1(self.hook_resid_mid(self.res1(x, self.attn(x, mask, cache)))))
        return self.hook_ln2(self.ln2(self.hook_resid_post(self.res2(x, self.ffn(x)))))

    def _pre(self, x: Tensor, mask: Tensor | None, cache: KVCache | None = None) -> Tensor:
        x = self.hook_resid_pre(x)
        x = self.hook_resid_mid(self.res1(x, self.attn(self.hook_ln1(self.ln1(x)), mask, cache)))
        return self.hook_resid_post(self.res2(x, self.ffn(self.hook_ln2(self.ln2(x)))))

    def _sandwich(self, x: Tensor, mask: Tensor | None, cache: KVCache | None = None) -> Tensor:
        x = self.hook_resid_pre(x)
        attn = self.hook_ln1_out(self.ln1_out(self.attn(self.hook_ln1(self.ln1(x)), mask, cache)))
        x = self.hook_resid_mid(self.res1(x, attn))
        ffn = self.hook_ln2_out(self.ln2_out(self.ffn(self.hook_ln2(self.ln2(x)))))
        return self.hook_resid_post(self.res2(x, ffn))

    def forward(
        self, x: Tensor, key_padding_mask: Tensor | None = None, kv_cache: KVCache | None = None
    ) -> Tensor:  # (B, T, d_model)
        """key_padding_mask: bool (B, T), True where the token is padding. kv_cache: generation only."""
        # a hook needs its stage materialised, so any attached hook selects the module-by-module path
        hooked = any_attached(self._points)
        lean = self._fused is not None and kv_cache is None and self.attn.use_fast_path and not hooked
        if self.config.checkpoint_blocks and kv_cache is None and not hooked and torch.is_grad_enabled():
            # keep only x; the block is recomputed in backward, on the path chosen now (never with
            # hooks attached: they may change what is computed, and a recompute would run them again)
            return checkpoint(self._run, x, key_padding_mask, None, lean, use_reentrant=False)
        return self._run(x, key_padding_mask, kv_cache, lean)

    def _run(self, x: Tensor, mask: Tensor | None, cache: KVCache | None, lean: bool) -> Tensor:
        return self._fused(self, x, mask) if lean else self._forward(x, mask, cache)
