"""TransformerBlock against nn.TransformerEncoderLayer, transformers' BertLayer and GPT2Block,
and float64 formulas for the variants PyTorch has no module for."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from blocklab import ModelConfig, TransformerBlock
from blocklab.nn.block import deepnorm_alpha

TOL = {torch.float64: 1e-10, torch.float32: 1e-5}


def randomize(module: nn.Module, std: float = 0.2) -> None:
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(
                torch.randn_like(p) * std
                + (1.0 if name.endswith("ln1.weight") or name.endswith("ln2.weight") else 0.0)
            )


def encoder_layer_from(
    block: TransformerBlock, norm_first: bool, activation: str
) -> nn.TransformerEncoderLayer:
    c = block.config
    layer = nn.TransformerEncoderLayer(
        c.d_model,
        c.n_heads,
        c.d_ff,
        dropout=0.0,
        activation=activation,
        layer_norm_eps=c.eps,
        batch_first=True,
        norm_first=norm_first,
        dtype=block.attn.q.weight.dtype,
    )
    sd = block.state_dict()
    with torch.no_grad():
        layer.self_attn.in_proj_weight.copy_(
            torch.cat([sd["attn.q.weight"], sd["attn.k.weight"], sd["attn.v.weight"]])
        )
        layer.self_attn.in_proj_bias.copy_(
            torch.cat([sd["attn.q.bias"], sd["attn.k.bias"], sd["attn.v.bias"]])
        )
        layer.self_attn.out_proj.weight.copy_(sd["attn.o.weight"])
        layer.self_attn.out_proj.bias.copy_(sd["attn.o.bias"])
        for ours, theirs in (
            ("ffn.w1", "linear1"),
            ("ffn.w2", "linear2"),
            ("ln1", "norm1"),
            ("ln2", "norm2"),
        ):
            getattr(layer, theirs).weight.copy_(sd[f"{ours}.weight"])
            getattr(layer, theirs).bias.copy_(sd[f"{ours}.bias"])
    return layer.eval()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(("position", "norm_first"), [("post", False), ("pre", True)])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("padded", [False, True])
def test_block_matches_torch_encoder_layer(dtype, position, norm_first, activation, padded) -> None:
    config = ModelConfig(d_model=32, n_heads=4, d_ff=48, activation=activation, norm_position=position)
    block = TransformerBlock(config).to(dtype)
    randomize(block)
    layer = encoder_layer_from(block, norm_first, activation)
    x = torch.randn(3, 6, 32, dtype=dtype)
    kpm = torch.tensor([[False] * 6, [False] * 4 + [True] * 2, [False] * 2 + [True] * 4]) if padded else None
    with torch.no_grad():
        expected = layer(x, src_key_padding_mask=kpm)
        got = block(x, kpm)
    if padded:  # PyTorch's fast path may zero padded rows; compare the real tokens
        keep = ~kpm
        torch.testing.assert_close(got[keep], expected[keep], rtol=0, atol=TOL[dtype])
    else:
        torch.testing.assert_close(got, expected, rtol=0, atol=TOL[dtype])


@pytest.mark.parametrize("position", ["post", "pre"])
def test_block_gradients_match_torch_encoder_layer(position) -> None:
    config = ModelConfig(d_model=16, n_heads=2, d_ff=24, activation="gelu", norm_position=position)
    block = TransformerBlock(config).double()
    randomize(block)
    layer = encoder_layer_from(block, position == "pre", "gelu").train()
    x = torch.randn(2, 5, 16, dtype=torch.float64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    g = torch.randn(2, 5, 16, dtype=torch.float64)
    block(x).backward(g)
    layer(x2).backward(g)
    torch.testing.assert_close(x.grad, x2.grad, rtol=0, atol=1e-10)
    torch.testing.assert_close(block.ffn.w1.weight.grad, layer.linear1.weight.grad, rtol=0, atol=1e-10)
    torch.testing.assert_close(block.ln2.weight.grad, layer.norm2.weight.grad, rtol=0, atol=1e-10)
    q_grad = layer.self_attn.in_proj_weight.grad[:16]
    torch.testing.assert_close(block.attn.q.weight.grad, q_grad, rtol=0, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_post_norm_block_matches_transformers_bert_layer(dtype) -> None:
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertLayer

    hf_config = BertConfig(
        hidden_size=32,
        num_attention_heads=4,
        intermediate_size=64,
        hidden_act="gelu",
        layer_norm_eps=1e-12,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        attn_implementation="eager",
    )
    bert = BertLayer(hf_config).to(dtype).eval()
    randomize(bert)
    block = TransformerBlock(ModelConfig(d_model=32, n_heads=4, d_ff=64, activation="gelu", eps=1e-12)).to(
        dtype
    )
    mapping = {
        "attn.q": "attention.self.query",
        "attn.k": "attention.self.key",
        "attn.v": "attention.self.value",
        "attn.o": "attention.output.dense",
        "ln1": "attention.output.LayerNorm",
        "ffn.w1": "intermediate.dense",
        "ffn.w2": "output.dense",
        "ln2": "output.LayerNorm",
    }
    hf = bert.state_dict()
    block.load_state_dict(
        {f"{ours}.{w}": hf[f"{theirs}.{w}"] for ours, theirs in mapping.items() for w in ("weight", "bias")}
    )
    x = torch.randn(2, 6, 32, dtype=dtype)
    lengths = torch.tensor([6, 4])
    keep = torch.arange(6)[None] < lengths[:, None]  # (B, T)
    additive = (~keep).to(dtype)[:, None, None, :] * torch.finfo(dtype).min  # BERT's extended mask
    with torch.no_grad():
        expected = bert(x, attention_mask=additive)[0]
        got = block(x, ~keep)
    torch.testing.assert_close(got[keep], expected[keep], rtol=0, atol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_pre_norm_causal_block_matches_transformers_gpt2_block(dtype) -> None:
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    hf_config = GPT2Config(
        n_embd=32,
        n_head=4,
        n_inner=128,
        activation_function="gelu_new",
        resid_pdrop=0.0,
        attn_pdrop=0.0,
        embd_pdrop=0.0,
        layer_norm_epsilon=1e-5,
        attn_implementation="eager",
    )
    gpt = GPT2Block(hf_config, layer_idx=0).to(dtype).eval()
    randomize(gpt)
    block = TransformerBlock(
        ModelConfig(d_model=32, n_heads=4, d_ff=128, activation="gelu_tanh", norm_position="pre", causal=True)
    ).to(dtype)
    hf = gpt.state_dict()
    qw, kw, vw = hf["attn.c_attn.weight"].T.chunk(3)  # Conv1D stores (in, out): transpose to nn.Linear
    qb, kb, vb = hf["attn.c_attn.bias"].chunk(3)
    block.load_state_dict(
        {
            "attn.q.weight": qw,
            "attn.k.weight": kw,
            "attn.v.weight": vw,
            "attn.q.bias": qb,
            "attn.k.bias": kb,
            "attn.v.bias": vb,
            "attn.o.weight": hf["attn.c_proj.weight"].T,
            "attn.o.bias": hf["attn.c_proj.bias"],
            "ffn.w1.weight": hf["mlp.c_fc.weight"].T,
            "ffn.w1.bias": hf["mlp.c_fc.bias"],
            "ffn.w2.weight": hf["mlp.c_proj.weight"].T,
            "ffn.w2.bias": hf["mlp.c_proj.bias"],
            "ln1.weight": hf["ln_1.weight"],
            "ln1.bias": hf["ln_1.bias"],
            "ln2.weight": hf["ln_2.weight"],
            "ln2.bias": hf["ln_2.bias"],
        }
    )
    x = torch.randn(2, 7, 32, dtype=dtype)
    causal = torch.full((7, 7), torch.finfo(dtype).min, dtype=dtype).triu(1)[None, None]
    with torch.no_grad():
        expected = gpt(x, attention_mask=causal)[0]
        got = block(x)
    torch.testing.assert_close(got, expected, rtol=0, atol=TOL[dtype])


# ---- variants PyTorch has no module for: a float64 formula written out here -----------------


def ref_attention(x, block):
    a = block.attn
    B, T, d = x.shape
    h, dk = a.n_heads, a.d_k
    q, k, v = (F.linear(x, m.weight, m.bias).view(B, T, h, dk).transpose(1, 2) for m in (a.q, a.k, a.v))
    s = q @ k.transpose(-1, -2) / dk**0.5
    if a.causal:
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    ctx = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, d)
    return F.linear(ctx, a.o.weight, a.o.bias)


def ref_ffn(x, block):
    f = block.ffn
    return F.linear(F.relu(F.linear(x, f.w1.weight, f.w1.bias)), f.w2.weight, f.w2.bias)


def ref_ln(x, ln):
    return F.layer_norm(x, x.shape[-1:], ln.weight, ln.bias, ln.eps)


def reference_block(x, block, position, residual):
    scale1 = scale2 = 1.0
    alpha = deepnorm_alpha(block.config.n_layers) if residual == "deepnorm" else 1.0
    if residual == "rezero":
        scale1, scale2 = block.res1.scale, block.res2.scale
    keep = 0.0 if residual == "none" else 1.0
    norm = (lambda y, ln: y) if block.config.norm == "none" else ref_ln
    if position == "post":
        y = norm(keep * alpha * x + scale1 * ref_attention(x, block), block.ln1)
        return norm(keep * alpha * y + scale2 * ref_ffn(y, block), block.ln2)
    if position == "pre":
        y = keep * x + scale1 * ref_attention(norm(x, block.ln1), block)
        return keep * y + scale2 * ref_ffn(norm(y, block.ln2), block)
    y = keep * x + norm(ref_attention(norm(x, block.ln1), block), block.ln1_out)
    return keep * y + norm(ref_ffn(norm(y, block.ln2), block), block.ln2_out)


@pytest.mark.parametrize(
    ("position", "residual", "norm"),
    [
        ("sandwich", "add", "standard"),
        ("post", "deepnorm", "standard"),
        ("pre", "rezero", "none"),
        ("post", "rezero", "none"),
        ("post", "none", "standard"),
        ("pre", "none", "standard"),
        ("pre", "add", "none"),
        ("sandwich", "none", "standard"),
    ],
)
def test_variants_match_float64_formula(position, residual, norm) -> None:
    config = ModelConfig(
        d_model=16,
        n_heads=2,
        d_ff=32,
        norm_position=position,
        residual=residual,
        norm=norm,
        n_layers=6,
        causal=True,
    )
    block = TransformerBlock(config).double()
    randomize(block)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(
            block(x), reference_block(x, block, position, residual), rtol=0, atol=1e-10
        )


def test_rezero_block_is_the_identity_at_init() -> None:
    block = TransformerBlock(ModelConfig(residual="rezero", norm="none", norm_position="pre"))
    x = torch.randn(2, 8, 64)
    assert torch.equal(block(x), x)
    assert {k for k in block.state_dict() if "res" in k} == {"res1.scale", "res2.scale"}


def test_deepnorm_alpha() -> None:
    assert deepnorm_alpha(6) == pytest.approx(12**0.25)


@pytest.mark.parametrize("position", ["post", "pre", "sandwich"])
def test_gradcheck_block(position) -> None:
    block = TransformerBlock(
        ModelConfig(d_model=8, n_heads=2, d_ff=12, norm_position=position, activation="gelu")
    ).double()
    randomize(block)
    x = torch.randn(1, 3, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, *p: block(x), (x, *block.parameters()), fast_mode=True)


def test_blocks_share_nothing() -> None:
    from blocklab import Transformer

    model = Transformer(ModelConfig(n_layers=3))
    ids = [{id(p) for p in b.parameters()} for b in model.blocks]
    assert not (ids[0] & ids[1]) and not (ids[1] & ids[2])
    copy.deepcopy(model)  # blocks are independent modules


# ---- observing never changes the numbers; the module path computes the lean path's values ---------

OBSERVED_CASES = [
    (position, activation, fused)
    for position in ("post", "pre", "sandwich")
    for activation in ("relu", "gelu", "gelu_tanh", "gelu_sigmoid", "relu2", "swiglu", "geglu")
    for fused in (True, False)
]


def _stack(position: str, activation: str, fused: bool, dtype: torch.dtype):
    from blocklab import Transformer

    torch.manual_seed(0)
    config = ModelConfig(vocab_size=13, max_seq_len=7, d_model=16, n_heads=2, n_layers=2, d_ff=24,
                         activation=activation, norm_position=position, fused=fused, causal=position == "pre")
    model = Transformer(config).to(dtype)
    randomize(model, 0.3)
    tokens = torch.randint(0, 13, (3, 7))
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] * 7])
    return model, tokens, mask


def _loss_and_grads(model, tokens, mask) -> list[torch.Tensor]:
    _, loss = model(tokens, targets=tokens, attention_mask=mask)
    return [loss, *torch.autograd.grad(loss, list(model.parameters()))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("position", "activation", "fused"), OBSERVED_CASES)
def test_observing_every_stage_changes_no_number(position, activation, fused, dtype) -> None:
    """Observers on every stage (the tracer, run_with_cache, the NaN detector): the loss and every
    gradient are the unobserved ones to the last bit, on the lean path and the module path alike."""
    model, tokens, mask = _stack(position, activation, fused, dtype)
    plain = _loss_and_grads(model, tokens, mask)
    seen: dict[str, torch.Tensor] = {}

    def look(x: torch.Tensor, name: str) -> None:
        seen[name] = x

    with model.hooks({"*": look}, observe=True):
        observed = _loss_and_grads(model, tokens, mask)
    assert len(seen) == len(model.hook_names())  # every stage was shown to the observer
    for a, b in zip(observed, plain, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("position", ["pre", "post"])
@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
def test_the_module_path_computes_the_lean_paths_forward_values(position, activation, dtype) -> None:
    """An intervention (here one that returns its input) sends a lean block down its module path:
    every stage's forward value is the lean path's bit for bit; gradients agree to rounding."""
    model, tokens, mask = _stack(position, activation, True, dtype)
    assert all(block.uses_lean_path for block in model.blocks)
    _, lean = model.run_with_cache(tokens, attention_mask=mask, names="*")  # observed: the lean path
    lean_grads = _loss_and_grads(model, tokens, mask)
    module: dict[str, torch.Tensor] = {}

    def keep(x: torch.Tensor, name: str) -> None:
        module[name] = x

    # an intervention that changes nothing (not on attention's scores/weights, which would need the
    # explicit attention path: SDPA's output then differs by rounding), and observers everywhere
    with model.hooks({"blocks.*.resid_mid": lambda x, name: x}), model.hooks({"*": keep}, observe=True):
        assert not any(block.uses_lean_path for block in model.blocks)
        model(tokens, attention_mask=mask)
        forward = dict(module)
        module_grads = _loss_and_grads(model, tokens, mask)
    module = forward
    assert list(module) == list(lean)  # the same stages, in the same (forward) order
    for name in lean:
        assert torch.equal(module[name], lean[name]), name
    scale = max(g.abs().max().item() for g in lean_grads)
    for a, b in zip(module_grads, lean_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=TOL[dtype] * scale)


def test_an_observer_may_not_replace_a_value() -> None:
    block = TransformerBlock(ModelConfig(d_model=16, n_heads=2, fused=True, norm_position="pre"))
    with block.hooks({"ffn.out": lambda x, name: x * 0}, observe=True), \
            pytest.raises(ValueError, match="observers only read"):
        block(torch.randn(2, 3, 16))


@pytest.mark.parametrize("explicit", [False, True])
def test_a_query_that_sees_no_key_attends_to_nothing_on_both_paths(explicit) -> None:
    """Left-padded causal batch: the padding queries see no key. Both attention paths give them
    output 0 and keep every real position finite, with finite gradients (issue: NaN at real tokens)."""
    from blocklab import Transformer

    torch.manual_seed(0)
    model = Transformer(ModelConfig(causal=True, norm_position="pre")).eval()
    for block in model.blocks:
        block.attn.use_fast_path = not explicit
    tokens = torch.randint(0, 18, (2, 8))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1], [1] * 8])
    logits, loss = model(tokens, targets=tokens, attention_mask=mask)
    assert torch.isfinite(logits).all()
    grads = torch.autograd.grad(loss, list(model.parameters()))
    assert all(torch.isfinite(g).all() for g in grads)
    _, cache = model.run_with_cache(tokens, attention_mask=mask, names=["blocks.*.attn.weights"])
    assert (cache["blocks.0.attn.weights"][0, :, :2] == 0).all()  # padding queries: no weight anywhere


def test_both_attention_paths_agree_on_fully_masked_rows() -> None:
    from blocklab import MultiHeadAttention

    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 2, causal=True).double()
    x = torch.randn(2, 6, 16, dtype=torch.float64, requires_grad=True)
    pad = torch.tensor([[True, True, False, False, False, False], [False] * 6])
    fast = attn(x, pad)
    (fast_grad,) = torch.autograd.grad(fast.sum(), x)
    explicit, _ = attn.forward_with_weights(x, pad)
    (explicit_grad,) = torch.autograd.grad(explicit.sum(), x)
    torch.testing.assert_close(explicit, fast, rtol=0, atol=1e-12)
    torch.testing.assert_close(explicit_grad, fast_grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(fast[0, :2], attn.o.bias.expand(2, 16), rtol=0, atol=0)  # heads give 0
