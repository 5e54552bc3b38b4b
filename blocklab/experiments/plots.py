"""One matplotlib figure per claim, drawn from the claim's measurements (the numbers in its JSON)."""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure

Axes = Any


def _bars(ax: Axes, groups: list[str], series: dict[str, list[float]], ylabel: str) -> None:
    """Grouped bars: one group per label in ``groups``, one bar per series."""
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, [0.0 if v is None else v for v in values], width, label=name)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize="small")


def _accuracy_axis(ax: Axes) -> None:
    ax.set_ylim(0, 1.02)
    ax.axhline(0.1, color="grey", lw=0.6, ls=":")  # chance on listops: 10 answer digits


def residual_gradient(m: dict[str, Any], fig: Figure) -> None:
    ax1, ax2 = fig.subplots(1, 2)
    for family, fam in m["families"].items():
        for residual, style in (("add", "-o"), ("none", "--x")):
            values = [max(v, 1e-40) for v in fam[residual]]
            ax1.plot(m["depths"], values, style, label=f"{family}, residual {residual}")
    ax1.set(
        xscale="linear",
        yscale="log",
        xlabel="depth",
        ylabel="|dL/dx_0| / |dL/dx_N|",
        title="gradient reaching the first layer, relative to the top",
    )
    ax1.legend(fontsize="x-small")
    for family, prof in m["profiles"].items():
        for residual, style in (("add", "-"), ("none", "--")):
            ax2.plot([max(v, 1e-40) for v in prof[residual]], style, label=f"{family}, {residual}")
    ax2.set(
        yscale="log",
        xlabel="layer l (input of block l; last = top)",
        ylabel="|dL/dx_l| / |dL/dx_N|",
        title=f"profile at depth {m['depths'][-1]}",
    )
    ax2.legend(fontsize="x-small")


def pre_vs_post_gradient(m: dict[str, Any], fig: Figure) -> None:
    ax1, ax2 = fig.subplots(1, 2)
    for name, prof in m["profiles"].items():
        ax1.plot(range(1, len(prof) + 1), prof, "-o", ms=3, label=name)
    ax1.set(
        yscale="log",
        xlabel="layer",
        ylabel="|grad FFN weights|",
        title=f"FFN gradient norm per layer at init, depth {m['depths'][-1]}",
    )
    ax1.legend(fontsize="x-small")
    for init, growth in m["inits"].items():
        for pos, style in (("post", "-o"), ("pre", "--x")):
            ax2.plot(m["depths"], growth[pos], style, label=f"{pos}-norm, {init} init")
    ax2.axhspan(1 / 1.5, 1.5, color="green", alpha=0.08)
    ax2.set(yscale="log", xlabel="depth", ylabel="last third / first third", title="growth with layer index")
    ax2.legend(fontsize="x-small")


def layernorm_moments(m: dict[str, Any], fig: Figure) -> None:
    ax = fig.subplots()
    xs = [r["input_var"] for r in m["rows"]]
    ax.plot(xs, [r["out_var"] for r in m["rows"]], "o", label="measured output variance")
    ax.plot(xs, [r["predicted_var"] for r in m["rows"]], "-", label="var / (var + eps)")
    ax.axhline(1.0, color="grey", ls=":", label="1")
    ax.axhline(m["d_minus_1_over_d"], color="red", ls=":", lw=0.8, label="(d-1)/d (not the cause)")
    ax.set(
        xscale="log",
        xlabel="input variance per position",
        ylabel="output variance",
        title=f"LayerNorm output variance, eps = {m['eps']:g}",
    )
    ax.legend(fontsize="small")


def gelu_approximations(m: dict[str, Any], fig: Figure) -> None:
    import torch

    from ..activations import gelu_sigmoid, gelu_tanh

    ax = fig.subplots()
    x = torch.linspace(-6, 6, 2001, dtype=torch.float64)
    exact = 0.5 * x * (1 + torch.erf(x / 2**0.5))
    for form, fn in (("tanh", gelu_tanh), ("sigmoid", gelu_sigmoid)):
        ax.plot(
            x, (fn(x) - exact).abs(), label=f"{form}: max {m[form]['max_err']:.3g} at {m[form]['at']:.2f}"
        )
    ax.set(yscale="log", xlabel="x", ylabel="|approximation - exact|", title="GELU approximation error")
    ax.legend(fontsize="small")


