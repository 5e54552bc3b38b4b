"""The blocks `blocklab bench` times: blocklab's variants (``VARIANTS``, one entry each) and the
peers (``PEERS``), built at one ``Shape``; what one step of them is, and the FLOPs it is credited.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..nn.activation_kinds import is_gated
from ..nn.block import TransformerBlock
from ..nn.config import ModelConfig
from .footprint import clear_grads

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


@dataclass(frozen=True)
class Shape:
    """One benchmark point: a block's widths and one batch."""

    d_model: int = 512
    n_heads: int = 8
    d_ff: int = 2048
    batch: int = 8
    seq: int = 256
    dtype: str = "float32"

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


@dataclass(frozen=True)
class Target:
    """What a blocklab variant must show against the fastest peer (issue 17)."""

    speed: float  # the median within-round ratio (peer's step time / the variant's) is at least this
    floats_per_d: float  # it keeps at most this many d_model floats per token for backward


@dataclass(frozen=True)
class Variant:
    """A blocklab block under test: ModelConfig fields over the bench's pre-norm exact-GELU block.

    A variant with a target gets a verdict, its speed ratio to every other block, its own
    accounting of what it keeps, and a causal twin (``<name>-causal``), timed only when a causal
    peer runs so that peer is compared like for like.
    """

    name: str
    config: dict[str, Any]
    note: str
    target: Target | None = None


# Adding a variant to the bench is one entry here.
VARIANTS: tuple[Variant, ...] = (
    Variant("blocklab", {}, "pre-norm, lean (fused) path", Target(speed=1.00, floats_per_d=9.05)),
    Variant("blocklab-speed", {"keep_residual": True},
            "pre-norm, lean path keeping the residual sum s (speed mode, keep_residual=True)",
            Target(speed=1.02, floats_per_d=10.05)),
    Variant("blocklab-unfused", {"fused": False}, "pre-norm, module by module (fused=False)"),
)


@dataclass
class Candidate:
    """A block under test: ``run(x)`` maps (B, T, d_model) to (B, T, d_model).

    ``variant`` names the blocklab variant it times ("" for a peer); ``kind`` is "peer", "variant"
    or "causal twin".
    """

    name: str
    module: nn.Module
    run: Callable[[Tensor], Tensor]
    causal: bool = False
    note: str = ""
    variant: str = ""
    kind: str = "peer"
    gated: bool = False  # a gated FFN (SwiGLU, GeGLU): three d x d_ff matmuls, not two (block_flops)
    recomputed_flops: float = 0.0  # matmul FLOPs a step runs beyond block_flops (see recomputed_flops)


# ---- blocklab's variants and the peers ---------------------------------------------------------


def blocklab_candidate(shape: Shape, name: str = "blocklab", **config: Any) -> Candidate:
    """blocklab's pre-norm exact-GELU block at ``shape``, on the lean (fused) path at every width
    (ModelConfig fields override: ``fused=False`` for the module path)."""
    c = ModelConfig(**{
        "d_model": shape.d_model, "n_heads": shape.n_heads, "d_ff": shape.d_ff, "max_seq_len": shape.seq,
        "activation": "gelu", "norm_position": "pre", "fused": True, **config,
    })
    block = TransformerBlock(c)
    note = "pre-norm" + ("" if c.uses_lean_path else ", module path") + (", causal" if c.causal else "")
    return Candidate(name, block, block, causal=c.causal, note=note, gated=is_gated(c.activation),
                     recomputed_flops=recomputed_flops(shape, c))


def _torch_layer(shape: Shape, norm_first: bool) -> Candidate:
    layer = nn.TransformerEncoderLayer(
        shape.d_model, shape.n_heads, shape.d_ff, dropout=0.0, activation="gelu",
        batch_first=True, norm_first=norm_first,
    )
    name = "torch-pre" if norm_first else "torch-post"
    return Candidate(name, layer, layer, note=f"nn.TransformerEncoderLayer(norm_first={norm_first})")


def _first(out: Any) -> Tensor:
    return out[0] if isinstance(out, tuple) else out


def _hf_gpt2(shape: Shape) -> Candidate:
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    config = GPT2Config(
        n_embd=shape.d_model, n_head=shape.n_heads, n_inner=shape.d_ff, n_positions=shape.seq,
        activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        attn_implementation="sdpa",
    )
    block = GPT2Block(config, layer_idx=0)
    return Candidate("hf-gpt2", block, lambda x: _first(block(x)), causal=True,
                     note="transformers GPT2Block (pre-norm; always causal), sdpa")


def _hf_bert(shape: Shape) -> Candidate:
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertLayer

    config = BertConfig(
        hidden_size=shape.d_model, num_attention_heads=shape.n_heads, intermediate_size=shape.d_ff,
        hidden_act="gelu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        attn_implementation="sdpa",
    )
    layer = BertLayer(config)
    note = "transformers BertLayer (post-norm), sdpa"
    return Candidate("hf-bert", layer, lambda x: _first(layer(x)), note=note)


def _x_transformers(shape: Shape) -> Candidate:
    from x_transformers import Encoder

    encoder = Encoder(
        dim=shape.d_model, depth=1, heads=shape.n_heads, attn_dim_head=shape.d_model // shape.n_heads,
        ff_mult=shape.d_ff / shape.d_model, attn_flash=True,
    )
    note = "x_transformers.Encoder(depth=1, attn_flash=True): pre-norm, with its final norm"
    return Candidate("x-transformers", encoder, encoder, note=note)


