"""``blocklab explain`` (blocklab/inspect/trace/by_hand.py): a typed vector through a norm, every activation
kind and the tutorial model's FFN with weights from a JSON file; every printed number against a float64
computation written here with plain Python and torch math (no blocklab code); each refusal by its message."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from tutorial_walk import DFF, D, weights

from blocklab.cli import main

DECIMALS = 10
TOL = 0.5 * 10**-DECIMALS + 1e-12  # the rounding of the printed decimals (the numbers are float64's)
X = [4.0, 2.0, 0.0, -2.0]  # the tutorials' example
EPS = 1e-5
HEADING = re.compile(r"^(\d+)\. (.+?)  ")


def explain(capsys, *argv: str) -> dict[str, list[tuple[str, list[float]]]]:
    """Each printed step by its title: its rows as (label, numbers), column chunks joined."""
    assert main(["explain", *argv, "--decimals", str(DECIMALS), "--width", "100"]) == 0
    steps: dict[str, list[tuple[str, list[float]]]] = {}
    title, row, in_grid = None, 0, False
    for line in capsys.readouterr().out.splitlines():
        found = HEADING.match(line)
        if found:
            title, row, in_grid = found.group(2), 0, False
            steps[title] = []
        elif title is not None and line.strip() and not line.startswith("─"):
            if line.startswith(" "):  # a chunk's column labels: the rows again from the first
                row, in_grid = 0, True
                continue
            if not in_grid:  # the heading's formula, wrapped
                continue
            label, *cells = line.split()
            if row == len(steps[title]):
                steps[title].append((label, []))
            steps[title][row][1].extend(float(c) for c in cells)
            row += 1
    return steps


def check(printed: list[tuple[str, list[float]]], want: list[float], label: str = "x") -> None:
    assert len(printed) == 1 and printed[0][0] == label
    assert len(printed[0][1]) == len(want)
    for got, expected in zip(printed[0][1], want, strict=True):
        assert abs(got - expected) <= TOL, (got, expected)


def test_layer_norm_of_the_tutorials_vector_step_by_step(capsys) -> None:
    gamma, beta = [1.0, 2.0, 0.5, -1.0], [0.1, 0.0, -0.1, 1.0]
    steps = explain(capsys, "norm", "4,2,0,-2", "--gamma", "1,2,0.5,-1", "--beta", "0.1,0,-0.1,1")
    mu = sum(X) / 4
    var = sum((v - mu) ** 2 for v in X) / 4
    denom = math.sqrt(var + EPS)
    z_hat = [(v - mu) / denom for v in X]
    assert (mu, var) == (1.0, 5.0)
    assert list(steps) == [f"LayerNorm: {s}" for s in
                           ("input", "mu", "var", "sqrt(var+eps)", "z_hat", "gamma", "beta", "output")]
    check(steps["LayerNorm: input"], X)
    check(steps["LayerNorm: mu"], [mu])
    check(steps["LayerNorm: var"], [var])
    check(steps["LayerNorm: sqrt(var+eps)"], [denom])
    check(steps["LayerNorm: z_hat"], z_hat)
    check(steps["LayerNorm: gamma"], gamma, "gamma")
    check(steps["LayerNorm: beta"], beta, "beta")
    check(steps["LayerNorm: output"], [g * z + b for g, z, b in zip(gamma, z_hat, beta, strict=True)])


def test_layer_norm_defaults_to_gamma_one_beta_zero_and_takes_eps(capsys) -> None:
    steps = explain(capsys, "norm", "[4, 2, 0, -2]", "--eps", "0.5")
    denom = math.sqrt(5.0 + 0.5)
    check(steps["LayerNorm: sqrt(var+eps)"], [denom])
    check(steps["LayerNorm: gamma"], [1.0] * 4, "gamma")
    check(steps["LayerNorm: beta"], [0.0] * 4, "beta")
    check(steps["LayerNorm: output"], [(v - 1.0) / denom for v in X])


@pytest.mark.parametrize("norm, label, denom_title", [
    ("eps_outside_sqrt", "LayerNorm (eps outside the root)", "sqrt(var)+eps"),
    ("rms", "RMSNorm", "sqrt(ms+eps)"),
    ("rms_plus_one", "RMSNorm (1 + w)", "sqrt(ms+eps)"),
])
def test_every_other_norm_kind_step_by_step(capsys, norm: str, label: str, denom_title: str) -> None:
    gamma = [2.0, 1.0, -1.0, 0.5]
    steps = explain(capsys, "norm", "4,2,0,-2", "--norm", norm, "--gamma", "2,1,-1,0.5")
    if norm == "eps_outside_sqrt":
        mu, second = 1.0, 5.0
        denom = math.sqrt(second) + EPS
        check(steps[f"{label}: mu"], [mu])
        check(steps[f"{label}: var"], [second])
    else:  # no centring: the mean square
        mu, second = 0.0, sum(v * v for v in X) / 4
        denom = math.sqrt(second + EPS)
        assert f"{label}: mu" not in steps and f"{label}: beta" not in steps
        check(steps[f"{label}: ms"], [second])
    z_hat = [(v - mu) / denom for v in X]
    check(steps[f"{label}: {denom_title}"], [denom])
    check(steps[f"{label}: z_hat"], z_hat)
    check(steps[f"{label}: gamma"], gamma, "gamma")  # gamma as given, whatever the kind's offset
    check(steps[f"{label}: output"], [g * z for g, z in zip(gamma, z_hat, strict=True)])


def test_olmos_norm_without_parameters_step_by_step(capsys) -> None:
    """nonparametric: LayerNorm's mu, var and z_hat, no gamma or beta steps, and z_hat is the output."""
    steps = explain(capsys, "norm", "4,2,0,-2", "--norm", "nonparametric")
    label = "LayerNorm (no parameters)"
    denom = math.sqrt(5.0 + EPS)
    check(steps[f"{label}: mu"], [1.0])
    check(steps[f"{label}: var"], [5.0])
    assert f"{label}: gamma" not in steps and f"{label}: beta" not in steps
    check(steps[f"{label}: output"], [(v - 1.0) / denom for v in X])