def param_counts(m: dict[str, Any], fig: Figure) -> None:
    ax = fig.subplots()
    names = [r["name"] for r in m["items"]]
    ax.barh(names, [r["built"] for r in m["items"]], color="tab:blue")
    for i, r in enumerate(m["items"]):
        ax.text(r["built"], i, f" {r['built']:,}", va="center", fontsize="small")
    ax.set(xscale="log", xlabel="parameters (built module)", title="worked examples")


def relu_sparsity(m: dict[str, Any], fig: Figure) -> None:
    ax = fig.subplots()
    layers = [f"block {i}" for i in range(len(m["init"]))]
    _bars(
        ax,
        layers,
        {
            "<= 0 at init": m["init"],
            "<= 0 trained": m["trained"],
            "dead at init": m["dead_init"],
            "dead trained": m["dead_trained"],
        },
        "fraction of hidden units",
    )
    ax.axhline(0.5, color="grey", ls=":")
    ax.set(ylim=(0, 1), title="ReLU: hidden units at or below zero")


def gelu_vs_relu(m: dict[str, Any], fig: Figure) -> None:
    ax = fig.subplots()
    seeds = [f"seed {i}" for i in range(len(m["relu"]["accuracy"]))]
    _bars(ax, seeds, {"ReLU": m["relu"]["accuracy"], "GELU": m["gelu"]["accuracy"]}, "held-out accuracy")
    _accuracy_axis(ax)
    ax.set(title=f"ReLU vs GELU (GELU FFN step time {m['time_ratio']:.2f}x ReLU's)")


def _curves(ax: Axes, curves: dict[str, list[dict[str, Any]]]) -> None:
    for name, curve in curves.items():
        pts = [(c["step"], c["eval_accuracy"]) for c in curve if "eval_accuracy" in c]
        if pts:
            ax.plot(*zip(*pts, strict=True), "-o", ms=2, label=name)
    ax.set(xlabel="step", ylabel="held-out accuracy")
    _accuracy_axis(ax)
    ax.legend(fontsize="x-small")


def no_residual_depth(m: dict[str, Any], fig: Figure) -> None:
    ax1, ax2 = fig.subplots(1, 2)
    _bars(
        ax1,
        [f"L={d}" for d in m["depths"]],
        {"residual add": m["add"], "residual none": m["none"]},
        "held-out accuracy",
    )
    _accuracy_axis(ax1)
    ax1.set(title="accuracy at a fixed budget")
    _curves(ax2, m["curves"])
    ax2.set(title="held-out accuracy during training")


def pre_vs_post_warmup(m: dict[str, Any], fig: Figure) -> None:
    ax = fig.subplots()
    _curves(ax, m["curves"])
    ax.set(title=f"lr {m['lr']:g}, {m['depth']} layers, warmup {m['warmup_steps']} steps or none")


def norm_lr_robustness(m: dict[str, Any], fig: Figure) -> None:
    ax = fig.subplots()
    ax.plot(m["lrs"], m["standard"], "-o", label="LayerNorm")
    ax.plot(m["lrs"], m["none"], "--x", label="no norm")
    ax.set(xscale="log", xlabel="peak learning rate", ylabel="held-out accuracy", title="learning-rate sweep")
    _accuracy_axis(ax)
    ax.legend(fontsize="small")


def pre_norm_depth(m: dict[str, Any], fig: Figure) -> None:
    ax = fig.subplots()
    ax.plot(m["depths"], m["pre"], "-o", label="pre-norm")
    ax.plot(m["depths"], m["post"], "--x", label="post-norm")
    ax.set(
        xscale="log", xlabel="depth (blocks)", ylabel="held-out accuracy", title="accuracy at a fixed budget"
    )
    _accuracy_axis(ax)
    ax.legend(fontsize="small")


def layernorm_vs_batchnorm(m: dict[str, Any], fig: Figure) -> None:
    ax1, ax2 = fig.subplots(1, 2)
    _bars(
        ax1,
        [s if not s.isdigit() else f"batch {s}" for s in m["settings"]],
        {
            "LayerNorm": list(m["accuracy"]["standard"].values()),
            "BatchNorm": list(m["accuracy"]["batch"].values()),
        },
        "held-out accuracy",
    )
    _accuracy_axis(ax1)
    ax1.set(title="accuracy by batch setting")
    inv = m["invariance"]
    _bars(
        ax2,
        ["other batch-mates", "train vs eval"],
        {
            "LayerNorm": [
                max(inv["standard"]["batch_change"], 1e-12),
                max(inv["standard"]["mode_change"], 1e-12),
            ],
            "BatchNorm": [inv["batch"]["batch_change"], inv["batch"]["mode_change"]],
        },
        "max |change| of logits",
    )
    ax2.set(yscale="log", title="one sequence's output changes with ...")
