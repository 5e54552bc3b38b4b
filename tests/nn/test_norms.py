"""LayerNorm variants against nn.LayerNorm / nn.RMSNorm / the formulas of docs/concepts.md, values and
gradients."""

import pytest
import torch
from torch import nn

from blocklab import LayerNorm
from blocklab.nn.norms import NoNorm, build_norm, layer_norm_stats

TOL = {torch.float64: 1e-10, torch.float32: 1e-5}


def randomize(module: nn.Module) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("eps", [1e-5, 1e-12, 0.1])
@pytest.mark.parametrize("bias", [True, False])
def test_standard_matches_torch_layernorm(dtype, eps, bias) -> None:
    ours = LayerNorm(32, eps=eps, bias=bias, dtype=dtype)
    randomize(ours)
    ref = nn.LayerNorm(32, eps=eps, bias=bias, dtype=dtype)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(3, 5, 32, dtype=dtype) * 3 + 1
    torch.testing.assert_close(ours(x), ref(x), rtol=0, atol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_rms_matches_torch_rmsnorm(dtype) -> None:
    ours = LayerNorm(32, eps=1e-6, variant="rms", dtype=dtype)
    randomize(ours)
    assert set(ours.state_dict()) == {"weight"}  # gamma only
    ref = nn.RMSNorm(32, eps=1e-6, dtype=dtype)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(4, 7, 32, dtype=dtype)
    torch.testing.assert_close(ours(x), ref(x), rtol=0, atol=TOL[dtype])


def _values_and_grads(norm, x: torch.Tensor, g: torch.Tensor) -> list[torch.Tensor]:
    x = x.detach().requires_grad_()
    out = norm(x)
    return [out, *torch.autograd.grad(out, [x, norm.weight], g)]


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("d", [64, 256, 4096])
def test_rms_values_and_gradients_match_torch_rmsnorm_on_both_paths(fused, d) -> None:
    """Issue 38: the CPU kernels (one reduction forward, LayerNorm's backward kernel at mean 0 plus the
    mean(g gamma) term) against torch's own nn.RMSNorm, float32 and float64, d 64 to 4096."""
    for dtype, atol in ((torch.float64, 1e-12), (torch.float32, 2e-5)):
        ours = LayerNorm(d, eps=1e-6, variant="rms", dtype=dtype, fused=fused)
        randomize(ours)
        ref = nn.RMSNorm(d, eps=1e-6, dtype=dtype)
        ref.load_state_dict(ours.state_dict())
        x, g = torch.randn(3, 5, d, dtype=dtype) * 2 + 0.5, torch.randn(3, 5, d, dtype=dtype)
        for got, want in zip(_values_and_grads(ours, x, g), _values_and_grads(ref, x, g), strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=atol * max(1.0, want.abs().max().item()))


@pytest.mark.parametrize("fused", [True, False])
def test_rms_in_bfloat16_is_within_its_rounding(fused) -> None:
    """bfloat16 output and gradients against float64 autograd of the formula: the error of each is at
    most 2x that of torch's nn.RMSNorm in bfloat16 on the same numbers (its rounding), and small."""
    d = 256
    x, g = torch.randn(4096, d) * 3, torch.randn(4096, d)  # many rows: dgamma sums over them
    ours = LayerNorm(d, eps=1e-6, variant="rms", fused=fused)
    randomize(ours)
    gamma = ours.weight.detach().double().requires_grad_()
    x64 = x.double().requires_grad_()
    out64 = x64 * torch.rsqrt(x64.square().mean(-1, keepdim=True) + 1e-6) * gamma
    exact = [out64, *torch.autograd.grad(out64, [x64, gamma], g.double())]
    ref = nn.RMSNorm(d, eps=1e-6, dtype=torch.bfloat16)
    ref.load_state_dict(ours.state_dict())
    bf = (x.bfloat16(), g.bfloat16())
    got = _values_and_grads(ours.to(torch.bfloat16), *bf)
    peer = _values_and_grads(ref, *bf)
    for name, a, b, e in zip(("out", "dx", "dgamma"), got, peer, exact, strict=True):
        assert a.dtype == torch.bfloat16
        scale = e.abs().max().item()
        err, peer_err = ((t.double() - e).abs().max().item() / scale for t in (a, b))
        assert err <= 2 * peer_err + 2**-8 and err < 0.05, (name, err, peer_err)


def test_eps_outside_sqrt_matches_its_formula() -> None:
    ln = LayerNorm(16, eps=0.5, variant="eps_outside_sqrt", dtype=torch.float64)
    randomize(ln)
    x = torch.randn(2, 3, 16, dtype=torch.float64)
    std = x.std(-1, unbiased=False, keepdim=True)
    expected = (x - x.mean(-1, keepdim=True)) / (std + 0.5) * ln.weight + ln.bias
    torch.testing.assert_close(ln(x), expected, rtol=0, atol=1e-12)
    # and it differs from the standard form: the variants are not silently the same
    assert (ln(x) - LayerNorm(16, eps=0.5, dtype=torch.float64).to(torch.float64)(x)).abs().max() > 1e-3


def test_worked_example_from_spec() -> None:
    ln = LayerNorm(4, eps=1e-5, dtype=torch.float64)
    z = torch.tensor([4.0, 2.0, 0.0, -2.0], dtype=torch.float64)
    stats = ln.stats(z)
    assert stats.mu.item() == 1.0 and stats.var.item() == 5.0
    torch.testing.assert_close(
        ln(z),
        torch.tensor([1.341639, 0.447213, -0.447213, -1.341639], dtype=torch.float64),
        rtol=0,
        atol=1e-6,
    )


def test_output_variance_is_var_over_var_plus_eps() -> None:
    # docs/concepts.md#layer-normalization: var = 0.01186, eps = 1e-5 gives output variance 0.99916,
    # the effect of eps, not of dividing by d instead of d-1 (both variances here divide by d).
    d = 64
    z = torch.randn(d, dtype=torch.float64)
    z = (z - z.mean()) / z.std(unbiased=False) * 0.01186**0.5 + 3.0
    out = LayerNorm(d, eps=1e-5, dtype=torch.float64)(z)
    out_var = out.var(unbiased=False).item()
    assert out.mean().abs().item() < 1e-12
    assert out_var == pytest.approx(0.01186 / (0.01186 + 1e-5), abs=1e-12)
    assert round(out_var, 5) == 0.99916
    stats = layer_norm_stats(z, 1e-5)
    torch.testing.assert_close(stats.denom, torch.sqrt(stats.var + 1e-5))


@pytest.mark.parametrize("variant", ["standard", "eps_outside_sqrt", "rms"])
@pytest.mark.parametrize("bias", [True, False])
def test_gradcheck(variant, bias) -> None:
    ln = LayerNorm(6, eps=1e-3, variant=variant, bias=bias, dtype=torch.float64)
    randomize(ln)
    x = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, *p: ln(x), (x, *ln.parameters()))