def test_no_norm_passes_the_vector_through(capsys) -> None:
    steps = explain(capsys, "norm", "4,2,0,-2", "--norm", "none")
    assert list(steps) == ["input", "output"]
    check(steps["output"], X)


def _phi(v: float) -> float:
    return 0.5 * (1 + math.erf(v / math.sqrt(2)))


def _gelu_tanh(v: float) -> float:
    return 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)))


HAND_ACTIVATIONS = {  # each kind's value (a gated kind's gate) by hand
    "relu": lambda v: max(0.0, v),
    "gelu": lambda v: v * _phi(v),
    "gelu_tanh": _gelu_tanh,
    "gelu_sigmoid": lambda v: v / (1 + math.exp(-1.702 * v)),
    "relu2": lambda v: max(0.0, v) ** 2,
    "swiglu": lambda v: v / (1 + math.exp(-v)),
    "geglu": lambda v: v * _phi(v),
    "geglu_tanh": _gelu_tanh,
}


def test_every_activation_kind_element_by_element(capsys) -> None:
    x = [4.0, 2.0, 0.0, -2.0, -0.5, 0.75]
    steps = explain(capsys, "activation", "4,2,0,-2,-0.5,0.75")
    assert list(steps) == ["x", *HAND_ACTIVATIONS]  # every kind the library has, in its table's order
    check(steps["x"], x)
    for name, f in HAND_ACTIVATIONS.items():
        check(steps[name], [f(v) for v in x], name)
    one = explain(capsys, "activation", "4,2,0,-2", "--activation", "gelu_tanh,relu")
    assert list(one) == ["x", "gelu_tanh", "relu"]


def _write(path: Path, w: dict[str, torch.Tensor]) -> str:
    path.write_text(json.dumps({k: v.tolist() for k, v in w.items()}))
    return str(path)


def test_the_tutorial_models_ffn_with_weights_from_a_json_file(tmp_path: Path, capsys) -> None:
    w = weights()
    x = torch.linspace(-1.5, 2.0, D, dtype=torch.float64)
    text = "[" + ", ".join(f"{v:.17g}" for v in x.tolist()) + "]"  # a leading minus inside brackets
    steps = explain(capsys, "ffn", text, "--preset", "tutorial", "--weights", _write(tmp_path / "t.json", w))
    hidden = x @ w["blocks.0.ffn.W1"].T + w["blocks.0.ffn.b1"]
    act = torch.where(hidden > 0, hidden, torch.zeros(()))
    out = act @ w["blocks.0.ffn.W2"].T + w["blocks.0.ffn.b2"]
    assert list(steps) == ["x", "W1 x + b1", "activation", "W2 h + b2 = FFN(x)"]
    check(steps["x"], x.tolist())
    assert len(steps["W1 x + b1"][0][1]) == DFF  # all 64 printed number by number
    check(steps["W1 x + b1"], hidden.tolist())
    check(steps["activation"], act.tolist())
    check(steps["W2 h + b2 = FFN(x)"], out.tolist())


