"""FeedForward against a plain float64 computation for every activation; counts and layout."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F

import blocklab as bl
from blocklab import FeedForward
from blocklab.nn.activations import ACTIVATION_NAMES

ORACLE = {  # independent formulas, not blocklab's table
    "relu": lambda h: torch.clamp(h, min=0),
    "gelu": lambda h: 0.5 * h * (1 + torch.erf(h / math.sqrt(2))),
    "gelu_tanh": lambda h: 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3))),
    "gelu_sigmoid": lambda h: h / (1 + torch.exp(-1.702 * h)),
    "relu2": lambda h: torch.clamp(h, min=0) ** 2,
    "swiglu": lambda h: h / (1 + torch.exp(-h)),
    "geglu": lambda h: 0.5 * h * (1 + torch.erf(h / math.sqrt(2))),
    "geglu_tanh": lambda h: 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3))),
}


def reference_ffn(ffn: FeedForward, x: torch.Tensor) -> torch.Tensor:
    h = x @ ffn.w1.weight.T + (ffn.w1.bias if ffn.w1.bias is not None else 0)
    a = ORACLE[ffn.activation](h)
    if ffn.w3 is not None:
        a = a * (x @ ffn.w3.weight.T + (ffn.w3.bias if ffn.w3.bias is not None else 0))
    return a @ ffn.w2.weight.T + (ffn.w2.bias if ffn.w2.bias is not None else 0)


@pytest.mark.parametrize("activation", ACTIVATION_NAMES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_matches_reference(activation, bias, dtype) -> None:
    ffn = FeedForward(16, 40, activation, bias=bias, dtype=dtype)
    with torch.no_grad():
        for p in ffn.parameters():
            p.normal_(0, 0.3)
    x = torch.randn(3, 5, 16, dtype=dtype)
    with torch.no_grad():  # the oracle always runs in float64 on the same weights
        expected = reference_ffn(copy.deepcopy(ffn).double(), x.double()).to(dtype)
    torch.testing.assert_close(ffn(x), expected, rtol=0, atol=1e-10 if dtype == torch.float64 else 1e-5)


@pytest.mark.parametrize("activation", ACTIVATION_NAMES)
def test_gradcheck(activation) -> None:
    ffn = FeedForward(4, 6, activation, dtype=torch.float64)
    x = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, *p: ffn(x), (x, *ffn.parameters()))


def test_position_wise_no_mixing_across_positions() -> None:
    ffn = FeedForward(8, 32, "gelu")
    x = torch.randn(2, 6, 8)
    y = x.clone()
    y[:, 3] += 10.0
    diff = (ffn(x) - ffn(y)).abs().amax(-1)  # (B, T)
    assert (diff[:, 3] > 1e-3).all()
    assert diff[:, [0, 1, 2, 4, 5]].max() == 0


def test_parameter_count_layout_and_keys() -> None:
    ffn = FeedForward(64, 256)
    assert sum(p.numel() for p in ffn.parameters()) == 33_088  # 2 d d_ff + d_ff + d
    shapes = {k: tuple(v.shape) for k, v in ffn.state_dict().items()}
    assert shapes == {"w1.weight": (256, 64), "w1.bias": (256,), "w2.weight": (64, 256), "w2.bias": (64,)}
    gated = FeedForward(64, 256, "swiglu", bias=False)
    assert {k: tuple(v.shape) for k, v in gated.state_dict().items()} == {
        "w1.weight": (256, 64), "w2.weight": (64, 256), "w3.weight": (256, 64)}


def test_relu_zeroes_about_half_the_hidden_units_at_init() -> None:
    ffn = FeedForward(64, 256, "relu")
    with torch.no_grad():
        h = F.linear(torch.randn(16, 32, 64), ffn.w1.weight, ffn.w1.bias)
    frac = (h <= 0).float().mean().item()
    assert 0.45 < frac < 0.55


def test_hooks_see_hidden_and_activation() -> None:
    ffn = FeedForward(8, 16, "gelu", dtype=torch.float64)
    seen = {}
    ffn.hook_hidden.fns.append(lambda t, n: seen.setdefault("hidden", t))
    ffn.hook_act.fns.append(lambda t, n: seen.setdefault("act", t))
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    ffn(x)
    torch.testing.assert_close(seen["hidden"], x @ ffn.w1.weight.T + ffn.w1.bias)
    torch.testing.assert_close(seen["act"], ORACLE["gelu"](seen["hidden"]))


def test_bad_d_ff() -> None:
    with pytest.raises(ValueError, match="d_ff=0"):
        FeedForward(8, 0)


@pytest.mark.parametrize("activation", ACTIVATION_NAMES)
def test_gate_is_the_gated_activations_factor_and_refused_otherwise(activation) -> None:
    ffn = FeedForward(8, 12, activation)
    h = torch.linspace(-3, 3, 7, dtype=torch.float64)
    if ffn.w3 is None:
        assert ffn.gate_name == ""
        with pytest.raises(ValueError, match=f"activation='{activation}' is not gated"):
            ffn.gate(h)
    else:  # act = gate(h1) * h3: the gate alone is the act with h3 = 1
        assert ffn.gate_name == {"swiglu": "silu", "geglu": "gelu", "geglu_tanh": "gelu_tanh"}[activation]
        torch.testing.assert_close(ffn.gate(h), ORACLE[activation](h), rtol=1e-12, atol=1e-12)


def test_without_autograd_the_fused_ffn_and_attention_concatenate_no_weights(monkeypatch) -> None:
    """Issue 38: generation (no autograd) concatenated W1 and W3 (and q, k, v on a prompt) on every call,
    for a fused one-matmul path whose only gain is what backward keeps. Without autograd they run one matmul
    per matrix: the same numbers, and the fused kernel is not reached; with autograd it still is."""
    from blocklab.nn import attention, feedforward

    calls: list[str] = []
    for module in (feedforward, attention):
        real = module.norm_linear
        monkeypatch.setattr(module, "norm_linear",
                            lambda *a, real=real, name=module.__name__: calls.append(name) or real(*a))
    torch.manual_seed(0)
    config = bl.ModelConfig(vocab_size=50, d_model=32, n_heads=4, n_layers=2, d_ff=48, activation="swiglu",
                            norm_position="sandwich", fused=True, dropout=0.0)
    model = bl.Transformer(config).eval()  # sandwich: no lean wiring, each module runs its own path
    tokens = torch.randint(0, 50, (2, 8))
    with torch.no_grad():
        inference = model(tokens)
    assert calls == []
    recorded = model(tokens)
    assert {"blocklab.nn.feedforward", "blocklab.nn.attention"} <= set(calls)
    torch.testing.assert_close(inference, recorded.detach(), rtol=0, atol=1e-6)
