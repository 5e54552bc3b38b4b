"""rmsnorm-vs-layernorm: RMSNorm performs like LayerNorm at lower cost (Zhang and Sennrich 2019).

Steps to 99% held-out on listops within the same budget, LayerNorm and RMSNorm from the same seeds;
the cost is the median forward+backward time of the two norms written out the same way in plain
torch ops, interleaved in one process. blocklab's own modules as they run (LayerNorm on torch's
fused kernel, RMSNorm on blocklab's) are an observation: that compares kernels, not the norms.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from matplotlib.figure import Figure
from torch import Tensor

from ...nn.norms import LayerNorm
from ..grid import RunSpec
from .base import Claim, Numbers, Results, Setup, Source, Verdict, from_checks, seed_count
from .shared import (
    EVAL_EVERY,
    TRAIN_FULL_FAST,
    TRAIN_QUICK,
    median_seconds,
    outcome,
    per_seed,
    reach_text,
    reached,
    seeded,
    steps_bars,
    torch_init,
)

NAME = "rmsnorm-vs-layernorm"
NORMS = ("standard", "rms")
EPS = 1e-5


def runs(p: dict[str, Any], setup: Setup) -> list[RunSpec]:
    """LayerNorm and RMSNorm, same budget, each seed."""
    return [spec for norm in NORMS for spec in seeded(NAME, setup, norm, p, {"norm": norm})]


def _layer_norm(x: Tensor, w: Tensor, b: Tensor) -> Tensor:  # (N, d): centre, then divide by the std
    mu = x.mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt((x - mu).pow(2).mean(-1, keepdim=True) + EPS) * w + b


def _rms_norm(x: Tensor, w: Tensor, b: Tensor) -> Tensor:  # (N, d): divide by the root mean square only
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def norm_costs(d_model: int, tokens: int, reps: int) -> dict[str, float]:
    """RMSNorm's time over LayerNorm's, written the same way (``written``) and as blocklab runs them."""
    torch.manual_seed(0)
    x = torch.randn(tokens, d_model)
    w, b = torch.ones(d_model, requires_grad=True), torch.zeros(d_model, requires_grad=True)
    written = median_seconds(
        {"ln": lambda t: _layer_norm(t, w, b), "rms": lambda t: _rms_norm(t, w, b)}, x, reps
    )
    modules = {norm: LayerNorm(d_model, eps=EPS, variant=norm) for norm in NORMS}
    blocklab = median_seconds({norm: m for norm, m in modules.items()}, x, reps)
    return {"written": written["rms"] / written["ln"], "blocklab": blocklab["rms"] / blocklab["standard"]}


def measure(p: dict[str, Any], setup: Setup, results: Results) -> Numbers:
    """Per norm and seed: final accuracy, steps to target; the cost ratios."""
    out: dict[str, Any] = {norm: outcome(per_seed(results, NAME, setup, norm, p)) for norm in NORMS}
    out["cost"] = norm_costs(*p["timing"])
    out["eval_every"] = p.get("eval_every", EVAL_EVERY)
    return out


def verdict(m: Numbers) -> Verdict:
    """m: {"standard": arm, "rms": arm, "cost": {"written", "blocklab"}, "eval_every"} (``shared.outcome``).

    Control: LayerNorm reaches the target on most seeds. Checks: seed by seed RMSNorm reaches it no
    later than one evaluation after LayerNorm ("performs like", at the measurement's resolution); RMSNorm
    written out costs less than LayerNorm written the same way."""
    ln, rms = m["standard"], m["rms"]
    late = lambda s: math.inf if s is None else s
    like, like_n = seed_count(
        [
            late(r) <= late(n) + m["eval_every"]
            for r, n in zip(rms["steps_to_target"], ln["steps_to_target"], strict=True)
        ]
    )
    control, control_n = seed_count(reached(ln))
    cost = m["cost"]
    return from_checks(
        [
            (
                f"RMSNorm reaches the target at most one evaluation ({m['eval_every']} steps) after "
                "LayerNorm, "
                f"seed by seed ({like_n})",
                like,
            ),
            (
                f"RMSNorm costs less than LayerNorm, both written in plain torch ops "
                f"(forward+backward {cost['written']:.2f}x)",
                cost["written"] < 1,
            ),
        ],
        controls=[(f"LayerNorm reaches the target ({control_n})", control)],
        observations=[
            f"blocklab's modules as they run: RMSNorm {cost['blocklab']:.2f}x LayerNorm's forward+backward "
            "(LayerNorm on torch's fused kernel, RMSNorm on blocklab's: kernels, not the norms, differ)"
        ],
    )


def headline(m: Numbers) -> str:
    """Seeds reaching the target and median steps for each norm; the cost ratio."""
    return (
        f"LN {reach_text(m['standard'])}, RMS {reach_text(m['rms'])}, RMS cost {m['cost']['written']:.2f}x "
        f"(blocklab's modules {m['cost']['blocklab']:.2f}x)"
    )


def plot(m: Numbers, fig: Figure) -> None:
    """Steps to target per seed, LayerNorm next to RMSNorm (a missing bar: not reached within the budget)."""
    ax = fig.subplots()
    steps_bars(ax, {"LayerNorm": m["standard"], "RMSNorm": m["rms"]})
    ax.set(title=f"LayerNorm vs RMSNorm (RMSNorm costs {m['cost']['written']:.2f}x, written alike)")


SOURCE = Setup(
    "xavier",
    "source",
    "blocklab's listops model (post-norm, as the source's Transformer) with Xavier block weights",
    init="xavier",
)

CLAIM = Claim.of(
    __name__,
    name=NAME,
    kind="training",
    statement="RMSNorm performs like LayerNorm at lower cost.",
    source=Source(
        "Zhang and Sennrich 2019, 'Root Mean Square Layer Normalization'",
        "abstract and sections 3 and 5 (Table 4: Transformer on WMT14 En-De)",
        "RMSNorm regularizes the summed inputs by their root mean square alone, dropping re-centering; it "
        "achieves comparable performance against LayerNorm but reduces the running time by 7%-64% on "
        "different models.",
        {
            "depth": "Transformer base (6 encoder and 6 decoder layers), among RNN and CNN models",
            "width": "d_model 512",
            "init": "Xavier (the Transformer's)",
            "positions": "sinusoidal",
            "lr": "Adam with the Transformer's schedule",
            "warmup": "the schedule's linear warmup",
            "steps": "WMT14 En-De to convergence",
        },
    ),
    method="Steps to 99% held-out on listops within the same 600-step budget, LayerNorm and RMSNorm from the "
    "same 5 seeds, compared seed by seed; the cost is the median forward+backward time of both norms written "
    "out in plain torch ops (4,096 positions of width 512, interleaved in one process). Scaled down: d_model "
    "64 and listops for the training, the source's width for the cost.",
    setups=(SOURCE, torch_init(SOURCE)),
    quick={**TRAIN_QUICK, "timing": [512, 1024, 10]},
    full={**TRAIN_FULL_FAST, "timing": [512, 4096, 30]},
    notes=(
        "RMSNorm reaches the target no later than one evaluation after LayerNorm on every seed, with "
        "Xavier weights (xavier, the source's) and with blocklab's init (torch-init): it performs like "
        "LayerNorm here, as the source says. Written out the same way in plain torch ops at the source's "
        "width, RMSNorm's forward and backward take well under LayerNorm's time: the lower cost holds for "
        "the norms themselves. As blocklab runs them, RMSNorm is several times slower than LayerNorm (an "
        "observation): LayerNorm runs on torch's fused kernel and RMSNorm on blocklab's own, so what "
        "differs there is the kernel, not the norm, and it is blocklab's to speed up."
    ),
)
