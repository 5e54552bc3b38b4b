"""residual-gradient: residual connections keep gradients alive (the +1 term of
docs/concepts.md#residual-connection).

At initialization, on a listops batch: |dL/dx_0| / |dL/dx_N| (the residual-stream gradient at the
first block's input over the gradient entering the stack from above), with residual add and none,
for post-norm, pre-norm and norm-free stacks; plus the identity- and branch-path shares at each
residual connection.
"""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure

from .base import Claim, Numbers, Results, Setup, Source, Verdict, from_checks
from .shared import diagnose, earlier_embedding, g2, learned_positions

FAMILIES: dict[str, dict[str, Any]] = {
    "post-norm": {"norm_position": "post"},
    "pre-norm": {"norm_position": "pre"},
    "no norm": {"norm": "none", "norm_position": "pre"},
}
ALIVE = (0.1, 10.0)  # with residuals: first/top ratio within these bounds at every depth
VANISHED = 0.01  # without: first/top ratio below this at the deepest depth
SHRINKS = 10.0  # without: deepest ratio below the shallowest's / SHRINKS


def measure(p: dict[str, Any], setup: Setup, results: Results) -> Numbers:
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
                    diagnose(p, setup, p["batch"], seed, n_layers=depth, residual=residual, **fields)
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


def verdict(m: Numbers) -> Verdict:
    """m: {"depths": [...], "families": {family: {"add": [first/top per depth], "none": [...]}}}."""
    depths, families = m["depths"], m["families"]
    low, high = ALIVE
    checks = [
        (
            f"with residuals the first layer gets between {low:g}x and {high:g}x the top's gradient at every "
            "depth in every family",
            all(low <= r <= high for fam in families.values() for r in fam["add"]),
        )
    ]
    for name, fam in families.items():
        none = fam["none"]
        checks.append(
            (
                f"without residuals ({name}) the first layer gets < {VANISHED:g} of the top's gradient "
                f"at depth {depths[-1]}",
                none[-1] < VANISHED,
            )
        )
        checks.append(
            (
                f"without residuals ({name}) that ratio keeps shrinking with depth "
                f"(depth {depths[-1]} < depth {depths[0]} / {SHRINKS:g})",
                none[-1] < none[0] / SHRINKS,
            )
        )
    return from_checks(checks)


def headline(m: Numbers) -> str:
    """The ratio at the deepest depth, per family, with and without residuals."""
    fams = m["families"].values()
    return "depth {}: add {} / none {} (post, pre, no norm)".format(
        m["depths"][-1], " ".join(g2(f["add"][-1]) for f in fams), " ".join(g2(f["none"][-1]) for f in fams)
    )


def plot(m: Numbers, fig: Figure) -> None:
    """The ratio against depth; the per-layer profile at the deepest depth."""
    ax1, ax2 = fig.subplots(1, 2)
    for family, fam in m["families"].items():
        for residual, style in (("add", "-o"), ("none", "--x")):
            ax1.plot(
                m["depths"], [max(v, 1e-40) for v in fam[residual]], style, label=f"{family}, {residual}"
            )
    ax1.set(
        yscale="log",
        xlabel="depth",
        ylabel="|dL/dx_0| / |dL/dx_N|",
        title="gradient at the first layer / top",
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


HE = Setup("he-init", "source", "He et al. 2015's variance-preserving init, the source's", init="he")

CLAIM = Claim(
    name="residual-gradient",
    kind="init",
    statement="Residual connections keep gradients alive (the +1 term): without them the gradient reaching "
    "the first layer of a deep stack vanishes.",
    source=Source(
        "He, Zhang, Ren and Sun 2016, 'Identity Mappings in Deep Residual Networks'",
        "section 3, equations 4-5",
        "dE/dx_l = dE/dx_L (1 + d/dx_l sum F): the additive 1 carries the gradient of the top directly "
        "to any shallower unit, so it is unlikely to vanish even when the weights are small.",
        {
            "depth": "ResNets of 110 to 1001 layers",
            "width": "CIFAR-10 ResNets (16-64 channels)",
            "init": "He et al. 2015's variance-preserving init",
            "positions": "none (images)",
            "lr": "not part of the argument: it is about the gradient's form",
            "warmup": "not part of the argument",
            "steps": "not part of the argument",
        },
    ),
    method="At initialization, on a listops batch: |dL/dx_0| / |dL/dx_N| (residual-stream gradient at the "
    "first block's input over the gradient entering the stack from above), with residual add and none, for "
    "post-norm, pre-norm and norm-free stacks; plus the identity- and branch-path shares at each residual "
    "connection (docs/concepts.md#residual-connection).",
    setups=(
        HE,
        HE.but(
            "default-init",
            "GPT-2's N(0, 0.02) block weights (blocklab's GPT and BERT presets'): small branches at init",
            init="default",
        ),
        HE.but("torch-init", "blocklab's default init (PyTorch's nn.Linear variance)", init="torch"),
        learned_positions(HE),
        earlier_embedding(HE),
    ),
    quick={"d_model": 32, "batch": 16, "depths": [2, 6, 10, 20], "seeds": 1},
    full={"d_model": 64, "batch": 64, "depths": [2, 6, 10, 20], "seeds": 3},
    measure=measure,
    verdict=verdict,
    headline=headline,
    plot=plot,
    notes="",
)
