"""Verdicts: each claim's numbers in, ``holds`` / ``partly`` / ``fails`` and the reason out.

A verdict is never written in by hand. Each function below turns a claim's measurements
(plain dicts of numbers, the same ones ``blocklab claims --json`` prints) into named checks,
each a sentence that is true or false of those numbers. All checks true: ``holds``; none:
``fails``; some: ``partly``. The reason lists the checks that held and those that did not.
Thresholds are stated in the check's sentence, so a reader can judge them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

VERDICTS = ("holds", "partly", "fails")


@dataclass(frozen=True)
class Verdict:
    """The outcome of a claim: ``verdict`` in VERDICTS, ``reason`` in words, and every check."""

    verdict: str
    reason: str
    checks: list[dict[str, Any]]  # {"check": sentence, "ok": bool}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


def from_checks(checks: list[tuple[str, bool]]) -> Verdict:
    """holds if every check is true, fails if none is, partly otherwise; the reason names them."""
    if not checks:
        raise ValueError("a verdict needs at least one check")
    passed = [text for text, ok in checks if ok]
    failed = [text for text, ok in checks if not ok]
    verdict = "holds" if not failed else ("fails" if not passed else "partly")
    reason = "; ".join(
        part
        for part in (
            ("true: " + "; ".join(passed)) if passed else "",
            ("not true: " + "; ".join(failed)) if failed else "",
        )
        if part
    )
    return Verdict(verdict, reason, [{"check": text, "ok": bool(ok)} for text, ok in checks])


def _fin(x: float | None) -> float:
    """None / NaN (diverged or not measured) as -inf-safe 0.0 for accuracies."""
    return 0.0 if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


# ---- at initialization -----------------------------------------------------------------------


def residual_gradient(m: dict[str, Any]) -> Verdict:
    """m: {"depths": [...], "families": {family: {"add": [first/top ratio per depth], "none": [...]}}}."""
    depths, families = m["depths"], m["families"]
    deepest, shallowest = depths[-1], depths[0]
    checks = [
        (
            "with residuals the first layer gets between 1/10 and 10x the top's gradient at every depth "
            "in every family",
            all(0.1 <= r <= 10 for fam in families.values() for r in fam["add"]),
        )
    ]
    for name, fam in families.items():
        none = fam["none"]
        checks.append(
            (
                f"without residuals ({name}) the first layer gets < 1/100 of the top's gradient "
                f"at depth {deepest}",
                none[-1] < 0.01,
            )
        )
        checks.append(
            (
                f"without residuals ({name}) that ratio keeps shrinking with depth "
                f"(depth {deepest} < depth {shallowest} / 10)",
                none[-1] < none[0] / 10,
            )
        )
    return from_checks(checks)


def pre_vs_post_gradient(m: dict[str, Any]) -> Verdict:
    """m: {"depths": [...], "inits": {init: {"post": [growth per depth], "pre": [...]}}}; growth is the
    geometric-mean FFN gradient norm of the last third of layers over the first third."""
    checks = []
    for init, g in m["inits"].items():
        checks.append(
            (
                f"{init} init: post-norm's FFN gradient grows with layer index "
                f"(last/first third >= 1.5 at every depth)",
                all(x >= 1.5 for x in g["post"]),
            )
        )
        checks.append(
            (
                f"{init} init: pre-norm's stays flat (last/first third in [0.67, 1.5] at every depth)",
                all(1 / 1.5 <= x <= 1.5 for x in g["pre"]),
            )
        )
    return from_checks(checks)


def layernorm_moments(m: dict[str, Any]) -> Verdict:
    """m: {"eps": e, "rows": [{"input_var", "out_mean", "out_var", "predicted_var"}]}."""
    rows = m["rows"]
    return from_checks(
        [
            (
                "the output mean is 0 (|mean| < 1e-6) at every input scale",
                all(abs(r["out_mean"]) < 1e-6 for r in rows),
            ),
            (
                "the output variance is 1 (within 1e-3) at every input scale",
                all(abs(r["out_var"] - 1) < 1e-3 for r in rows),
            ),
            (
                "the output variance is var/(var+eps) (within 1e-6) at every input scale: "
                "the shortfall is eps's",
                all(abs(r["out_var"] - r["predicted_var"]) < 1e-6 for r in rows),
            ),
        ]
    )


def gelu_approximations(m: dict[str, Any]) -> Verdict:
    """m: {form: {"max_err": float, "at": float}} for the tanh and sigmoid forms."""
    return from_checks(
        [
            (
                f"the {form} form is within 1e-3 of exact GELU everywhere on [-10, 10] "
                f"(max error {r['max_err']:.3g} at x = {r['at']:.2f})",
                r["max_err"] < 1e-3,
            )
            for form, r in m.items()
        ]
    )


def param_counts(m: dict[str, Any]) -> Verdict:
    """m: {"items": [{"name", "expected", "built", "analytic"}]}."""
    return from_checks(
        [
            (
                f"{r['name']}: {r['expected']:,} (built {r['built']:,}, counted {r['analytic']:,})",
                r["expected"] == r["built"] == r["analytic"],
            )
            for r in m["items"]
        ]
    )


# ---- trained --------------------------------------------------------------------------------


def relu_sparsity(m: dict[str, Any]) -> Verdict:
    """m: {"init": [fraction <= 0 per layer], "trained": [...]}."""
    half = lambda xs: all(0.4 <= x <= 0.6 for x in xs)  # noqa: E731
    return from_checks(
        [
            ("at initialization 40-60% of the hidden units are zero in every layer", half(m["init"])),
            ("after training 40-60% of the hidden units are zero in every layer", half(m["trained"])),
        ]
    )


def layernorm_vs_batchnorm(m: dict[str, Any]) -> Verdict:
    """m: {"invariance": {norm: {"batch_change", "mode_change"}}, "accuracy": {norm: {setting: acc}}}."""
    inv, acc = m["invariance"], m["accuracy"]
    ln, bn = acc["standard"], acc["batch"]
    small = min(ln, key=lambda k: int(k) if k.isdigit() else 10**9)
    return from_checks(
        [
            (
                "LayerNorm's output for a sequence does not change with the rest of the batch "
                "(max |diff| < 1e-5)",
                inv["standard"]["batch_change"] < 1e-5,
            ),
            (
                "LayerNorm's output is the same in train and eval mode (max |diff| < 1e-5)",
                inv["standard"]["mode_change"] < 1e-5,
            ),
            (
                "BatchNorm's output changes with the rest of the batch (max |diff| > 1e-3)",
                inv["batch"]["batch_change"] > 1e-3,
            ),
            (
                "BatchNorm's output differs between train and eval mode (max |diff| > 1e-3)",
                inv["batch"]["mode_change"] > 1e-3,
            ),
            (
                f"at batch size {small} BatchNorm's accuracy is at least 5 points below LayerNorm's",
                _fin(ln[small]) - _fin(bn[small]) >= 0.05,
            ),
            (
                "with padded variable-length batches BatchNorm's accuracy is at least 5 points "
                "below LayerNorm's",
                _fin(ln["padded"]) - _fin(bn["padded"]) >= 0.05,
            ),
        ]
    )


def no_residual_depth(m: dict[str, Any]) -> Verdict:
    """m: {"depths", "add": [acc per depth], "none": [...], "trains_at": acc, "fails_below": acc}."""
    depths, add, none = m["depths"], m["add"], m["none"]
    trains, fails = m["trains_at"], m["fails_below"]
    checks = [
        (
            f"with residuals every depth trains (accuracy >= {trains:.0%})",
            all(_fin(a) >= trains for a in add),
        ),
        (f"without residuals depth {depths[0]} trains (accuracy >= {trains:.0%})", _fin(none[0]) >= trains),
    ]
    checks += [
        (f"without residuals depth {d} fails to train (accuracy < {fails:.0%})", _fin(a) < fails)
        for d, a in zip(depths[1:], none[1:], strict=True)
    ]
    return from_checks(checks)


def pre_vs_post_warmup(m: dict[str, Any]) -> Verdict:
    """m: {"lr", "post": {"warmup": acc, "no_warmup": acc}, "pre": {...}} (a diverged run has accuracy 0)."""
    post, pre = m["post"], m["pre"]
    return from_checks(
        [
            (
                f"at lr {m['lr']:g} post-norm without warmup ends at least 10 points below "
                "post-norm with warmup",
                _fin(post["warmup"]) - _fin(post["no_warmup"]) >= 0.10,
            ),
            (
                f"at lr {m['lr']:g} pre-norm without warmup ends within 5 points of pre-norm with warmup",
                _fin(pre["warmup"]) - _fin(pre["no_warmup"]) <= 0.05,
            ),
        ]
    )


def gelu_vs_relu(m: dict[str, Any]) -> Verdict:
    """m: {"relu": {"accuracy": [per seed], "eval_loss": [...]}, "gelu": {...}, "time_ratio": gelu/relu}."""
    mean = lambda xs: sum(_fin(x) for x in xs) / len(xs)  # noqa: E731
    relu, gelu = m["relu"], m["gelu"]
    return from_checks(
        [
            (
                f"GELU's mean accuracy ({mean(gelu['accuracy']):.1%}) is at least "
                f"ReLU's ({mean(relu['accuracy']):.1%})",
                mean(gelu["accuracy"]) >= mean(relu["accuracy"]),
            ),
            (
                "GELU's mean held-out loss is at most ReLU's",
                mean(gelu["eval_loss"]) <= mean(relu["eval_loss"]),
            ),
            (
                f"GELU's FFN forward+backward costs at most 1.5x ReLU's (measured {m['time_ratio']:.2f}x)",
                m["time_ratio"] <= 1.5,
            ),
        ]
    )


def norm_lr_robustness(m: dict[str, Any]) -> Verdict:
    """m: {"lrs", "standard": [acc per lr], "none": [...], "trains_at": acc}."""
    trains = m["trains_at"]
    good = lambda xs: sum(_fin(x) >= trains for x in xs)  # noqa: E731
    ln, none = m["standard"], m["none"]
    return from_checks(
        [
            (
                f"LayerNorm reaches {trains:.0%} at more learning rates ({good(ln)} of {len(ln)}) "
                "than no norm "
                f"({good(none)})",
                good(ln) > good(none),
            ),
            (
                "LayerNorm's worst accuracy over the sweep is higher than no norm's",
                min(map(_fin, ln)) > min(map(_fin, none)),
            ),
        ]
    )


def pre_norm_depth(m: dict[str, Any]) -> Verdict:
    """m: {"depths", "pre": [acc per depth], "post": [...], "trains_at": acc}."""
    depths, pre, post, trains = m["depths"], m["pre"], m["post"], m["trains_at"]
    return from_checks(
        [
            (
                f"pre-norm trains at every depth up to {depths[-1]} (accuracy >= {trains:.0%})",
                all(_fin(a) >= trains for a in pre),
            ),
            (
                f"at depth {depths[-1]} post-norm ends at least 10 points below pre-norm",
                _fin(pre[-1]) - _fin(post[-1]) >= 0.10,
            ),
        ]
    )
