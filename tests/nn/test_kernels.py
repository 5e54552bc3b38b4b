"""The memory-lean functions of blocklab/nn/kernels.py: gradcheck in float64, the LayerNorm backward of
docs/concepts.md#layer-normalization against ATen's kernel and float64 autograd, fused vs unfused blocks
for every activation and norm, gradients against nn.TransformerEncoderLayer, hooks, activation
checkpointing, saved-tensor counts."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd import gradcheck

from blocklab import ModelConfig, Transformer, TransformerBlock
from blocklab.bench.footprint import LiveBytes, saved_activations
from blocklab.nn.activations import ACTIVATION_NAMES, is_gated
from blocklab.nn.kernels import act_kernel, act_linear, layer_norm, norm_linear, residual_norm_linear
from blocklab.nn.norm_kernels import layer_norm_backward, norm_kernel
from blocklab.nn.norm_kinds import NORM_KINDS
from blocklab.nn.norms import NORM_VARIANTS, LayerNorm

f64 = torch.float64


def rand(*shape: int, requires_grad: bool = True) -> torch.Tensor:
    return torch.randn(*shape, dtype=f64, requires_grad=requires_grad)


def norm_params(variant: str, d: int, bias: bool) -> tuple:
    gamma = (1 + 0.3 * torch.randn(d, dtype=f64)).requires_grad_()
    beta = rand(d) if bias and NORM_KINDS[variant].bias else None  # RMSNorm's kinds have none
    return gamma, beta


# ---- gradcheck of each function, float64 ----------------------------------------------------


@pytest.mark.parametrize("variant", NORM_VARIANTS)
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_function_gradcheck(variant, bias) -> None:
    gamma, beta = norm_params(variant, 6, bias)
    kernel = norm_kernel(variant, 1e-3)
    inputs = [t for t in (rand(2, 3, 6), gamma, beta) if t is not None]
    assert gradcheck(lambda x, g, *b: layer_norm(x, kernel, g, b[0] if b else None), inputs)


@pytest.mark.parametrize("variant", [*NORM_VARIANTS, None])
@pytest.mark.parametrize(("n_weights", "bias"), [(1, True), (3, False)])
def test_norm_linear_gradcheck(variant, n_weights, bias) -> None:
    gamma, beta = norm_params(variant or "standard", 5, True) if variant else (None, None)
    kernel = norm_kernel(variant, 1e-3) if variant else None
    weights = [rand(4, 5) for _ in range(n_weights)]
    b = rand(4 * n_weights) if bias else None

    def f(x, *ws):
        return norm_linear(x, kernel, gamma, beta, ws, b)

    x = rand(2, 3, 5)
    assert gradcheck(f, (x, *weights))
    if variant:  # and the norm's and the bias's parameters
        assert gradcheck(lambda g: norm_linear(x, kernel, g, beta, weights, b), (gamma,))
    if b is not None:
        assert gradcheck(lambda bb: norm_linear(x, kernel, gamma, beta, weights, bb), (b,))


@pytest.mark.parametrize("variant", NORM_VARIANTS)
@pytest.mark.parametrize(("alpha", "used"), [(1.0, "s"), (1.6818, "z")])  # pre-norm, post-norm deepnorm
def test_residual_norm_linear_gradcheck(variant, alpha, used) -> None:
    gamma, beta = norm_params(variant, 5, True)
    kernel = norm_kernel(variant, 1e-3)
    projections = [rand(5, requires_grad=False), rand(5, requires_grad=False)]

    def f(x, c, wo, bo, g, w1, w3, b):  # two weights, as for a gated FFN: two outputs h1, h3
        s, z, h1, h3 = residual_norm_linear(x, c, wo, bo, alpha, kernel, g, beta, [w1, w3], b)
        kept = s * projections[0] if used == "s" else z * projections[1]
        return kept.sum() + h1.square().sum() + h3.sin().sum()

    inputs = (rand(2, 3, 5), rand(2, 3, 5), rand(5, 5), rand(5), gamma, rand(4, 5), rand(3, 5), rand(7))
    assert gradcheck(f, inputs)


@pytest.mark.parametrize("activation", ACTIVATION_NAMES)
def test_act_linear_gradcheck(activation) -> None:
    kernel = act_kernel(activation)
    h = [rand(2, 3, 4) for _ in range(2 if is_gated(activation) else 1)]  # gated: h1, h3
    with torch.no_grad():  # keep relu/relu2 away from their kink at 0, where finite differences lie
        for t in h:
            t.add_(0.2 * torch.sign(t))
    assert gradcheck(lambda w, b, *h: act_linear(h, kernel, w, b), (rand(5, 4), rand(5), *h))


# ---- the LayerNorm backward of docs/concepts.md#layer-normalization against independent oracles ----


def test_layer_norm_backward_formula_equals_aten_kernel() -> None:
    x, g, gamma, beta = rand(4, 7, 16), rand(4, 7, 16), rand(16), rand(16)
    _, mean, rstd = torch.native_layer_norm(x, (16,), gamma, beta, 1e-5)
    expected = torch.ops.aten.native_layer_norm_backward(g, x, (16,), mean, rstd, gamma, beta, [True] * 3)
    for got, want in zip(layer_norm_backward(g, x, mean, rstd, gamma), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def autograd_norm(variant: str, x, gamma, beta, eps):
    """The variant's forward written as plain float64 tensor ops (autograd differentiates it), as its
    record says: centred or not (RMSNorm), eps inside or outside the root. The kernels take gamma as
    given (a kind's offset, Gemma's 1 + w, is the module's)."""
    kind = NORM_KINDS[variant]
    centred = x - x.mean(-1, keepdim=True) if kind.centres else x
    sigma2 = centred.square().mean(-1, keepdim=True)  # the mean square when not centred
    denom = torch.sqrt(sigma2 + eps) if kind.eps_inside_root else torch.sqrt(sigma2) + eps
    z_hat = centred / denom
    out = z_hat * gamma
    return out + beta if beta is not None else out


@pytest.mark.parametrize("variant", NORM_VARIANTS)
def test_norm_kernels_match_float64_autograd(variant) -> None:
    eps = 0.05  # large, so eps_outside_sqrt differs visibly from standard
    gamma, beta = norm_params(variant, 12, True)
    x, g = rand(3, 5, 12), torch.randn(3, 5, 12, dtype=f64)
    wrt = [t for t in (x, gamma, beta) if t is not None]
    expected = torch.autograd.grad(autograd_norm(variant, x, gamma, beta, eps), wrt, g)
    got = torch.autograd.grad(layer_norm(x, norm_kernel(variant, eps), gamma, beta), wrt, g)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-11)


