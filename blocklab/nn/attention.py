"""Multi-head attention (docs/concepts.md#multi-head-attention), the sublayer the block wraps.

    Q = x Wq^T, K = x Wk^T, V = x Wv^T        split into h heads of d_k = d / h (K, V: h_kv heads)
    head_i = softmax(Q_i K_g(i)^T / sqrt(d_k) + mask) V_g(i)      g(i) = i // (h / h_kv)
    MHA(x) = concat(head_1..head_h) Wo^T + bo

Grouped-query attention (``n_kv_heads`` = h_kv < h; multi-query at h_kv = 1) gives each group of
h / h_kv query heads one key and value head: Wk and Wv are (h_kv d_k, d), the KV cache holds h_kv
heads. With rotary positions (rotary.py) each head's queries and keys are rotated by their positions
after the split (the ``rot_q``, ``rot_k`` stages). With ALiBi (alibi.py) each head's scores get its
bias -m_h |i - j| before the mask: the ``scores`` stage includes it. Gemma 2 scales the scores by
s^-1/2 (``scale`` = query_pre_attn_scalar^-1/2) instead of d_k^-1/2 and soft-caps them, cap tanh(scores /
cap), before the mask (``softcap``; the ``scores`` stage is capped): SDPA cannot cap, so a capped
attention always takes the explicit path. A sliding window (``sliding_window``
= w) lets a query see only the last w positions, itself included (Mistral).

QK-norm (``qk_norm``) normalises the queries and keys before they are rotated and multiplied, so the
scores' size no longer grows with the weights' (Dehghani et al. 2023; Wortsman et al. 2023):

    head:       q_i <- norm_q(q_i), k_g <- norm_k(k_g)   over each head's d_k features, one gamma
                                                          (d_k) shared by the heads (Qwen3, Gemma 3)
    all_heads:  q <- norm_q(q), k <- norm_k(k)            over all heads' features at once: gamma is
                                                          h d_k (q) and h_kv d_k (k) wide (OLMo 2)

The norm is the block's own variant (RMSNorm in those models); the ``q_norm`` and ``k_norm`` stages
hold the normalised q and k (B, h|h_kv, T, d_k), each norm's ``scale`` its denominators.

Head i owns output rows i*d_k .. (i+1)*d_k of q, k and v, and columns i*d_k .. (i+1)*d_k of Wo:
its result ``z_i Wo[:, i]^T`` (``attn.result``) is what it adds to the output, and the results of
all heads plus bo are MHA(x). Two paths give the same output (to
float rounding): the fast path (``F.scaled_dot_product_attention``) and the explicit path, which
materialises the scores and weights. The explicit path runs when an intervention on ``scores`` or
``weights`` needs them to feed the output, or when the weights are asked for; observers of them
(the tracer, ``run_with_cache``) get them computed beside the fast path, which keeps running.

A query with no visible key (a padding position in a left-padded causal batch) attends to
nothing: both paths give it weights 0 and output 0 (its scores are all -inf), and finite gradients.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .alibi import alibi_bias, alibi_slopes
from .circuits import AttentionWeights
from .hooks import HookPoint
from .kernels import norm_linear
from .norm_kinds import is_layer_norm, layer_norm_variants
from .norms import LayerNorm
from .packed import packed_linear, packing
from .rotary import Angles

# SDPA's enable_gqa (torch 2.5): key/value heads shared by groups of query heads without a copy
_SDPA_SHARES_GROUPS = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")

# What QK-norm normalises over (module docstring): nothing, each head's features, or all heads' at once.
QK_NORMS = ("none", "head", "all_heads")


# The stages shaped (B, h, T, ...), heads before positions (the others are (B, T, ...)); QK-norm's scale
# is (B, h, T, 1) per head, (B, T, 1) over all heads.
HEADS_FIRST = ("q", "k", "v", "q_norm", "k_norm", "q_norm.scale", "k_norm.scale", "rot_q", "rot_k", "scores",
               "weights")


def _masked(bias: Tensor, allowed: Tensor) -> Tensor:  # (1, h, T, S), (B|1, 1, T|1, S) -> (B|1, h, T, S)
    """ALiBi's bias with -inf where a key is not allowed: in place when the mask adds no batch dimension
    (the bias is this call's own tensor), so a long sequence holds one (h, T, S) bias, not two."""
    if torch.broadcast_shapes(bias.shape, allowed.shape) == bias.shape:
        return bias.masked_fill_(~allowed, -math.inf)
    return bias.masked_fill(~allowed, -math.inf)


class MultiHeadAttention(AttentionWeights, nn.Module):
    """Keys ``q``, ``k``, ``v``, ``o``: ``nn.Linear``s, q (h d_k, d_model), k and v (n_kv_heads d_k,
    d_model), o (d_model, h d_k); d_k = d_model / h unless ``d_head`` says otherwise (Qwen3-0.6B: 16
    heads of 128 on a width of 1024).

    ``key_padding_mask``: bool (B, T), True where the key is padding (``nn.MultiheadAttention``'s
    convention). Stages, in forward order (``stages``): ``q`` (B, h, T, d_k), ``k``, ``v`` (B, h_kv, T,
    d_k), with QK-norm ``q_norm.scale``, ``q_norm``, ``k_norm.scale``, ``k_norm`` (the same, normalised;
    the modules ``q_norm``, ``k_norm``), with rotary positions ``rot_q``, ``rot_k`` (the same, rotated),
    ``scores`` and ``weights``
    (B, h, T, T), ``z`` (B, T, h, d_k: each head's output before Wo), ``result`` (B, T, h, d_model:
    each head's output through its columns of Wo, without bo), ``out`` (B, T, d_model).
    """

    STAGES = ("q", "k", "v", "q_norm", "k_norm", "rot_q", "rot_k", "scores", "weights", "z", "result",
              "out")  # every stage of its own (the norms' scale stages are theirs)
    ROTARY_STAGES = ("rot_q", "rot_k")
    QK_NORM_STAGES = ("q_norm", "k_norm")

    def __init__(
        self, d_model: int, n_heads: int, causal: bool = False, bias: bool = True, dropout: float = 0.0,
        device: torch.device | str | None = None, dtype: torch.dtype | None = None, fused: bool = True,
        n_kv_heads: int | None = None, qkv_bias: bool | None = None, o_bias: bool | None = None,
        rotary: bool = False, sliding_window: int | None = None, qk_norm: str = "none", norm: str = "rms",
        eps: float = 1e-6, d_head: int | None = None, alibi: bool = False, softcap: float | None = None,
        scale: float | None = None,
    ) -> None:
        """``qk_norm``: one of QK_NORMS; ``norm`` (a LayerNorm variant) and ``eps`` are its norms' (they
        have a bias where ``bias`` and the variant allow one). ``alibi``: ALiBi's bias on the scores.
        ``softcap``: the scores capped at +-softcap (tanh); ``scale``: their factor (None: d_k^-1/2)."""
        super().__init__()
        if n_heads < 1 or (d_head is None and d_model % n_heads):
            raise ValueError(f"MultiHeadAttention n_heads={n_heads} must divide d_model={d_model} "
                             "(or give d_head)")
        kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if kv_heads < 1 or n_heads % kv_heads:
            raise ValueError(f"MultiHeadAttention n_kv_heads={n_kv_heads} must divide n_heads={n_heads}")
        if qk_norm not in QK_NORMS:
            raise ValueError(f"MultiHeadAttention qk_norm={qk_norm!r} is not one of: {', '.join(QK_NORMS)}")
        if qk_norm != "none" and not is_layer_norm(norm):
            raise ValueError(f"MultiHeadAttention qk_norm={qk_norm!r} needs a LayerNorm variant "
                             f"({', '.join(layer_norm_variants())}), not norm={norm!r}")
        factory = {"device": device, "dtype": dtype}
        self.d_model, self.n_heads, self.causal = d_model, n_heads, causal
        self.d_k = d_model // n_heads if d_head is None else d_head
        self.d_attn = n_heads * self.d_k  # the heads' width, concatenated (d_model unless d_head is given)
        self.n_kv_heads, self.sliding_window = kv_heads, sliding_window
        self.alibi = tuple(alibi_slopes(n_heads)) if alibi else None  # fixed numbers: no parameter, no buffer
        self.softcap, self.scale = softcap, scale
        in_bias = bias if qkv_bias is None else qkv_bias
        self.q = nn.Linear(d_model, self.d_attn, bias=in_bias, **factory)
        self.k = nn.Linear(d_model, kv_heads * self.d_k, bias=in_bias, **factory)
        self.v = nn.Linear(d_model, kv_heads * self.d_k, bias=in_bias, **factory)
        self.o = nn.Linear(self.d_attn, d_model, bias=bias if o_bias is None else o_bias, **factory)
        self.dropout_p, self.use_fast_path, self.qk_norm = dropout, True, qk_norm
        self.resid_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.fused = fused  # the qkv matmul keeps the parameters, not their concatenation, for backward
        self.q_norm = self.k_norm = None
        if qk_norm != "none":  # head: d_k wide, shared by the heads; all_heads: as wide as q and k
            self.q_norm, self.k_norm = (LayerNorm(width, eps, norm, bias, fused=fused, **factory)
                                        for width in qk_norm_widths(qk_norm, self.d_k, n_heads, kv_heads))
        own = tuple(s for s in self.STAGES if (rotary or s not in self.ROTARY_STAGES)
                    and (qk_norm != "none" or s not in self.QK_NORM_STAGES))
        for stage in own:
            setattr(self, f"hook_{stage}", HookPoint())
        # every stage in forward order, a norm's scale before its output
        self.stages = tuple(s for stage in own for s in (
            [f"{stage}.{inner}" for inner in LayerNorm.STAGES] if stage in self.QK_NORM_STAGES else []
        ) + [stage])

    def _project_qkv(self, x: Tensor, angles: Angles | None, separate: bool = False
                     ) -> tuple[Tensor, Tensor, Tensor]:
        """One matmul for q, k and v (their weights concatenated), split into heads (and rotated).

        ``separate``: three matmuls instead (decoding one token, where the concat would cost more
        than the matmul it saves); so also whenever autograd is off (inference, generation): the one matmul
        only pays where backward keeps x alone instead of the concatenated weights.
        """
        if packing(x, self.q, self.k, self.v):  # one token of one sequence: one GEMV over the packed weights
            sizes = [w.shape[0] for w in self.qkv_weights()]
            qkv = packed_linear(self, "qkv", x, self.qkv_weights(), (self.q.bias, self.k.bias, self.v.bias))
            return self.split_heads(*qkv.split(sizes, dim=-1), angles)
        if separate or not torch.is_grad_enabled():
            return self.split_heads(self.q(x), self.k(x), self.v(x), angles)
        if self.fused:  # q, k, v: views of one matmul's output, each with its own gradient
            qkv = norm_linear(x, None, None, None, self.qkv_weights(), self.qkv_bias())
        else:
            sizes = [w.shape[0] for w in self.qkv_weights()]
            qkv = F.linear(x, torch.cat(self.qkv_weights()), self.qkv_bias()).split(sizes, dim=-1)
        return self.split_heads(*qkv, angles)

    def qkv_weights(self) -> tuple[Tensor, Tensor, Tensor]:
        """Wq, Wk, Wv: applied as one (3d, d) matmul whose output is [q | k | v]."""
        return self.q.weight, self.k.weight, self.v.weight

    def qkv_bias(self) -> Tensor | None:
        """cat(bq, bk, bv), matching ``qkv_weights``."""
        return torch.cat([self.q.bias, self.k.bias, self.v.bias]) if self.q.bias is not None else None

    def split_heads(self, q: Tensor, k: Tensor, v: Tensor, angles: Angles | None = None
                    ) -> tuple[Tensor, Tensor, Tensor]:
        """(B, T, h d_k) q -> (B, h, T, d_k), (B, T, h_kv d_k) k and v -> (B, h_kv, T, d_k): views, no
        copy; then, with QK-norm, q and k normalised (the q_norm, k_norm stages), and with rotary
        positions, q and k rotated by ``angles`` (the rot_q, rot_k stages)."""
        B, T, _ = q.shape
        heads = lambda y: y.view(B, T, -1, self.d_k).transpose(1, 2)
        q, k, v = self.hook_q(heads(q)), self.hook_k(heads(k)), self.hook_v(heads(v))
        if self.q_norm is not None:
            q = self.hook_q_norm(self._normed(self.q_norm, q))
            k = self.hook_k_norm(self._normed(self.k_norm, k))
        if angles is not None:
            q, k = self.hook_rot_q(angles.rotate(q)), self.hook_rot_k(angles.rotate(k))
        return q, k, v

    def _normed(self, norm: LayerNorm, x: Tensor) -> Tensor:  # (B, h|h_kv, T, d_k)
        """QK-norm of one of q, k: over each head's d_k features, or over all heads' at once."""
        if self.qk_norm == "head":
            return norm(x)
        flat = norm(x.transpose(1, 2).flatten(2))  # (B, T, h d_k)
        return flat.unflatten(-1, (-1, self.d_k)).transpose(1, 2)

    def _shared(self, kv: Tensor) -> Tensor:
        """(B, h_kv, T, d_k) -> (B, h, T, d_k): each key/value head repeated for its group of query heads."""
        groups = self.n_heads // self.n_kv_heads
        return kv if groups == 1 else kv.repeat_interleave(groups, dim=1)

    def _sdpa_groups(self, k: Tensor) -> bool:
        """Whether SDPA shares the key/value heads itself (``enable_gqa``, torch >= 2.5): no copy of the keys
        and values repeated per query head, which a decoding step would otherwise make in every layer.
        Without autograd only: its backward is not implemented everywhere (and training saves the copy)."""
        return self.n_kv_heads != self.n_heads and _SDPA_SHARES_GROUPS and not torch.is_grad_enabled() \
            and k.device.type == "cpu"

    def _sdpa_kv(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        return (k, v) if self._sdpa_groups(k) else (self._shared(k), self._shared(v))

    def _allowed(
        self, key_padding_mask: Tensor | None, T: int, device: torch.device, past: int = 0
    ) -> Tensor | None:
        """Bool mask, True where query i (at position past + i) may attend to key j:
        (B|1, 1, T|1, past + T), or None. key_padding_mask covers all past + T keys."""
        allowed = None
        # one query after the past (decoding) is the last position: causality hides nothing from it
        if self.causal and (T > 1 or self.sliding_window is not None):
            allowed = torch.ones(T, past + T, dtype=torch.bool, device=device).tril(past)[None, None]
            if self.sliding_window is not None:  # and only the last w positions: j > past + i - w
                allowed = allowed & torch.ones_like(allowed).triu(past - self.sliding_window + 1)
        if key_padding_mask is not None:
            keys = ~key_padding_mask.bool()[:, None, None, :]  # (B, 1, 1, T)
            allowed = keys if allowed is None else allowed & keys
        return allowed

    def _alibi_bias(self, T: int, past: int, like: Tensor) -> Tensor | None:
        """ALiBi's -m_h |i - j| (1, h, T, past + T) in ``like``'s dtype (computed in float64), or None."""
        if self.alibi is None:
            return None
        slopes = torch.tensor(self.alibi, dtype=torch.float64, device=like.device)
        out = like.new_empty(1, len(self.alibi), T, past + T)
        for head, slope in enumerate(slopes):  # one head's float64 (T, past + T) at a time, not all h at once
            out[0, head] = alibi_bias(slope[None], T, past)[0]
        return out

    def _scores(self, q: Tensor, k: Tensor, allowed: Tensor | None, past: int = 0) -> Tensor:
        """Q K^T / sqrt(d_k) (or times ``scale``; soft-capped; + ALiBi's bias), -inf where a key is not
        visible: (B, h, T, past + T)."""
        qk = q @ k.transpose(-2, -1)
        scores = qk / math.sqrt(self.d_k) if self.scale is None else qk * self.scale
        if self.softcap is not None:  # as transformers' Gemma 2: divide, tanh, multiply
            scores = torch.tanh(scores / self.softcap) * self.softcap
        bias = self._alibi_bias(q.shape[2], past, scores)
        scores = scores if bias is None else scores + bias
        return scores if allowed is None else scores.masked_fill(~allowed, float("-inf"))

    @staticmethod
    def _softmax(scores: Tensor, allowed: Tensor | None) -> Tensor:
        """softmax over the keys; a row with no visible key gets weights 0, as SDPA gives it output 0
        (the row's scores are set to 0 before the softmax, so neither pass meets a NaN)."""
        if allowed is None:
            return torch.softmax(scores, dim=-1)
        blind = ~allowed.any(dim=-1, keepdim=True)  # (B|1, 1, T|1, 1): queries that see no key
        return torch.softmax(scores.masked_fill(blind, 0.0), dim=-1).masked_fill(blind, 0.0)

    def _explicit(self, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, past: int = 0
                  ) -> tuple[Tensor, Tensor]:
        k, v = self._shared(k), self._shared(v)
        scores = self.hook_scores(self._scores(q, k, allowed, past))  # (B, h, T, T)
        weights = self.hook_weights(self._softmax(scores, allowed))  # (B, h, T, T)
        dropped = F.dropout(weights, self.dropout_p, self.training) if self.dropout_p else weights
        return dropped @ v, weights  # (B, h, T, d_k)

    def _observe_scores_and_weights(
        self, q: Tensor, k: Tensor, key_padding_mask: Tensor | None, past: int
    ) -> None:
        """The fast path runs on; its observers see the scores and weights computed beside it."""
        if self.hook_scores.observers or self.hook_weights.observers:
            allowed = self._allowed(key_padding_mask, q.shape[2], q.device, past)
            with torch.no_grad():
                scores = self._scores(q, self._shared(k), allowed, past)
            self.hook_scores.observe(lambda: scores)
            self.hook_weights.observe(lambda: self._softmax(scores, allowed))

    def _attend(
        self, x: Tensor, key_padding_mask: Tensor | None, explicit: bool, kv_cache: KVCache | None = None,
        angles: Angles | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        B, T, _ = x.shape
        q, k, v = self._project_qkv(x, angles, separate=kv_cache is not None and T == 1)
        past = 0
        if kv_cache is not None:  # attend over the cached keys/values too: (B, h_kv, past + T, d_k)
            past = kv_cache.length
            k, v = kv_cache.append(k, v)
        ctx, weights = self.context(q, k, v, key_padding_mask, explicit, past)
        return self.output(ctx), weights

    def head_results(self, ctx: Tensor) -> Tensor:  # (B, T, h d_k) heads concatenated
        """Each head's output through its own columns of Wo, without bo: (B, T, h, d_model).
        Summed over the heads, plus bo, it is ``o(ctx)`` (to float rounding)."""
        z = ctx.unflatten(-1, (self.n_heads, self.d_k))  # (B, T, h, d_k)
        return torch.einsum("bthk,dhk->bthd", z, self.o.weight.view(self.d_model, self.n_heads, self.d_k))

    def results_from_z(self, z: Tensor) -> Tensor:  # (..., T, h, d_k) -> (..., T, h, d_model)
        """``head_results`` of a cached ``z`` (with or without its batch dimension, in any float dtype):
        the same computation the forward observes, so the same numbers."""
        ctx = z.flatten(-2).to(self.o.weight.dtype)
        batched = ctx if ctx.dim() == 3 else ctx[None]
        out = self.head_results(batched)
        return (out if ctx.dim() == 3 else out[0]).to(z.dtype)

    def output(self, ctx: Tensor) -> Tensor:  # (B, T, h d_k) heads concatenated -> (B, T, d_model)
        """o(ctx), the ``out`` stage. The per-head ``result`` is computed beside it for observers;
        an intervention on ``result`` makes it the sum of the (replaced) results plus bo instead."""
        if self.hook_result.intervened:
            out = self.hook_result(self.head_results(ctx)).sum(2)
            out = out + self.o.bias if self.o.bias is not None else out
        else:
            self.hook_result.observe(lambda: self.head_results(ctx))
            out = packed_linear(self, "o", ctx, (self.o.weight,), (self.o.bias,)) if packing(ctx, self.o) \
                else self.o(ctx)
        return self.hook_out(self.resid_dropout(out))

    def observe_output(self, ctx: Tensor) -> None:
        """For a caller that applies Wo itself (the block's lean path, inside a kernel): its
        observers see ``result`` and ``out`` computed beside it."""
        self.hook_result.observe(lambda: self.head_results(ctx))
        self.hook_out.observe(lambda: self.o(ctx))

    def context(
        self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None = None,
        explicit: bool = False, past: int = 0,
    ) -> tuple[Tensor, Tensor | None]:
        """concat(head_1..head_h) (B, T, h d_k), before ``o`` (the ``z`` stage, viewed as
        (B, T, h, d_k)); and the weights on the explicit path."""
        B, _, T, _ = q.shape
        weights = None
        if explicit or self.softcap is not None:  # SDPA has no soft-capping
            allowed = self._allowed(key_padding_mask, T, q.device, past)
            ctx, weights = self._explicit(q, k, v, allowed, past)
        else:
            # is_causal alone lets SDPA skip building the mask; padding needs the full bool mask, and
            # so do several new queries after a cached past (SDPA's is_causal aligns top-left).
            # One new query after the past sees every key: no mask at all.
            offset_causal = self.causal and past > 0 and T > 1
            windowed = self.sliding_window is not None and past + T > self.sliding_window
            bias = self._alibi_bias(T, past, q)  # ALiBi: the mask becomes the bias, -inf where not allowed
            needs_mask = key_padding_mask is not None or offset_causal or windowed or bias is not None
            allowed = self._allowed(key_padding_mask, T, q.device, past) if needs_mask else None
            mask = allowed if bias is None else bias if allowed is None else _masked(bias, allowed)
            ctx = F.scaled_dot_product_attention(
                q, *self._sdpa_kv(k, v), attn_mask=mask, dropout_p=self.dropout_p if self.training else 0.0,
                is_causal=self.causal and allowed is None and bias is None and past == 0, scale=self.scale,
                **({"enable_gqa": True} if self._sdpa_groups(k) else {}),
            )
            self._observe_scores_and_weights(q, k, key_padding_mask, past)
        # SDPA's CPU kernel lays its output out as (B, T, h, d_k): this concat is then a view, so
        # o's saved input and SDPA's saved output are one tensor
        z = self.hook_z(ctx.transpose(1, 2))  # (B, T, h, d_k)
        return z.reshape(B, T, self.d_attn), weights

    def forward(
        self, x: Tensor, key_padding_mask: Tensor | None = None, kv_cache: KVCache | None = None,
        angles: Angles | None = None,
    ) -> Tensor:  # (B, T, d_model)
        """kv_cache: this layer's cache during generation; x is then only the new positions.
        angles: the rotary positions' cos and sin for x's positions (``Rotary.angles``), when rotary."""
        return self._attend(x, key_padding_mask, self.needs_explicit, kv_cache, angles)[0]

    @property
    def needs_explicit(self) -> bool:
        """Whether the explicit path must run: fast path off, or an intervention on scores/weights."""
        return not self.use_fast_path or self.hook_scores.intervened or self.hook_weights.intervened

    def forward_with_weights(
        self, x: Tensor, key_padding_mask: Tensor | None = None, angles: Angles | None = None
    ) -> tuple[Tensor, Tensor]:
        """The explicit path: (output (B, T, d_model), attention weights (B, h, T, T))."""
        out, weights = self._attend(x, key_padding_mask, explicit=True, angles=angles)
        assert weights is not None
        return out, weights

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, d_k={self.d_k}, causal={self.causal}"
                + (f", n_kv_heads={self.n_kv_heads}" if self.n_kv_heads != self.n_heads else "")
                + (f", sliding_window={self.sliding_window}" if self.sliding_window is not None else "")
                + (f", qk_norm={self.qk_norm!r}" if self.qk_norm != "none" else "")
                + (", alibi=True" if self.alibi is not None else "")
                + (f", scale={self.scale}" if self.scale is not None else "")
                + (f", softcap={self.softcap}" if self.softcap is not None else ""))


class KVCache:
    """One attention layer's keys and values so far, preallocated: (B, h_kv, max_len, d_k) each (the
    key/value heads: grouped-query attention stores fewer).

    ``append`` writes the new positions after the first ``length`` and returns the filled part.
    """

    def __init__(
        self, batch: int, n_heads: int, max_len: int, d_k: int,
        dtype: torch.dtype | None = None, device: torch.device | str | None = None,
    ) -> None:
        self.k = torch.empty(batch, n_heads, max_len, d_k, dtype=dtype, device=device)
        self.v = torch.empty_like(self.k)
        self.length = 0

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store (B, h, T, d_k) keys/values at positions length..length+T; return all so far."""
        end = self.length + k.shape[2]
        if end > self.k.shape[2]:
            raise ValueError(f"KVCache holds {self.k.shape[2]} positions; {end} needed")
        self.k[:, :, self.length : end] = k
        self.v[:, :, self.length : end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]


def attention_parameter_count(d_model: int, bias: bool, kv_dim: int | None = None,
                              qkv_bias: bool | None = None, q_dim: int | None = None,
                              o_bias: bool | None = None) -> int:
    """Wq and Wo d q_dim each (q_dim = h d_k; d unless the heads' width is given), Wk and Wv d kv_dim
    each (kv_dim = n_kv_heads d_k; d without grouped queries): 4 d^2 for multi-head attention; plus
    the biases (q, k, v: ``qkv_bias``, o: ``o_bias``, each as ``bias`` when unset). QK-norm's norms are
    counted as norms (``qk_norm_widths``)."""
    q_dim = d_model if q_dim is None else q_dim
    kv_dim = d_model if kv_dim is None else kv_dim
    in_bias = bias if qkv_bias is None else qkv_bias
    out_bias = bias if o_bias is None else o_bias
    return 2 * d_model * q_dim + 2 * d_model * kv_dim + ((q_dim + 2 * kv_dim) if in_bias else 0) \
        + (d_model if out_bias else 0)


def qk_norm_widths(qk_norm: str, d_k: int, n_heads: int, kv_heads: int) -> tuple[int, ...]:
    """The widths of QK-norm's two norms, q's and k's (none without QK-norm): d_k each per head, or
    as wide as q (h d_k) and k (h_kv d_k) over all heads."""
    return {"none": (), "head": (d_k, d_k), "all_heads": (n_heads * d_k, kv_heads * d_k)}[qk_norm]
