"""`blocklab bench`: one transformer block against its peers, measured in one run on this machine.

For blocklab and every installed peer, built with equal shapes (default: d_model 512, 8 heads,
d_ff 2048, batch 8, seq 256, float32, biases, exact GELU):

- step time: one forward + backward, in interleaved rounds (every block once per round, the order
  rotating), so other load on the machine hits all blocks alike. Ratios are taken within a round;
  every figure is the median over rounds.
- saved activations: the bytes autograd keeps for backward after one forward, captured with
  ``torch.autograd.graph.saved_tensors_hooks``. Each saved tensor is mapped to its storage and
  every storage counts once, whole (a view keeps all of its storage alive). Storages of parameters
  and buffers are excluded: they are not activations. The block's input counts: in a stack it is
  the previous block's output, kept alive only because this block saved it.
- peak: the most bytes held at once by tensors created during one step (activations, saved
  tensors, temporaries, gradients), tracked op by op with a dispatch mode; parameters and the
  input batch excluded.
- FLOPs: model FLOPs counted analytically (``block_flops``), the same for every block, against the
  machine's matmul rate, measured in the same rounds on the block's largest matmul.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
from torch import Tensor, nn

from .block import TransformerBlock
from .config import ModelConfig
from .measure import clear_grads, median_ratio, saved_activations, saved_by, step_memory, time_rounds

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


@dataclass
class Candidate:
    """A block under test: ``run(x)`` maps (B, T, d_model) to (B, T, d_model)."""

    name: str
    module: nn.Module
    run: Callable[[Tensor], Tensor]
    causal: bool = False
    note: str = ""


# ---- the blocks -------------------------------------------------------------------------------


def blocklab_candidate(shape: Shape, name: str = "blocklab", **config: Any) -> Candidate:
    """blocklab's pre-norm exact-GELU block at ``shape`` (ModelConfig fields override)."""
    c = ModelConfig(**{
        "d_model": shape.d_model, "n_heads": shape.n_heads, "d_ff": shape.d_ff, "max_seq_len": shape.seq,
        "activation": "gelu", "norm_position": "pre", **config,
    })
    block = TransformerBlock(c)
    note = "pre-norm" + ("" if c.fused else ", fused=False") + (", causal" if c.causal else "")
    return Candidate(name, block, block, causal=c.causal, note=note)


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


def build_candidates(
    shape: Shape, peers: Sequence[str] = tuple(PEERS), variants: bool = True, seed: int = 0
) -> tuple[list, dict]:
    """(blocklab [, its causal and unfused variants], every installed peer), {peer: why skipped}."""
    torch.manual_seed(seed)
    candidates = [blocklab_candidate(shape)]
    if variants:
        candidates += [
            blocklab_candidate(shape, "blocklab-causal", causal=True),  # like for like with GPT2Block
            blocklab_candidate(shape, "blocklab-unfused", fused=False),
        ]
    skipped: dict[str, str] = {}
    for name in peers:
        try:
            candidates.append(PEERS[name](shape))
        except ImportError as error:  # an optional peer library is not installed
            skipped[name] = f"not installed ({error.name})"
    for c in candidates:
        c.module.to(shape.torch_dtype).train()
    return candidates, skipped


# ---- what is counted --------------------------------------------------------------------------


def block_flops(shape: Shape, causal: bool = False, gated: bool = False) -> float:
    """Model FLOPs of one forward + backward step (a multiply-add is 2; backward = 2 x forward).

    Per token, forward: 2 (4 d^2 + 2 d d_ff) for q, k, v, o, W1, W2 (3 d d_ff when gated), and
    4 T d for QK^T and PV (half of it when causal). Norms, softmax and activations are not counted,
    nor what a block recomputes: every block is credited the same work.
    """
    d, d_ff, T = shape.d_model, shape.d_ff, shape.seq
    matmuls = 2 * (4 * d * d + (3 if gated else 2) * d * d_ff)
    attention = 4 * T * d * (0.5 if causal else 1.0)
    return 3.0 * shape.tokens * (matmuls + attention)


def make_input(shape: Shape, seed: int = 1) -> tuple[Tensor, Tensor]:
    """(x, dL/dout): a seeded (B, T, d_model) batch that requires grad, and an all-ones gradient."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape.batch, shape.seq, shape.d_model, generator=gen).to(shape.torch_dtype)
    return x.requires_grad_(), torch.ones_like(x)


def train_step(candidate: Candidate, x: Tensor, g: Tensor) -> None:
    """One forward + backward; the gradients are dropped so each step allocates its own."""
    candidate.run(x).backward(g)
    clear_grads(candidate.module, x)


def _matmul_probe(shape: Shape) -> tuple[Callable[[], None], float]:
    """The block's largest matmul, (tokens, d) @ (d, d_ff), and its FLOPs."""
    a = torch.randn(shape.tokens, shape.d_model, dtype=shape.torch_dtype)
    b = torch.randn(shape.d_model, shape.d_ff, dtype=shape.torch_dtype)
    return (lambda: torch.mm(a, b)), 2.0 * shape.tokens * shape.d_model * shape.d_ff