def test_layer_norm_backward_without_the_last_term_is_wrong() -> None:
    """The formula's z_hat * mean(gh * z_hat) term matters (texts that drop it are wrong)."""
    x, g, gamma = rand(3, 8), rand(3, 8), rand(8)
    _, mean, rstd = torch.native_layer_norm(x, (8,), gamma, None, 1e-5)
    full = layer_norm_backward(g, x, mean, rstd, gamma)[0]
    dropped = rstd * (g * gamma - (g * gamma).mean(-1, keepdim=True))
    assert (full - dropped).abs().max() > 1e-2


# ---- fused vs unfused, every activation and norm variant, float32 ----------------------------


def pair(**fields) -> tuple[TransformerBlock, TransformerBlock]:
    """(fused block, unfused block) with the same random weights."""
    config = ModelConfig(d_model=16, n_heads=2, d_ff=24, max_seq_len=6, **{"fused": True, **fields})
    fused, plain = TransformerBlock(config), TransformerBlock(config.replace(fused=False))
    with torch.no_grad():
        for p in fused.parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.dim() == 1 and p.shape[0] == 16 else 0.0))
    plain.load_state_dict(fused.state_dict())
    return fused, plain


def outputs_and_grads(block: nn.Module, x: torch.Tensor, g: torch.Tensor) -> list[torch.Tensor]:
    x = x.clone().requires_grad_()
    out = block(x)
    return [out, *torch.autograd.grad(out, [x, *block.parameters()], g)]