PEERS: dict[str, Callable[[Shape], Candidate]] = {
    "torch-pre": lambda s: _torch_layer(s, norm_first=True),
    "torch-post": lambda s: _torch_layer(s, norm_first=False),
    "hf-gpt2": _hf_gpt2,
    "hf-bert": _hf_bert,
    "x-transformers": _x_transformers,
}


def variant_candidate(shape: Shape, variant: Variant, causal: bool = False) -> Candidate:
    """``variant`` at ``shape``; ``causal=True``: its causal twin."""
    config = {**variant.config, **({"causal": True} if causal else {})}
    c = blocklab_candidate(shape, f"{variant.name}-causal" if causal else variant.name, **config)
    c.note, c.variant = variant.note + (", causal" if causal else ""), variant.name
    c.kind = "causal twin" if causal else "variant"
    return c


def build_candidates(
    shape: Shape, peers: Sequence[str] = tuple(PEERS), variants: Sequence[Variant] = VARIANTS, seed: int = 0
) -> tuple[list[Candidate], dict[str, str]]:
    """(the variants [, the causal twins of those with a target], every installed peer),
    {peer: why skipped}."""
    torch.manual_seed(seed)
    candidates = [variant_candidate(shape, v) for v in variants]
    skipped: dict[str, str] = {}
    found = []
    for name in peers:
        try:
            found.append(PEERS[name](shape))
        except ImportError as error:  # an optional peer library is not installed
            skipped[name] = f"not installed ({error.name})"
    if any(p.causal for p in found):  # like for like with GPT2Block
        candidates += [variant_candidate(shape, v, causal=True) for v in variants if v.target]
    candidates += found
    for c in candidates:
        c.module.to(shape.torch_dtype).train()
    return candidates, skipped


# ---- what is counted --------------------------------------------------------------------------


def linear_flops(shape: Shape, gated: bool = False) -> float:
    """FLOPs of the block's linear layers in one forward + backward step (a multiply-add is 2;
    backward = 2 x forward): per token, forward 2 (4 d^2 + 2 d d_ff) for q, k, v, o, W1, W2
    (3 d d_ff when gated)."""
    d, d_ff = shape.d_model, shape.d_ff
    return 3.0 * shape.tokens * 2 * (4 * d * d + (3 if gated else 2) * d * d_ff)


def attention_flops(shape: Shape, causal: bool = False) -> float:
    """FLOPs of QK^T and PV in one forward + backward step: per token, forward 4 T d (half of it
    when causal)."""
    return 3.0 * shape.tokens * 4 * shape.seq * shape.d_model * (0.5 if causal else 1.0)


def block_flops(shape: Shape, causal: bool = False, gated: bool = False) -> float:
    """Model FLOPs of one forward + backward step: the linear layers and attention. Norms, softmax and
    activations are not counted, nor what a block recomputes: every block is credited the same work."""
    return linear_flops(shape, gated) + attention_flops(shape, causal)


def recomputed_flops(shape: Shape, config: ModelConfig) -> float:
    """Matmul FLOPs a blocklab block runs beyond ``block_flops`` in one step: the lean path recomputes
    the residual sum s = x + c Wo^T + bo in backward (kernels.ResidualNormLinear), one (d x d) matmul per
    token, unless it keeps s (``keep_residual``, the speed mode); the module path recomputes nothing."""
    if not config.uses_lean_path or config.keep_residual:
        return 0.0
    return 2.0 * shape.tokens * shape.d_model * shape.d_model


def make_input(shape: Shape, seed: int = 1) -> tuple[Tensor, Tensor]:
    """(x, dL/dout): a seeded (B, T, d_model) batch that requires grad, and an all-ones gradient."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape.batch, shape.seq, shape.d_model, generator=gen).to(shape.torch_dtype)
    return x.requires_grad_(), torch.ones_like(x)


def train_step(candidate: Candidate, x: Tensor, g: Tensor) -> None:
    """One forward + backward; the gradients are dropped so each step allocates its own."""
    candidate.run(x).backward(g)
    clear_grads(candidate.module, x)


def matmul_probe(shape: Shape) -> tuple[Callable[[], None], float]:
    """The block's largest matmul, (tokens, d) @ (d, d_ff), and its FLOPs."""
    a = torch.randn(shape.tokens, shape.d_model, dtype=shape.torch_dtype)
    b = torch.randn(shape.d_model, shape.d_ff, dtype=shape.torch_dtype)
    return (lambda: torch.mm(a, b)), 2.0 * shape.tokens * shape.d_model * shape.d_ff


def attention_probe(shape: Shape, causal: bool = False) -> Callable[[], None]:
    """SDPA alone, forward + backward, at ``shape`` (what every block's attention core costs)."""
    h, dk = shape.n_heads, shape.d_model // shape.n_heads
    q, k, v = (torch.randn(shape.batch, h, shape.seq, dk, dtype=shape.torch_dtype, requires_grad=True)
               for _ in range(3))
    g = torch.ones(shape.batch, h, shape.seq, dk, dtype=shape.torch_dtype)

    def step() -> None:
        F.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(g)
        q.grad = k.grad = v.grad = None

    return step
