"""The claims that need training: each is a list of ``RunSpec`` (what to train) and a ``measure``
that turns the finished runs into numbers. All runs train listops (``listops-padded`` for the
padded batches) with the trainer; sizes (width, depths, steps, seeds) come from the claim's
quick or full parameters ``p``.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from ..feedforward import FeedForward
from .init_claims import _small, diagnose, measure_norm_invariance
from .runs import RunSpec

Results = dict[str, dict[str, Any]]


def _train(p: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """TrainConfig fields: the claim's budget (steps, lr, warmup, batch), evaluation every 50 steps."""
    steps = changes.pop("steps", p["steps"])
    fields = {
        "steps": steps,
        "lr": p["lr"],
        "warmup": min(p["warmup"], steps),
        "batch_size": p["batch_size"],
        "eval_every": p.get("eval_every", 50),
        "log_every": p.get("eval_every", 50),
        "checkpoint_every": 0,
        "target_accuracy": 0.99,
    }
    return {**fields, **changes}


def _spec(
    name: str, label: str, p: dict[str, Any], model: dict[str, Any] | None = None, seed: int = 0, **train: Any
) -> RunSpec:
    return RunSpec(
        key=f"{name}/{label}", model=_small(p, **(model or {})), train=_train(p, seed=seed, **train)
    )


def _acc(results: Results, key: str) -> float:
    return float(results[key]["accuracy"])


# ---- relu-sparsity ----------------------------------------------------------------------------


def runs_relu_sparsity(p: dict[str, Any]) -> list[RunSpec]:
    """One ReLU model, diagnosed on held-out examples after training."""
    spec = _spec("relu-sparsity", "relu", p)
    return [RunSpec(**{**spec.to_dict(), "diagnose_after": True})]


def measure_relu_sparsity(p: dict[str, Any], results: Results) -> dict[str, Any]:
    """Fraction of FFN pre-activations <= 0 per layer at init and after training (and dead units)."""
    init = diagnose(_small(p), 256, 0)
    after = results["relu-sparsity/relu"]
    return {
        "init": init.profile("ffn_frac_le0"),
        "trained": after["diag_after"]["ffn_frac_le0"],
        "dead_init": init.profile("ffn_dead"),
        "dead_trained": after["diag_after"]["ffn_dead"],
        "accuracy": after["accuracy"],
        "steps": after["steps"],
    }


# ---- gelu-vs-relu -----------------------------------------------------------------------------


def runs_gelu_vs_relu(p: dict[str, Any]) -> list[RunSpec]:
    """ReLU and GELU, same budget, several seeds."""
    return [
        _spec("gelu-vs-relu", f"{act}/s{seed}", p, {"activation": act}, seed=seed)
        for act in ("relu", "gelu")
        for seed in range(p["seeds"])
    ]


def ffn_time_ratio(d_model: int = 256, tokens: int = 512, reps: int = 20) -> float:
    """Median forward+backward time of a GELU FFN over a ReLU one, interleaved in one process."""
    torch.manual_seed(0)
    x = torch.randn(tokens, d_model)
    ffns = {act: FeedForward(d_model, 4 * d_model, act) for act in ("relu", "gelu")}
    times: dict[str, list[float]] = {act: [] for act in ffns}
    for _ in range(reps):
        for act, ffn in ffns.items():
            start = time.perf_counter()
            ffn(x).sum().backward()
            times[act].append(time.perf_counter() - start)
    return statistics.median(times["gelu"]) / statistics.median(times["relu"])


def measure_gelu_vs_relu(p: dict[str, Any], results: Results) -> dict[str, Any]:
    """Accuracy and held-out loss per seed for each activation, and the FFN time ratio."""
    out: dict[str, Any] = {}
    for act in ("relu", "gelu"):
        rs = [results[f"gelu-vs-relu/{act}/s{seed}"] for seed in range(p["seeds"])]
        out[act] = {
            "accuracy": [r["accuracy"] for r in rs],
            "eval_loss": [r["eval_loss"] for r in rs],
            "steps_to_target": [r["steps_to_target"] for r in rs],
        }
    out["time_ratio"] = ffn_time_ratio()
    return out


# ---- no-residual-depth ------------------------------------------------------------------------


def runs_no_residual_depth(p: dict[str, Any]) -> list[RunSpec]:
    """residual add vs none at each depth."""
    return [
        _spec(
            "no-residual-depth",
            f"{res}/L{depth}",
            p,
            {"residual": res, "n_layers": depth, "norm_position": p["norm_position"]},
        )
        for res in ("add", "none")
        for depth in p["depths"]
    ]