EVERY_ACTIVATION_AND_NORM = [("pre", a, n) for a in ACTIVATION_NAMES for n in NORM_VARIANTS]
OTHER_WIRINGS = [(p, a, n) for p, a in (("post", "gelu"), ("sandwich", "relu")) for n in NORM_VARIANTS]


@pytest.mark.parametrize(("position", "activation", "norm"), EVERY_ACTIVATION_AND_NORM + OTHER_WIRINGS)
def test_fused_block_equals_unfused(position, activation, norm) -> None:
    residual = "deepnorm" if position == "post" and norm == "standard" else "add"
    fused, plain = pair(activation=activation, norm=norm, norm_position=position, residual=residual,
                        bias=norm != "eps_outside_sqrt")
    x, g = torch.randn(3, 6, 16), torch.randn(3, 6, 16)
    got, expected = outputs_and_grads(fused, x, g), outputs_and_grads(plain, x, g)
    # 1e-5 of the gradients' scale: they reach ~50 here, and float32 rounding alone (unfused vs
    # float64) is ~3e-5 at that size, also on k's bias, whose exact gradient is 0
    scale = max(1.0, *(t.abs().max().item() for t in expected))
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5 * scale)


def test_fused_wiring_is_chosen_only_where_it_applies() -> None:
    base = ModelConfig(d_model=16, n_heads=2, fused=True)
    for on in (dict(norm_position="pre"), dict(norm_position="post", residual="deepnorm")):
        assert base.replace(**on).uses_lean_path and TransformerBlock(base.replace(**on)).uses_lean_path, on
    for off in (dict(fused=False), dict(norm_position="sandwich"), dict(dropout=0.1), dict(norm="none"),
                dict(norm="batch"), dict(residual="none"), dict(fused="auto")):
        assert not base.replace(**off).uses_lean_path, off
        assert not TransformerBlock(base.replace(**off)).uses_lean_path, off


# ---- against an independent oracle: gradients of nn.TransformerEncoderLayer ------------------


def torch_layer_from(block: TransformerBlock) -> nn.TransformerEncoderLayer:
    c = block.config
    layer = nn.TransformerEncoderLayer(c.d_model, c.n_heads, c.d_ff, dropout=0.0, activation="gelu",
                                       batch_first=True, norm_first=c.norm_position == "pre", dtype=f64)
    a = block.attn
    with torch.no_grad():
        layer.self_attn.in_proj_weight.copy_(torch.cat(a.qkv_weights()))
        layer.self_attn.in_proj_bias.copy_(a.qkv_bias())
        pairs = ((layer.self_attn.out_proj, a.o), (layer.linear1, block.ffn.w1),
                 (layer.linear2, block.ffn.w2), (layer.norm1, block.ln1), (layer.norm2, block.ln2))
        for theirs, ours in pairs:
            theirs.weight.copy_(ours.weight)
            theirs.bias.copy_(ours.bias)
    return layer