def test_backward_equals_spec_formula_with_the_last_term() -> None:
    ln = LayerNorm(10, eps=1e-5, dtype=torch.float64)
    randomize(ln)
    z = torch.randn(4, 10, dtype=torch.float64, requires_grad=True)
    g = torch.randn(4, 10, dtype=torch.float64)
    ln(z).backward(g)
    with torch.no_grad():
        mu = z.mean(-1, keepdim=True)
        var = ((z - mu) ** 2).mean(-1, keepdim=True)
        z_hat = (z - mu) / torch.sqrt(var + 1e-5)
        gh = g * ln.weight
        dz = (gh - gh.mean(-1, keepdim=True) - z_hat * (gh * z_hat).mean(-1, keepdim=True)) / torch.sqrt(
            var + 1e-5
        )
        dz_without_last_term = (gh - gh.mean(-1, keepdim=True)) / torch.sqrt(var + 1e-5)
    torch.testing.assert_close(z.grad, dz, rtol=0, atol=1e-12)
    torch.testing.assert_close(ln.weight.grad, (g * z_hat).sum(0), rtol=0, atol=1e-12)
    torch.testing.assert_close(ln.bias.grad, g.sum(0), rtol=0, atol=1e-12)
    assert (z.grad - dz_without_last_term).abs().max() > 1e-3  # the texts that drop it are wrong


def test_parameter_count_and_keys() -> None:
    ln = LayerNorm(64)
    assert sum(p.numel() for p in ln.parameters()) == 128
    assert set(ln.state_dict()) == {"weight", "bias"}
    assert set(LayerNorm(64, bias=False).state_dict()) == {"weight"}


def test_bfloat16_runs_close_to_float32() -> None:
    x = torch.randn(2, 5, 32)
    ln = LayerNorm(32)
    out = ln.to(torch.bfloat16)(x.to(torch.bfloat16))
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), nn.LayerNorm(32)(x), rtol=0, atol=0.05)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="variant='batchy'"):
        LayerNorm(8, variant="batchy")
    with pytest.raises(ValueError, match="eps=0"):
        LayerNorm(8, eps=0)
    assert isinstance(build_norm("none", 8, 1e-5, True), NoNorm)