def measure_no_residual_depth(p: dict[str, Any], results: Results) -> dict[str, Any]:
    """Accuracy reached at the budget, per depth, with and without residuals."""
    acc = {
        res: [_acc(results, f"no-residual-depth/{res}/L{d}") for d in p["depths"]] for res in ("add", "none")
    }
    curves = {
        f"{res} L{d}": results[f"no-residual-depth/{res}/L{d}"]["curve"]
        for res in ("add", "none")
        for d in p["depths"]
    }
    return {
        "depths": p["depths"],
        **acc,
        "trains_at": p["trains_at"],
        "fails_below": p["fails_below"],
        "curves": curves,
    }


# ---- pre-vs-post-warmup -----------------------------------------------------------------------


def runs_pre_vs_post_warmup(p: dict[str, Any]) -> list[RunSpec]:
    """Post- and pre-norm at a high learning rate, with and without warmup."""
    return [
        _spec(
            "pre-vs-post-warmup",
            f"{pos}/{'warmup' if w else 'no_warmup'}",
            p,
            {"norm_position": pos, "n_layers": p["depth"]},
            warmup=w,
        )
        for pos in ("post", "pre")
        for w in (p["warmup"], 0)
    ]


def measure_pre_vs_post_warmup(p: dict[str, Any], results: Results) -> dict[str, Any]:
    """Final accuracy (0 if diverged) of each of the four runs."""
    out: dict[str, Any] = {"lr": p["lr"], "warmup_steps": p["warmup"], "depth": p["depth"], "curves": {}}
    for pos in ("post", "pre"):
        out[pos] = {}
        for w in ("warmup", "no_warmup"):
            r = results[f"pre-vs-post-warmup/{pos}/{w}"]
            out[pos][w] = r["accuracy"]
            out[pos][f"{w}_diverged"] = r["diverged"]
            out["curves"][f"{pos}-norm, {w.replace('_', ' ')}"] = r["curve"]
    return out


# ---- norm-lr-robustness -----------------------------------------------------------------------


def runs_norm_lr_robustness(p: dict[str, Any]) -> list[RunSpec]:
    """With and without LayerNorm, over a learning-rate sweep."""
    return [
        _spec("norm-lr-robustness", f"{norm}/lr{lr:g}", p, {"norm": norm}, lr=lr)
        for norm in ("standard", "none")
        for lr in p["lrs"]
    ]


def measure_norm_lr_robustness(p: dict[str, Any], results: Results) -> dict[str, Any]:
    """Accuracy per learning rate, with and without LayerNorm."""
    out: dict[str, Any] = {"lrs": p["lrs"], "trains_at": p["trains_at"]}
    for norm in ("standard", "none"):
        out[norm] = [_acc(results, f"norm-lr-robustness/{norm}/lr{lr:g}") for lr in p["lrs"]]
    return out


# ---- pre-norm-depth ---------------------------------------------------------------------------


def runs_pre_norm_depth(p: dict[str, Any]) -> list[RunSpec]:
    """Pre- and post-norm stacks at each depth, same budget."""
    return [
        _spec("pre-norm-depth", f"{pos}/L{d}", p, {"norm_position": pos, "n_layers": d})
        for pos in ("pre", "post")
        for d in p["depths"]
    ]


def measure_pre_norm_depth(p: dict[str, Any], results: Results) -> dict[str, Any]:
    """Accuracy and final training loss per depth for pre- and post-norm."""
    out: dict[str, Any] = {"depths": p["depths"], "trains_at": p["trains_at"]}
    for pos in ("pre", "post"):
        rs = [results[f"pre-norm-depth/{pos}/L{d}"] for d in p["depths"]]
        out[pos] = [r["accuracy"] for r in rs]
        out[f"{pos}_loss"] = [r["loss"] for r in rs]
        out[f"{pos}_diverged"] = [r["diverged"] for r in rs]
    return out


# ---- layernorm-vs-batchnorm -------------------------------------------------------------------


def runs_layernorm_vs_batchnorm(p: dict[str, Any]) -> list[RunSpec]:
    """LayerNorm and BatchNorm at each batch size on listops, and on padded listops-padded batches."""
    specs = [
        _spec("layernorm-vs-batchnorm", f"{norm}/b{b}", p, {"norm": norm}, batch_size=b)
        for norm in ("standard", "batch")
        for b in p["batch_sizes"]
    ]
    for norm in ("standard", "batch"):
        spec = _spec("layernorm-vs-batchnorm", f"{norm}/padded", p, {"norm": norm})
        specs.append(RunSpec(**{**spec.to_dict(), "task": {"name": "listops-padded"}}))
    return specs


def measure_layernorm_vs_batchnorm(p: dict[str, Any], results: Results) -> dict[str, Any]:
    """Invariance of a sequence's output (at init) and accuracy per batch setting for both norms."""
    settings = [str(b) for b in p["batch_sizes"]] + ["padded"]
    accuracy = {
        norm: {
            s: _acc(results, f"layernorm-vs-batchnorm/{norm}/{'b' + s if s.isdigit() else s}")
            for s in settings
        }
        for norm in ("standard", "batch")
    }
    return {"invariance": measure_norm_invariance(p), "accuracy": accuracy, "settings": settings}