@pytest.mark.parametrize("position", ["pre", "post"])
def test_fused_block_gradients_match_torch_encoder_layer(position) -> None:
    block = pair(activation="gelu", norm_position=position)[0].to(f64)
    layer = torch_layer_from(block)
    x, g = rand(2, 6, 16, requires_grad=False), torch.randn(2, 6, 16, dtype=f64)
    ours = outputs_and_grads(block, x, g)
    theirs = outputs_and_grads(layer, x, g)
    torch.testing.assert_close(ours[:2], theirs[:2], rtol=0, atol=1e-10)  # output and dL/dx
    w = dict(zip([n for n, _ in block.named_parameters()], ours[2:], strict=True))
    t = dict(zip([n for n, _ in layer.named_parameters()], theirs[2:], strict=True))
    expected_qkv = torch.cat([w["attn.q.weight"], w["attn.k.weight"], w["attn.v.weight"]])
    torch.testing.assert_close(expected_qkv, t["self_attn.in_proj_weight"], rtol=0, atol=1e-10)
    for ours_name, theirs_name in (("ffn.w1.weight", "linear1.weight"), ("ffn.w2.bias", "linear2.bias"),
                                   ("ln1.weight", "norm1.weight"), ("ln2.bias", "norm2.bias"),
                                   ("attn.o.weight", "self_attn.out_proj.weight")):
        torch.testing.assert_close(w[ours_name], t[theirs_name], rtol=0, atol=1e-10)


# ---- hooks still see every stage --------------------------------------------------------------


def test_hooks_see_the_same_values_on_a_fused_block() -> None:
    fused, _ = pair(activation="gelu", norm_position="pre")
    x = torch.randn(2, 6, 16)
    out_fused = fused(x)
    out_hooked, cache = fused.run_with_cache(x, names=["ln1", "ffn.hidden", "ffn.act"])
    torch.testing.assert_close(out_hooked, out_fused, rtol=0, atol=1e-6)
    ln1 = F.layer_norm(x, (16,), fused.ln1.weight, fused.ln1.bias, 1e-5)
    torch.testing.assert_close(cache["ln1"], ln1, rtol=0, atol=1e-6)
    a = fused.attn
    y = x + F.multi_head_attention_forward(
        ln1.transpose(0, 1), ln1.transpose(0, 1), ln1.transpose(0, 1), 16, 2, torch.cat(a.qkv_weights()),
        a.qkv_bias(), None, None, False, 0.0, a.o.weight, a.o.bias, need_weights=False)[0].transpose(0, 1)
    hidden = F.linear(F.layer_norm(y, (16,), fused.ln2.weight, fused.ln2.bias, 1e-5), fused.ffn.w1.weight,
                      fused.ffn.w1.bias)
    torch.testing.assert_close(cache["ffn.hidden"], hidden, rtol=0, atol=1e-5)
    torch.testing.assert_close(cache["ffn.act"], F.gelu(hidden), rtol=0, atol=1e-5)


def test_patching_hook_changes_the_output_of_a_fused_block() -> None:
    fused, _ = pair(activation="relu", norm_position="pre")
    x = torch.randn(2, 6, 16)
    _, cache = fused.run_with_cache(x, names=["resid_mid"])
    with fused.hooks({"ffn.act": lambda a, name: torch.zeros_like(a)}):
        ablated = fused(x)  # with its activation zeroed, the FFN adds only its output bias
    torch.testing.assert_close(ablated, cache["resid_mid"] + fused.ffn.w2.bias, rtol=0, atol=1e-6)


# ---- activation checkpointing -----------------------------------------------------------------


@pytest.mark.parametrize("fused", [True, False])
def test_checkpointed_blocks_give_the_same_gradients(fused) -> None:
    config = ModelConfig(vocab_size=11, max_seq_len=6, d_model=16, n_heads=2, n_layers=3, d_ff=32,
                         norm_position="pre", activation="gelu", fused=fused)
    plain, ckpt = Transformer(config), Transformer(config.replace(checkpoint_blocks=True))
    ckpt.load_state_dict(plain.state_dict())
    tokens = torch.randint(0, 11, (2, 6))
    grads = []
    for model in (plain, ckpt):
        _, loss = model(tokens, targets=tokens)
        grads.append([loss, *torch.autograd.grad(loss, list(model.parameters()))])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_checkpointed_blocks_with_hooks_attached_give_the_plain_gradients() -> None:
    """Hooks (run_with_cache, diagnostics) turn checkpointing off for that call: a recompute without
    them would take another path (SDPA instead of the explicit attention the hooks asked for)."""
    config = ModelConfig(vocab_size=11, max_seq_len=6, d_model=16, n_heads=2, n_layers=2, d_ff=32,
                         norm_position="pre", activation="gelu", fused=True)
    plain, ckpt = Transformer(config), Transformer(config.replace(checkpoint_blocks=True))
    ckpt.load_state_dict(plain.state_dict())
    tokens = torch.randint(0, 11, (2, 6))
    names = ["blocks.0.attn.weights", "blocks.1.ffn.hidden"]
    grads = []
    for model in (plain, ckpt):
        (_, loss), cache = model.run_with_cache(tokens, targets=tokens, names=names, detach=False)
        grads.append(torch.autograd.grad(loss, [cache[n] for n in names] + list(model.parameters())))
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


