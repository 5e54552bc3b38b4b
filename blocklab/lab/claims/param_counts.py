"""param-counts: the worked parameter counts of docs/concepts.md (layer normalization, feed-forward
network, multi-head attention, parameter counts).

Exact: parameters of the built modules (GPT-2 built on the meta device) against the analytic
count (blocklab.count_parameters) and the published figure.
"""

from __future__ import annotations

from typing import Any

import torch
from matplotlib.figure import Figure
from torch import nn

from ...nn.attention import MultiHeadAttention, attention_parameter_count
from ...nn.feedforward import FeedForward, ffn_parameter_count
from ...nn.model import Transformer
from ...nn.norms import LayerNorm, norm_parameter_count
from ...nn.params import count_parameters
from ...nn.presets import preset
from .base import Claim, Numbers, Results, Setup, Source, Verdict, from_tests
from .rules import exact


def _built(module: nn.Module) -> int:
    return sum(q.numel() for q in module.parameters())


def measure(p: dict[str, Any], setup: Setup, results: Results) -> Numbers:
    """The worked examples: parameters of the built module, the analytic count, the published figure."""
    with torch.device("meta"):  # shapes only: GPT-2 small without allocating 0.5 GB
        gpt2 = Transformer(preset("gpt2"))
    items = [
        ("LayerNorm d=64", 128, LayerNorm(64), norm_parameter_count(64, "standard", True)),
        ("FFN d=64, d_ff=256", 33_088, FeedForward(64, 256), ffn_parameter_count(64, 256, "relu", True)),
        (
            "attention d=64, no biases",
            16_384,
            MultiHeadAttention(64, 4, bias=False),
            attention_parameter_count(64, False),
        ),
        ("GPT-2 small, tied embeddings", 124_439_808, gpt2, count_parameters(preset("gpt2")).total),
    ]
    return {"items": [{"name": n, "expected": e, "built": _built(m), "analytic": a} for n, e, m, a in items]}


def verdict(m: Numbers) -> Verdict:
    """m: {"items": [{"name", "expected", "built", "analytic"}]}: every count equal three ways."""
    return from_tests(
        [
            exact(
                f"{r['name']}: {r['expected']:,} (built {r['built']:,}, counted {r['analytic']:,})",
                [r["built"], r["analytic"]],
                [r["expected"]] * 2,
                0.0,
            )
            for r in m["items"]
        ]
    )


def headline(m: Numbers) -> str:
    """The built counts."""
    return " / ".join(f"{r['built']:,}" for r in m["items"])


def plot(m: Numbers, fig: Figure) -> None:
    """The built counts, log scale."""
    ax = fig.subplots()
    names = [r["name"] for r in m["items"]]
    ax.barh(names, [r["built"] for r in m["items"]], color="tab:blue")
    for i, r in enumerate(m["items"]):
        ax.text(r["built"], i, f" {r['built']:,}", va="center", fontsize="small")
    ax.set(xscale="log", xlabel="parameters (built module)", title="worked examples")


CLAIM = Claim.of(
    __name__,
    name="param-counts",
    kind="exact",
    statement="LayerNorm d=64 has 128 parameters, the FFN d=64/d_ff=256 33,088, attention d=64 16,384, "
    "and GPT-2 small (tied embeddings) 124,439,808.",
    source=Source(
        "blocklab docs/concepts.md (layer normalization, feed-forward network, multi-head attention, "
        "parameter counts); Radford et al. 2019 (GPT-2), the released 'gpt2' checkpoint",
        "the worked examples of docs/concepts.md; GPT-2 small as released (the paper's Table 2 rounds it "
        "to 117M)",
        "2d for LayerNorm, 2 d d_ff + d_ff + d for the FFN, 4 d^2 for attention without biases; "
        "GPT-2 small has 124,439,808 parameters with its head tied to the token embedding.",
        "each count, to the parameter",
    ),
    method="Parameters of the built modules (GPT-2 built on the meta device) against the analytic count "
    "(blocklab.count_parameters) and the published figure.",
    setups=(Setup("exact", "exact", "counting: nothing about it can be confounded"),),
    quick={},
    full={},
)