# ---- the comparison at one shape ---------------------------------------------------------------


def compare(
    shape: Shape, rounds: int = 5, min_seconds: float = 0.3, peers: Sequence[str] = tuple(PEERS),
    compile: bool = False, memory: bool = True, variants: bool = True,
) -> dict[str, Any]:
    """Every block at ``shape``: tokens/s, saved bytes, peak, FLOP rate, and blocklab's speedup over
    each (against blocklab-causal for causal blocks: like for like).

    Speed is read two ways: from each block's best round (other processes only ever add time, so
    the best round is the closest to this machine unloaded: ``speedup``, ``tokens_per_s``) and as
    the median over rounds of the within-round ratio (``speedup_median``, ``tokens_per_s_median``).
    """
    candidates, skipped = build_candidates(shape, peers, variants)
    x, g = make_input(shape)
    rows: dict[str, dict[str, Any]] = {c.name: {"note": c.note, "causal": c.causal} for c in candidates}
    for c in candidates if memory else ():
        saved, _ = saved_activations(c.module, c.run, x)
        held, peak = step_memory(c.module, c.run, x)
        rows[c.name].update(
            saved_bytes_per_token=saved.nbytes / shape.tokens,
            saved_floats_per_token_per_d=saved.nbytes / shape.tokens / x.element_size() / shape.d_model,
            held_bytes=held, peak_bytes=peak,
        )
    for c in candidates if compile else ():
        c.run = torch.compile(c.run)
        t0 = time.perf_counter()
        train_step(c, x, g)  # compiles forward and backward
        rows[c.name]["compile_seconds"] = time.perf_counter() - t0
    matmul, matmul_flops = _matmul_probe(shape)
    steps: dict[str, Callable[[], None]] = {c.name: (lambda c=c: train_step(c, x, g)) for c in candidates}
    steps["matmul"] = matmul
    times = time_rounds(steps, rounds, min_seconds, warmup=2 if compile else 1)
    matmul_times = times.pop("matmul")
    for c in candidates:
        t, flops = times[c.name], block_flops(shape, c.causal)
        base = times["blocklab-causal" if c.causal and variants else "blocklab"]
        rows[c.name].update(
            step_ms=1e3 * min(t), step_ms_median=1e3 * statistics.median(t),
            tokens_per_s=shape.tokens / min(t),
            tokens_per_s_median=statistics.median(shape.tokens / s for s in t),
            fraction_of_matmul=flops / min(t) / (matmul_flops / min(matmul_times)),
            speedup=min(t) / min(base),  # > 1: blocklab is faster than this block
            speedup_median=median_ratio(t, base),
        )
    return {
        "shape": asdict(shape), "rounds": rounds, "compiled": compile,
        "matmul_gflops": matmul_flops / min(matmul_times) / 1e9, "blocks": rows, "skipped": skipped,
    }


def accounting(shape: Shape, **config: Any) -> list[dict[str, Any]]:
    """blocklab's saved tensors one by one: shape, floats per token, the autograd nodes saving it."""
    c = blocklab_candidate(shape, **config)
    c.module.to(shape.torch_dtype)
    x, _ = make_input(shape)
    saved, out = saved_activations(c.module, c.run, x)
    nodes = saved_by(out)
    return [
        {"shape": list(tensor_shape), "dtype": dtype, "saved_by": sorted(set(nodes.get(key, []))),
         "floats_per_token": nbytes / x.element_size() / shape.tokens}
        for key, (nbytes, tensor_shape, dtype) in saved.storages.items()
    ]


# ---- sweeps and depth -------------------------------------------------------------------------


def _attention_core(shape: Shape) -> Callable[[], None]:
    """SDPA alone, forward + backward, at ``shape``: what the T^2 term costs."""
    h, dk = shape.n_heads, shape.d_model // shape.n_heads
    q, k, v = (torch.randn(shape.batch, h, shape.seq, dk, dtype=shape.torch_dtype, requires_grad=True)
               for _ in range(3))
    g = torch.ones(shape.batch, h, shape.seq, dk, dtype=shape.torch_dtype)

    def step() -> None:
        torch.nn.functional.scaled_dot_product_attention(q, k, v).backward(g)
        q.grad = k.grad = v.grad = None

    return step


def attention_flop_share(shape: Shape) -> float:
    """Attention's share of the block's model FLOPs: 4T / (8d + 4 d_ff + 4T)."""
    return 4 * shape.seq / (2 * (4 * shape.d_model + 2 * shape.d_ff) + 4 * shape.seq)


def sweep(shapes: Sequence[Shape], rounds: int, min_seconds: float, peer: str = "torch-pre") -> list[dict]:
    """Microseconds per token (forward + backward, best round) of blocklab, one peer and SDPA alone."""
    rows = []
    for shape in shapes:
        torch.manual_seed(0)
        candidates = [blocklab_candidate(shape), PEERS[peer](shape)]
        for c in candidates:
            c.module.to(shape.torch_dtype)
        x, g = make_input(shape)
        steps = {c.name: (lambda c=c: train_step(c, x, g)) for c in candidates}
        steps["attention"] = _attention_core(shape)
        times = time_rounds(steps, rounds, min_seconds)
        row = {"d_model": shape.d_model, "seq": shape.seq, "batch": shape.batch,
               "attention_flop_share": attention_flop_share(shape)}
        for name, t in times.items():
            row[f"{name}_us_per_token"] = 1e6 * min(t) / shape.tokens  # best round, as in compare
        rows.append(row)
    return rows