@pytest.mark.parametrize("checkpoint_blocks", [False, True])
def test_a_checkpointed_stack_holds_only_the_block_boundaries(checkpoint_blocks) -> None:
    d, H, B, T, n = 16, 2, 2, 6, 4
    config = ModelConfig(d_model=d, n_heads=H, d_ff=4 * d, max_seq_len=T, norm_position="pre",
                         checkpoint_blocks=checkpoint_blocks, fused=True)
    stack = nn.Sequential(*(TransformerBlock(config) for _ in range(n)))
    x = torch.randn(B, T, d, requires_grad=True)
    with LiveBytes() as live:
        out = stack(x)  # noqa: F841 - held, as a loss would be
        held = live.live
    # checkpointed: the inputs of blocks 2..n and the output, d floats each per token;
    # plain: every block keeps 9d + H, its input x shared with the previous block's output
    per_token = n * d if checkpoint_blocks else n * (9 * d + H)
    assert held == 4 * B * T * per_token


# ---- what the fused block keeps: a hand count -----------------------------------------------


@pytest.mark.parametrize("activation", ["gelu", "relu", "swiglu"])
def test_fused_pre_norm_block_saves_9d_plus_heads_floats_per_token(activation) -> None:
    d, H, B, T, d_ff = 32, 4, 2, 8, 128  # d_ff = 4d, as in the target shape
    config = ModelConfig(d_model=d, n_heads=H, d_ff=d_ff if activation != "swiglu" else 64, max_seq_len=T,
                         norm_position="pre", activation=activation, fused=True)
    block = TransformerBlock(config)
    saved, _ = saved_activations(block, block, torch.randn(B, T, d, requires_grad=True))
    # x (d) + q, k, v (3d, one storage) + SDPA out = head concat (d) + lse (H) + h (4d; swiglu: 2 x 2d)
    assert saved.nbytes == 4 * B * T * (9 * d + H)


def test_fused_ffn_keeps_its_input_and_pre_activation_only() -> None:
    from blocklab import FeedForward

    ffn = FeedForward(16, 40, "gelu")
    x = torch.randn(3, 5, 16, requires_grad=True)
    saved, _ = saved_activations(ffn, ffn, x)
    assert saved.nbytes == 4 * 15 * (16 + 40)  # x and h; act(h) is recomputed in backward
    plain = FeedForward(16, 40, "gelu", fused=False)
    assert saved_activations(plain, plain, x)[0].nbytes == 4 * 15 * (16 + 40 + 40)


@pytest.mark.parametrize("fused", [True, False])
def test_rms_and_eps_outside_norms_keep_their_input_and_statistics_as_aten_layer_norm_does(fused) -> None:
    """x, and per row rstd (and mean where the kind centres): what F.layer_norm keeps, counted here too."""
    x = torch.randn(4, 9, 16, requires_grad=True)
    standard = LayerNorm(16, variant="standard")
    assert saved_activations(standard, standard, x)[0].nbytes == 4 * 4 * 9 * (16 + 2)  # ATen's: x, mean, rstd
    for variant, stats in (("rms", 1), ("eps_outside_sqrt", 2)):
        ln = LayerNorm(16, variant=variant, fused=fused)
        if variant == "eps_outside_sqrt" and not fused:
            continue  # the module path's explicit math: autograd keeps what its ops need
        assert saved_activations(ln, ln, x)[0].nbytes == 4 * 4 * 9 * (16 + stats)


