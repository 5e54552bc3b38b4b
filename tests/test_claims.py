"""blocklab claims: each verdict from synthetic numbers, and a CI-sized run whose JSON validates."""

import dataclasses
import json

import jsonschema
import pytest

from blocklab.cli import main
from blocklab.experiments import claims as claims_module
from blocklab.experiments import verdicts as V
from blocklab.experiments.claims import REGISTRY, claims_html, schema


def _rg(add, none_post, none_pre, none_nonorm):
    fam = lambda none: {"add": add, "none": none}  # noqa: E731
    return {
        "depths": [2, 20],
        "families": {"post-norm": fam(none_post), "pre-norm": fam(none_pre), "no norm": fam(none_nonorm)},
    }


def _lvb(ln_inv, bn_inv, ln_acc, bn_acc):
    return {
        "invariance": {
            "standard": {"batch_change": ln_inv, "mode_change": ln_inv},
            "batch": {"batch_change": bn_inv, "mode_change": bn_inv},
        },
        "accuracy": {
            "standard": {"1": ln_acc, "8": 0.9, "64": 0.95, "padded": ln_acc},
            "batch": {"1": bn_acc, "8": 0.9, "64": 0.95, "padded": bn_acc},
        },
    }


def _moments(out_var, predicted, mean=0.0):
    return {
        "eps": 1e-5,
        "rows": [{"input_var": 1e-4, "out_mean": mean, "out_var": out_var, "predicted_var": predicted}],
    }


def _gvr(relu_acc, gelu_acc, ratio):
    return {
        "relu": {"accuracy": [relu_acc], "eval_loss": [1 - relu_acc]},
        "gelu": {"accuracy": [gelu_acc], "eval_loss": [1 - gelu_acc]},
        "time_ratio": ratio,
    }


def _warm(post_w, post_n, pre_w, pre_n):
    return {
        "lr": 0.03,
        "post": {"warmup": post_w, "no_warmup": post_n},
        "pre": {"warmup": pre_w, "no_warmup": pre_n},
    }


def _count(ok_all, ok_some):
    items = [
        {"name": "a", "expected": 128, "built": 128 if ok_some else 127, "analytic": 128},
        {"name": "b", "expected": 5, "built": 5 if ok_all else 6, "analytic": 5},
    ]
    return {"items": items}


def _nrd(add, none):
    return {"depths": [2, 10, 20], "add": add, "none": none, "trains_at": 0.9, "fails_below": 0.5}


def _nlr(standard, none):
    return {"lrs": [1, 2, 3], "standard": standard, "none": none, "trains_at": 0.8}


# (verdict function, {verdict: synthetic measurements that must give it})
CASES = {
    "residual-gradient": (
        V.residual_gradient,
        {
            "holds": _rg([1.0, 1.0], [0.5, 1e-4], [0.5, 1e-4], [1e-3, 1e-9]),
            "partly": _rg([1.0, 1.0], [0.5, 0.3], [0.5, 0.2], [1e-3, 1e-9]),
            "fails": _rg([1e-3, 1e-3], [0.5, 0.4], [0.5, 0.4], [0.5, 0.4]),
        },
    ),
    "pre-vs-post-gradient": (
        V.pre_vs_post_gradient,
        {
            "holds": {"inits": {"x": {"post": [2.0, 3.0], "pre": [1.0, 1.1]}}},
            "partly": {"inits": {"x": {"post": [1.0, 1.0], "pre": [1.0, 1.1]}}},
            "fails": {"inits": {"x": {"post": [1.0, 2.0], "pre": [0.3, 1.0]}}},
        },
    ),
    "layernorm-moments": (
        V.layernorm_moments,
        {
            "holds": _moments(0.9999999, 0.9999999),
            "partly": _moments(0.909, 0.909),
            "fails": _moments(0.5, 0.909, mean=0.1),
        },
    ),
    "gelu-approximations": (
        V.gelu_approximations,
        {
            "holds": {"tanh": {"max_err": 4.7e-4, "at": 2.7}, "sigmoid": {"max_err": 9e-4, "at": -2.3}},
            "partly": {"tanh": {"max_err": 4.7e-4, "at": 2.7}, "sigmoid": {"max_err": 2.03e-2, "at": -2.27}},
            "fails": {"tanh": {"max_err": 2e-3, "at": 2.7}, "sigmoid": {"max_err": 2.03e-2, "at": -2.27}},
        },
    ),
    "param-counts": (
        V.param_counts,
        {
            "holds": _count(True, True),
            "partly": _count(True, False),
            "fails": _count(False, False),
        },
    ),
    "relu-sparsity": (
        V.relu_sparsity,
        {
            "holds": {"init": [0.5, 0.49], "trained": [0.45, 0.55]},
            "partly": {"init": [0.5, 0.49], "trained": [0.8, 0.7]},
            "fails": {"init": [0.2, 0.5], "trained": [0.8, 0.7]},
        },
    ),
    "gelu-vs-relu": (
        V.gelu_vs_relu,
        {
            "holds": _gvr(0.90, 0.95, 1.1),
            "partly": _gvr(0.95, 0.90, 1.1),
            "fails": _gvr(0.95, 0.90, 2.0),
        },
    ),
    "no-residual-depth": (
        V.no_residual_depth,
        {
            "holds": _nrd([0.99, 0.98, 0.97], [0.95, 0.2, None]),
            "partly": _nrd([0.99, 0.98, 0.97], [0.95, 0.9, 0.3]),
            "fails": _nrd([0.5, 0.4, 0.3], [0.5, 0.9, 0.9]),
        },
    ),
    "pre-vs-post-warmup": (
        V.pre_vs_post_warmup,
        {
            "holds": _warm(0.95, 0.1, 0.95, 0.94),
            "partly": _warm(0.95, 0.93, 0.95, 0.94),
            "fails": _warm(0.95, 0.93, 0.95, 0.3),
        },
    ),
    "norm-lr-robustness": (
        V.norm_lr_robustness,
        {
            "holds": _nlr([0.9, 0.95, 0.9], [0.2, 0.95, None]),
            "partly": _nlr([0.9, 0.95, 0.3], [0.2, 0.95, 0.9]),
            "fails": _nlr([0.9, 0.1, 0.3], [0.2, 0.95, 0.9]),
        },
    ),
    "pre-norm-depth": (
        V.pre_norm_depth,
        {
            "holds": {"depths": [6, 48], "pre": [0.9, 0.85], "post": [0.9, 0.3], "trains_at": 0.8},
            "partly": {"depths": [6, 48], "pre": [0.9, 0.5], "post": [0.9, 0.3], "trains_at": 0.8},
            "fails": {"depths": [6, 48], "pre": [0.9, 0.5], "post": [0.9, 0.6], "trains_at": 0.8},
        },
    ),
    "layernorm-vs-batchnorm": (
        V.layernorm_vs_batchnorm,
        {
            "holds": _lvb(0.0, 0.1, 0.9, 0.3),
            "partly": _lvb(0.0, 0.1, 0.9, 0.95),
            "fails": _lvb(0.5, 0.0, 0.3, 0.9),
        },
    ),
}