def seq_shapes(base: Shape, seqs: Sequence[int], tokens: int) -> list[Shape]:
    """``base`` at each sequence length, the batch chosen to keep ``tokens`` per step."""
    return [replace(base, seq=t, batch=max(1, tokens // t)) for t in seqs]


def width_shapes(base: Shape, widths: Sequence[int]) -> list[Shape]:
    """``base`` at each d_model, with d_head 64 (one head below 64) and d_ff = 4 d_model."""
    return [replace(base, d_model=d, n_heads=max(1, d // 64), d_ff=4 * d) for d in widths]


def depth_memory(shape: Shape, depths: Sequence[int]) -> list[dict[str, Any]]:
    """Bytes held after the forward and peak bytes of one step through a stack of pre-norm blocks,
    plain and with ``checkpoint_blocks`` (which keeps only each block's input)."""
    rows = []
    for n in depths:
        row: dict[str, Any] = {"depth": n}
        for label, ckpt in (("plain", False), ("checkpointed", True)):
            torch.manual_seed(0)
            config = blocklab_candidate(shape, checkpoint_blocks=ckpt).module.config
            stack = nn.Sequential(*(TransformerBlock(config) for _ in range(n))).to(shape.torch_dtype)
            x, _ = make_input(shape)
            row[f"{label}_held_bytes"], row[f"{label}_peak_bytes"] = step_memory(stack, stack, x)
        rows.append(row)
    return rows


# ---- the whole run ----------------------------------------------------------------------------

TARGET_FLOATS_PER_D = 10.0  # issue 8: <= 10 d_model saved floats per token ...
TARGET_SPEED = 0.95  # ... at >= 0.95x the fastest peer's step throughput


def verdict(compared: dict[str, Any]) -> dict[str, Any]:
    """The two targets, checked on one comparison: saved floats per token, and blocklab's speed
    against the peer with the most tokens/s (like for like: causal against blocklab-causal)."""
    peers = {k: v for k, v in compared["blocks"].items() if not k.startswith("blocklab")}
    fastest = max(peers, key=lambda k: peers[k]["tokens_per_s"])
    floats = compared["blocks"]["blocklab"].get("saved_floats_per_token_per_d")
    speed = peers[fastest]["speedup"]
    return {
        "saved_floats_per_token_per_d": floats, "limit": TARGET_FLOATS_PER_D,
        "fastest_peer": fastest, "speed_vs_fastest_peer": speed, "speed_limit": TARGET_SPEED,
        "slowest_speedup": min(v["speedup"] for v in peers.values()),
        "met": floats is not None and floats <= TARGET_FLOATS_PER_D and speed >= TARGET_SPEED,
    }


def run_bench(
    quick: bool = False, compile: bool = False, dtype: str = "float32", plot: str | None = None
) -> dict[str, Any]:
    """Everything `blocklab bench` reports, as one JSON-ready dict."""
    base = Shape(dtype=dtype)
    report: dict[str, Any] = {
        "machine": {"torch": torch.__version__, "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
                    "processor": platform.processor() or platform.machine(),
                    "load_average_at_start": os.getloadavg()[0]},  # other processes competing for the CPUs
        "quick": quick,
    }
    report["compare"] = compare(base, rounds=3 if quick else 9, min_seconds=0.0 if quick else 0.5)
    report["verdict"] = verdict(report["compare"])
    report["accounting"] = accounting(base)
    if compile:
        peers = ("torch-pre",) if quick else tuple(PEERS)
        report["compile"] = compare(base, rounds=3, min_seconds=0.3, compile=True, memory=False, peers=peers,
                                    variants=not quick)
    small = Shape(d_model=256, n_heads=4, d_ff=1024, batch=4, seq=128, dtype=dtype)
    report["depth"] = depth_memory(small, (1, 4) if quick else (1, 2, 4, 8))
    seqs = (64, 256, 1024) if quick else (64, 128, 256, 512, 1024, 2048)
    widths = (64, 256, 1024) if quick else (64, 128, 256, 512, 1024)
    rounds, min_s = (2, 0.0) if quick else (3, 0.2)
    report["sweep_seq"] = sweep(seq_shapes(base, seqs, 1024 if quick else 2048), rounds, min_s)
    wide = width_shapes(replace(base, batch=2 if quick else 8), widths)
    report["sweep_d_model"] = sweep(wide, rounds, min_s)
    report["machine"]["load_average_at_end"] = os.getloadavg()[0]
    if plot:
        from .bench_report import plot_sweeps

        plot_sweeps(report, plot)
        report["plot"] = plot
    return report
