"""Measurements of the claims that need no training: gradients and statistics at initialization,
LayerNorm's moments, the GELU approximations, parameter counts, and LayerNorm/BatchNorm invariance.

Each ``measure_*`` takes the claim's size parameters ``p`` and returns plain numbers (JSON-ready);
the verdicts are computed from them elsewhere (``verdicts.py``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..activations import gelu_sigmoid, gelu_tanh
from ..attention import MultiHeadAttention, attention_parameter_count
from ..config import preset
from ..diagnostics import Diagnostics, measure
from ..feedforward import FeedForward, ffn_parameter_count
from ..model import Transformer
from ..norms import LayerNorm, norm_parameter_count
from ..params import count_parameters
from ..tasks import get_task

FAMILIES: dict[str, dict[str, Any]] = {
    "post-norm": {"norm_position": "post"},
    "pre-norm": {"norm_position": "pre"},
    "no norm": {"norm": "none", "norm_position": "pre"},
}


def _listops_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    data = get_task("listops").split("train")
    return data.inputs[:n], data.targets[:n]


def _small(p: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """ModelConfig fields of the lab's small listops model at width ``p["d_model"]``."""
    d = p["d_model"]
    return {"d_model": d, "d_ff": 4 * d, "n_heads": 4, **fields}


def diagnose(fields: dict[str, Any], n: int, seed: int, xavier: bool = False) -> Diagnostics:
    """Diagnostics of a fresh listops model (seeded), optionally with Xavier-normal linear weights."""
    torch.manual_seed(seed)
    model = Transformer(preset("listops-seed", **fields))
    if xavier:  # the initialization of Xiong et al. 2020
        for module in model.blocks.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_normal_(module.weight)
    return measure(model, *_listops_batch(n))


def measure_residual_gradient(p: dict[str, Any]) -> dict[str, Any]:
    """First-layer over top gradient norm, with and without residuals, per depth and norm family."""
    families: dict[str, dict[str, list[float]]] = {}
    shares: dict[str, dict[str, float]] = {}
    profiles: dict[str, dict[str, list[float]]] = {}
    for family, fields in FAMILIES.items():
        families[family] = {}
        for residual in ("add", "none"):
            ratios = []
            for depth in p["depths"]:
                runs = [
                    diagnose(_small(p, n_layers=depth, residual=residual, **fields), p["batch"], seed)
                    for seed in range(p["seeds"])
                ]
                ratios.append(sum(d.layers[0].grad_resid / d.grad_resid_out for d in runs) / len(runs))
            families[family][residual] = ratios
            deepest = runs[0]
            profiles.setdefault(family, {})[residual] = [
                g / deepest.grad_resid_out for g in deepest.profile("grad_resid") + [deepest.grad_resid_out]
            ]
            if residual == "add":
                paths = [layer.residual[k] for layer in deepest.layers for k in ("attn", "ffn")]
                shares[family] = {
                    "identity": sum(q.identity / q.total for q in paths) / len(paths),
                    "branch": sum(q.branch / q.total for q in paths) / len(paths),
                }
    return {"depths": p["depths"], "families": families, "path_share": shares, "profiles": profiles}


def _growth(profile: list[float]) -> float:
    """Geometric mean of the last third of a per-layer profile over that of the first third."""
    k = max(1, len(profile) // 3)
    log = [math.log(max(v, 1e-300)) for v in profile]
    return math.exp(sum(log[-k:]) / k - sum(log[:k]) / k)


def measure_pre_vs_post_gradient(p: dict[str, Any]) -> dict[str, Any]:
    """Per-layer FFN gradient norm (W1 and W2) at init, post- vs pre-norm, default and Xavier init."""
    inits: dict[str, dict[str, list[float]]] = {}
    profiles: dict[str, dict[str, list[float]]] = {}
    for init in ("xavier", "default"):
        inits[init] = {}
        for position in ("post", "pre"):
            growth = []
            for depth in p["depths"]:
                log_sum = [0.0] * depth
                for seed in range(p["seeds"]):
                    d = diagnose(
                        _small(p, n_layers=depth, norm_position=position),
                        p["batch"],
                        seed,
                        xavier=init == "xavier",
                    )
                    ffn = [
                        math.hypot(a, b)
                        for a, b in zip(
                            d.profile("grad_params.ffn.w1"), d.profile("grad_params.ffn.w2"), strict=True
                        )
                    ]
                    log_sum = [s + math.log(v) for s, v in zip(log_sum, ffn, strict=True)]
                profile = [math.exp(s / p["seeds"]) for s in log_sum]
                growth.append(_growth(profile))
            inits[init][position] = growth
            profiles[f"{position}-norm, {init} init"] = profile
    return {"depths": p["depths"], "inits": inits, "profiles": profiles}


def measure_layernorm_moments(p: dict[str, Any]) -> dict[str, Any]:
    """Output mean and variance of blocklab's LayerNorm (float64) on inputs of known variance."""
    d, eps = p["d_model"], 1e-5
    ln = LayerNorm(d, eps=eps).double()
    g = torch.Generator().manual_seed(0)
    rows = []
    for var in p["input_vars"]:
        z = torch.randn(p["n"], d, generator=g, dtype=torch.float64)
        z = (z - z.mean(-1, keepdim=True)) / z.std(-1, unbiased=False, keepdim=True)  # variance exactly 1
        z = 3.0 + z * math.sqrt(var)  # per-position mean 3, variance var
        with torch.no_grad():
            out = ln(z)
        rows.append(
            {
                "input_var": var,
                "out_mean": float(out.mean(-1).abs().max()),
                "out_var": float(out.var(-1, unbiased=False).mean()),
                "predicted_var": var / (var + eps),
            }
        )
    return {"eps": eps, "d_model": d, "d_minus_1_over_d": (d - 1) / d, "rows": rows}


def measure_gelu_approximations(p: dict[str, Any]) -> dict[str, Any]:
    """Max |approximation - exact GELU| over [-10, 10] on a fine float64 grid, and where it is."""
    x = torch.linspace(-10, 10, p["points"], dtype=torch.float64)
    exact = 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))  # the definition x * Phi(x)
    out = {}
    for form, fn in (("tanh", gelu_tanh), ("sigmoid", gelu_sigmoid)):
        err = (fn(x) - exact).abs()
        i = int(err.argmax())
        out[form] = {"max_err": float(err[i]), "at": float(x[i])}
    return out


def _built(module: nn.Module) -> int:
    return sum(q.numel() for q in module.parameters())


def measure_param_counts(p: dict[str, Any]) -> dict[str, Any]:
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


def measure_norm_invariance(p: dict[str, Any]) -> dict[str, dict[str, float]]:
    """How much one sequence's logits move when its batch-mates change, and between train and eval mode."""
    data = get_task("listops").split("test")
    n = p["batch"]
    batch_a = data.inputs[:n]
    batch_b = torch.cat([data.inputs[:1], data.inputs[n : 2 * n - 1]])  # same first sequence, new mates
    out = {}
    for norm in ("standard", "batch"):
        torch.manual_seed(0)
        model = Transformer(preset("listops-seed", **_small(p, norm=norm)))
        with torch.no_grad():
            model.train()
            a, b = model(batch_a)[0], model(batch_b)[0]
            model.eval()
            a_eval = model(batch_a)[0]
        out[norm] = {
            "batch_change": float((a - b).abs().max()),
            "mode_change": float((a - a_eval).abs().max()),
        }
    return out