def test_fused_block_runs_in_bfloat16() -> None:
    fused, plain = pair(activation="gelu", norm_position="pre")
    x, g = torch.randn(3, 6, 16), torch.randn(3, 6, 16)
    reference = outputs_and_grads(plain, x, g)
    low = outputs_and_grads(fused.to(torch.bfloat16), x.bfloat16(), g.bfloat16())
    scale = max(t.abs().max().item() for t in reference)
    for a, b in zip(low, reference, strict=True):
        assert a.dtype == torch.bfloat16
        # bfloat16 keeps 8 significant bits (0.4%); allow 1% of the gradients' scale
        torch.testing.assert_close(a.float(), b, rtol=0, atol=0.01 * scale)


# ---- the speed mode: keep the residual sum -----------------------------------------------------


@pytest.mark.parametrize(("position", "extra"), [("pre", 0), ("post", 1 * 32 + 2)])
def test_speed_mode_keeps_one_residual_sum_more_and_its_gradients_are_the_module_paths(position, extra):
    """keep_residual: the lean block saves the sum y (d floats per token) instead of recomputing it;
    pre-norm keeps 10d + H (post-norm also LN2's input, mean and rstd: 11d + H + 2); gradients as the
    module path's."""
    d, H, B, T = 32, 4, 2, 8
    config = ModelConfig(d_model=d, n_heads=H, d_ff=4 * d, max_seq_len=T, norm_position=position,
                         activation="gelu", fused=True, keep_residual=True)
    block = TransformerBlock(config)
    saved, _ = saved_activations(block, block, torch.randn(B, T, d, requires_grad=True))
    assert saved.nbytes == 4 * B * T * (10 * d + H + extra)
    speed = block.to(f64)
    plain = TransformerBlock(config.replace(fused=False, keep_residual=False)).to(f64)
    plain.load_state_dict(speed.state_dict())
    x, g = rand(B, T, d, requires_grad=False), torch.randn(B, T, d, dtype=f64)
    for a, b in zip(outputs_and_grads(speed, x, g), outputs_and_grads(plain, x, g), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_speed_mode_is_refused_where_no_lean_path_runs() -> None:
    with pytest.raises(ValueError, match="keep_residual=True .* norm_position='sandwich' has no lean wiring"):
        ModelConfig(d_model=16, n_heads=2, norm_position="sandwich", fused=True, keep_residual=True)
    with pytest.raises(ValueError, match="fused='auto' runs d_model=16 module by module"):
        ModelConfig(d_model=16, n_heads=2, keep_residual=True)


# ---- the path by shape: fused="auto" ------------------------------------------------------------


def test_auto_takes_the_lean_path_from_the_threshold_up_and_true_or_false_override_it() -> None:
    from blocklab.nn.config import LEAN_MIN_D_MODEL

    below, at = LEAN_MIN_D_MODEL - 16, LEAN_MIN_D_MODEL
    x = torch.randn(2, 8, at)  # T = 8: SDPA pads its log-sum-exp at shorter T
    cases = [(below, "auto", False), (at, "auto", True), (below, True, True), (at, False, False)]
    for d, fused, lean in cases:
        config = ModelConfig(d_model=d, n_heads=2, d_ff=4 * d, max_seq_len=8, norm_position="pre",
                             fused=fused)
        block = TransformerBlock(config)
        assert config.uses_lean_path is lean and block.uses_lean_path is lean, (d, fused)
        # observable: the lean block keeps 9d + H floats per token, the module path more
        kept = saved_activations(block, block, x[..., :d].contiguous().requires_grad_())[0].nbytes / (4 * 16)
        assert (kept == 9 * d + 2) is lean, (d, fused, kept / d)