def test_a_gated_ffn_shows_its_linear_branch_and_gate(tmp_path: Path, capsys) -> None:
    g = torch.Generator().manual_seed(3)
    w = {k: v for k, v in weights().items()}
    w["blocks.0.ffn.W3"] = (torch.randn(DFF, D, generator=g, dtype=torch.float64) * 0.5).float().double()
    w["blocks.0.ffn.b3"] = (torch.randn(DFF, generator=g, dtype=torch.float64) * 0.5).float().double()
    x = torch.linspace(2.0, -1.0, D, dtype=torch.float64)
    steps = explain(capsys, "ffn", ",".join(f"{v:.17g}" for v in x.tolist()), "--activation", "swiglu",
                    "--weights", _write(tmp_path / "t.json", w))
    h1 = x @ w["blocks.0.ffn.W1"].T + w["blocks.0.ffn.b1"]
    h3 = x @ w["blocks.0.ffn.W3"].T + w["blocks.0.ffn.b3"]
    gate = h1 / (1 + torch.exp(-h1))
    assert list(steps) == ["x", "W1 x + b1", "W3 x", "gate silu(W1 x + b1)", "activation",
                           "W2 h + b2 = FFN(x)"]
    check(steps["W3 x"], h3.tolist())
    check(steps["gate silu(W1 x + b1)"], gate.tolist())
    check(steps["activation"], (gate * h3).tolist())
    check(steps["W2 h + b2 = FFN(x)"], ((gate * h3) @ w["blocks.0.ffn.W2"].T + w["blocks.0.ffn.b2"]).tolist())


@pytest.mark.parametrize("argv, message", [
    (["ffn", "1,2,3,4"], "the vector has 4 numbers; the FFN reads d_model = 16: give 16"),
    (["norm", "4,x,0"], "'x' in '4,x,0' is not a number; give numbers separated by commas, e.g. 4,2,0,-2"),
    (["norm", "4,inf"], "'inf' in '4,inf' is not a finite number"),
    (["layernorm", "4,2"],
     "unknown value 'layernorm'; did you mean norm? (choose from norm, activation, ffn)"),
    (["norm", "4,2", "--norm", "layer"], "(choose from standard, eps_outside_sqrt, rms, rms_plus_one, "
                                         "nonparametric, batch, none)"),
    (["norm", "4,2", "--norm", "batch"],
     "norm='batch' (BatchNorm) normalises each feature over a batch, not one vector; a vector goes through: "
     "standard, eps_outside_sqrt, rms, rms_plus_one, nonparametric, none"),
    (["norm", "4,2", "--norm", "rms", "--beta", "1,1"], "norm='rms' (RMSNorm) has no beta"),
    (["norm", "4,2,0", "--gamma", "1,2"], "gamma has 2 numbers; the vector has 3: give 3"),
    (["norm", "4,2", "--eps", "0"], "--eps 0 must be > 0"),
    (["activation", "4,2", "--activation", "gelu,tanh"],
     "activation='tanh' is not one of: relu, gelu, gelu_tanh, gelu_sigmoid, relu2, swiglu, geglu, "
     "geglu_tanh"),
    (["activation", "4,2", "--eps", "0.1"], "--eps applies to 'explain norm', not to 'explain activation'"),
    (["norm", "4,2", "--weights", "w.json"],
     "--weights applies to 'explain ffn', not to 'explain norm'"),
    (["ffn", ",".join(["1"] * 16), "--activation", "relu,gelu"],
     "--activation names one activation for 'explain ffn', not 2"),
    (["ffn", ",".join(["1"] * 16), "--block", "1"], "--block 1: the model has 1 blocks, 0 to 0"),
])
def test_refusals_name_what_is_allowed(capsys, argv: list[str], message: str) -> None:
    assert main(["explain", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("blocklab: error: ") and err.count("\n") == 1
    assert message in err


def test_json_holds_the_same_steps(capsys) -> None:
    assert main(["explain", "norm", "4,2,0,-2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    steps = {s["title"]: s["values"] for s in data["steps"]}
    assert steps["LayerNorm: mu"] == [[1.0]] and steps["LayerNorm: var"] == [[5.0]]
    assert steps["LayerNorm: sqrt(var+eps)"] == [[math.sqrt(5.0 + EPS)]]