def test_every_claim_has_verdict_cases():
    assert set(CASES) == set(REGISTRY)
    for name, (fn, _) in CASES.items():
        assert REGISTRY[name].verdict is fn


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("expected", V.VERDICTS)
def test_verdict_comes_from_the_numbers(name, expected):
    fn, cases = CASES[name]
    verdict = fn(cases[expected])
    assert verdict.verdict == expected, verdict.reason
    assert verdict.reason
    oks = [c["ok"] for c in verdict.checks]
    assert {"holds": all(oks), "fails": not any(oks), "partly": any(oks) and not all(oks)}[expected]


def test_verdict_reason_names_what_held_and_what_did_not():
    v = V.from_checks([("a is 1", True), ("b is 2", False)])
    assert v.verdict == "partly"
    assert v.reason == "true: a is 1; not true: b is 2"
    with pytest.raises(ValueError):
        V.from_checks([])


CI_CLAIMS = "layernorm-moments,gelu-approximations,param-counts,residual-gradient,relu-sparsity"


def test_claims_cli_runs_a_ci_subset_and_its_json_validates(tmp_path, monkeypatch, capsys):
    # CI size: the cheap claims plus one training claim, shrunk further than --quick
    small = {
        "residual-gradient": {"d_model": 16, "batch": 8, "depths": [2, 6], "seeds": 1},
        "relu-sparsity": {
            "d_model": 16,
            "steps": 20,
            "lr": 1e-2,
            "warmup": 5,
            "batch_size": 32,
            "eval_every": 10,
        },
    }
    shrunk = [dataclasses.replace(c, quick=small.get(c.name, c.quick)) for c in claims_module.CLAIMS]
    monkeypatch.setattr(claims_module, "CLAIMS", shrunk)
    monkeypatch.setattr(claims_module, "REGISTRY", {c.name: c for c in shrunk})
    out, page = tmp_path / "claims.json", tmp_path / "claims.html"
    code = main(
        ["claims", "--quick", "--only", CI_CLAIMS, "--jobs", "1", "--json", str(out), "--html", str(page)]
    )
    assert code == 0
    report = json.loads(out.read_text())
    jsonschema.validate(report, schema())
    by_name = {c["name"]: c for c in report["claims"]}
    assert sorted(by_name) == sorted(CI_CLAIMS.split(","))
    # numbers checked against their independent definitions
    assert by_name["param-counts"]["verdict"] == "holds"
    assert by_name["gelu-approximations"]["measurements"]["tanh"]["max_err"] == pytest.approx(
        4.73e-4, abs=1e-6
    )
    assert by_name["gelu-approximations"]["measurements"]["sigmoid"]["max_err"] == pytest.approx(
        2.03e-2, abs=1e-4
    )
    rows = by_name["layernorm-moments"]["measurements"]["rows"]
    spec_row = next(r for r in rows if r["input_var"] == 0.01186)
    assert spec_row["out_var"] == pytest.approx(0.99916, abs=1e-5)  # SPEC section 2's example
    relu = by_name["relu-sparsity"]
    assert relu["runs"] == 1 and len(relu["measurements"]["init"]) == 2
    assert all(0 <= x <= 1 for x in relu["measurements"]["trained"])
    html = page.read_text()
    assert html.count("<img") == len(by_name) and "data:image/png;base64," in html
    assert "blocklab claims" in capsys.readouterr().out


def test_claims_cli_rejects_unknown_names(capsys):
    assert main(["claims", "--only", "nope"]) == 2
    assert "unknown claim nope" in capsys.readouterr().err


def test_html_has_a_plot_per_claim_from_synthetic_numbers():
    claims = [
        {
            "name": name,
            "claim": "x" * 10,
            "method": "y" * 10,
            "params": {},
            "runs": 0,
            "seconds": 0.0,
            "headline": "h",
            **fn(cases["partly"]).to_dict(),
            "measurements": cases["partly"],
        }
        for name, (fn, cases) in CASES.items()
        if name in ("gelu-approximations", "param-counts")
    ]
    report = {
        "mode": "quick",
        "jobs": 1,
        "seconds": 1.0,
        "claims": claims,
        "machine": {"python": "3", "torch": "2", "cpus": 2, "platform": "linux"},
    }
    jsonschema.validate(report, schema())
    assert claims_html(report).count("<img") == 2
