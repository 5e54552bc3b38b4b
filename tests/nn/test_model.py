"""The stack: embeddings + positions + blocks + final norm + head + loss, against PyTorch's encoder."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from blocklab import ModelConfig, Transformer


def torch_reference(model: Transformer) -> tuple[nn.TransformerEncoder, nn.Module]:
    """nn.TransformerEncoder (+ final nn.LayerNorm for pre-norm) holding the same weights."""
    c = model.config
    layer = nn.TransformerEncoderLayer(
        c.d_model,
        c.n_heads,
        c.d_ff,
        dropout=0.0,
        activation=c.activation,
        layer_norm_eps=c.eps,
        batch_first=True,
        norm_first=c.norm_position == "pre",
        dtype=torch.float64,
    )
    encoder = nn.TransformerEncoder(layer, c.n_layers, enable_nested_tensor=False).eval()
    final = nn.LayerNorm(c.d_model, eps=c.eps, dtype=torch.float64) if c.final_norm else nn.Identity()
    with torch.no_grad():
        for ours, theirs in zip(model.blocks, encoder.layers, strict=True):
            a = ours.attn
            theirs.self_attn.in_proj_weight.copy_(torch.cat([a.q.weight, a.k.weight, a.v.weight]))
            theirs.self_attn.in_proj_bias.copy_(torch.cat([a.q.bias, a.k.bias, a.v.bias]))
            theirs.self_attn.out_proj.load_state_dict(a.o.state_dict())
            theirs.linear1.load_state_dict(ours.ffn.w1.state_dict())
            theirs.linear2.load_state_dict(ours.ffn.w2.state_dict())
            theirs.norm1.load_state_dict(ours.ln1.state_dict())
            theirs.norm2.load_state_dict(ours.ln2.state_dict())
        if c.final_norm:
            final.load_state_dict(model.ln_f.state_dict())
    return encoder, final


@pytest.mark.parametrize("position", ["post", "pre"])
@pytest.mark.parametrize("pos_encoding", ["sinusoidal", "learned"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("embed_scale", ["sqrt_d_model", "none"])
def test_stack_matches_torch_encoder_and_cross_entropy(position, pos_encoding, causal, embed_scale) -> None:
    config = ModelConfig(
        vocab_size=11,
        max_seq_len=9,
        d_model=16,
        n_heads=4,
        n_layers=3,
        d_ff=40,
        norm_position=position,
        pos_encoding=pos_encoding,
        causal=causal,
        activation="gelu",
        embed_scale=embed_scale,
    )
    model = Transformer(config).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    encoder, final = torch_reference(model)
    tokens = torch.randint(0, 11, (3, 9))
    targets = torch.randint(0, 11, (3, 9))
    targets[0, :4] = -100  # padding targets are ignored
    if pos_encoding == "sinusoidal":
        pe = torch.tensor(
            [
                [
                    math.sin(p / 10000 ** (2 * (j // 2) / 16))
                    if j % 2 == 0
                    else math.cos(p / 10000 ** (2 * (j // 2) / 16))
                    for j in range(16)
                ]
                for p in range(9)
            ],
            dtype=torch.float64,
        )
    else:
        pe = model.pos.weight
    factor = 4.0 if embed_scale == "sqrt_d_model" else 1.0  # sqrt(d_model = 16), Vaswani et al. 3.4
    x0 = factor * model.embed.weight[tokens] + pe
    mask = nn.Transformer.generate_square_subsequent_mask(9, dtype=torch.float64) if causal else None
    with torch.no_grad():
        expected_logits = final(encoder(x0, mask=mask, is_causal=causal)) @ model.head.weight.T
        logits, loss = model(tokens, targets)
    torch.testing.assert_close(logits, expected_logits, rtol=0, atol=1e-10)
    scored = targets != -100
    expected_loss = -torch.log_softmax(expected_logits, -1)[scored].gather(1, targets[scored][:, None]).mean()
    torch.testing.assert_close(loss, expected_loss, rtol=0, atol=1e-10)
    with torch.no_grad():  # (with autograd the fused FFN runs one matmul for W1 | W3: equal to rounding)
        assert torch.equal(model(tokens), logits)  # without targets: logits only


def test_float32_stack_matches_float64() -> None:
    model = Transformer(ModelConfig(norm_position="pre", activation="gelu"))
    tokens = torch.randint(0, 18, (4, 8))
    ref = Transformer(model.config).double()
    ref.load_state_dict(model.state_dict())
    torch.testing.assert_close(model(tokens).double(), ref(tokens), rtol=0, atol=1e-5)


def test_the_default_init_draws_each_linear_with_pytorchs_std() -> None:
    """init="torch" (the default) draws every block weight and the head with the variance PyTorch's own
    nn.Linear gives a layer of that shape (kaiming-uniform: bound 1/sqrt(fan_in), std bound/sqrt(3)),
    biases 0; init="default" (GPT-2's, BERT's) draws the blocks N(0, 0.02) whatever the width."""
    d, h, d_ff, vocab = 64, 4, 256, 512
    torch.manual_seed(0)
    ours = Transformer(ModelConfig(vocab_size=vocab, d_model=d, n_heads=h, d_ff=d_ff, n_layers=1))
    block = ours.blocks[0]
    for linear in (block.attn.q, block.attn.o, block.ffn.w1, block.ffn.w2, ours.head):
        oracle = nn.Linear(linear.in_features, linear.out_features * 8)  # more samples: a tight std
        expected = float(oracle.weight.detach().std())
        assert abs(float(linear.weight.detach().std()) / expected - 1) < 0.06, linear
        assert linear.bias is None or not linear.bias.any()
    torch.manual_seed(0)
    gpt = Transformer(ModelConfig(vocab_size=vocab, d_model=d, n_heads=h, d_ff=d_ff, n_layers=1,
                                  init="default"))
    weights = torch.cat([p.detach().flatten() for n, p in gpt.named_parameters()
                         if n.startswith("blocks") and p.dim() == 2])
    assert abs(float(weights.std()) - 0.02) < 0.001
    assert torch.equal(gpt.head.weight, ours.head.weight)  # the head, every scheme's: the same draw


def test_bfloat16_forward_runs() -> None:
    model = Transformer(ModelConfig(norm_position="pre"))
    tokens = torch.randint(0, 18, (2, 8))
    out = model.to(torch.bfloat16)(tokens)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()


def test_tied_head_shares_the_embedding() -> None:
    model = Transformer(ModelConfig(tie_embeddings=True))
    assert model.head.weight is model.embed.weight
    untied = Transformer(ModelConfig())
    n_tied = sum(p.numel() for p in model.parameters())
    n_untied = sum(p.numel() for p in untied.parameters())
    assert n_untied - n_tied == 18 * 64


def test_state_dict_keys() -> None:
    keys = set(Transformer(ModelConfig(pos_encoding="learned", norm_position="pre")).state_dict())
    assert {
        "embed.weight",
        "pos.weight",
        "ln_f.weight",
        "ln_f.bias",
        "head.weight",
        "blocks.0.attn.q.weight",
        "blocks.1.ffn.w2.bias",
        "blocks.1.ln2.weight",
    } <= keys
    assert not any(
        k.startswith("pos") for k in Transformer(ModelConfig()).state_dict()
    )  # sinusoidal: a buffer
    assert not any(
        k.startswith("ln_f") for k in Transformer(ModelConfig()).state_dict()
    )  # post-norm: no ln_f


def test_padding_does_not_change_real_tokens() -> None:
    model = Transformer(ModelConfig(norm_position="pre")).double()
    tokens = torch.randint(1, 18, (1, 8))
    mask = torch.tensor([[1] * 5 + [0] * 3])
    padded = model.encode(tokens, attention_mask=mask)[:, :5]
    short = model.encode(tokens[:, :5])
    torch.testing.assert_close(padded, short, rtol=0, atol=1e-12)


def test_loss_ignores_padding_targets() -> None:
    model = Transformer(ModelConfig())
    tokens = torch.randint(0, 18, (2, 8))
    targets = torch.full((2, 8), -100)
    targets[:, -1] = tokens[:, 0]
    logits, loss = model(tokens, targets)
    torch.testing.assert_close(loss, F.cross_entropy(logits[:, -1], tokens[:, 0]))


def test_bad_inputs_give_clear_errors() -> None:
    model = Transformer(ModelConfig())
    with pytest.raises(ValueError, match="exceeds max_seq_len=8"):
        model(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[0, 18\)"):
        model(torch.tensor([[3, 18]]))
    with pytest.raises(ValueError, match="batch, seq"):
        model(torch.zeros(8, dtype=torch.long))


# ---- every config field reaches the model, or is refused ------------------------------------------

from blocklab.bench.footprint import saved_activations  # noqa: E402
from blocklab.nn.activations import ACTIVATION_NAMES  # noqa: E402
from blocklab.nn.attention import QK_NORMS  # noqa: E402
from blocklab.nn.config import (  # noqa: E402
    EMBED_SCALES,
    FIELDS,
    NORM_POSITIONS,
    NORMS,
    POS_ENCODINGS,
    RESIDUALS,
    RESOLVED_BY,
    resolved,
)
from blocklab.nn.init_schemes import INIT_SCHEMES  # noqa: E402
from blocklab.nn.moe import balancing_term  # noqa: E402

ALTERNATIVES: dict[str, list] = {
    "vocab_size": [19],
    "max_seq_len": [16],
    "d_model": [32],
    "n_heads": [2, 8],
    "n_kv_heads": [None, 1, 2],
    "head_dim": [None, 8, 12],
    "n_layers": [1, 3],
    "d_ff": [128],
    "activation": list(ACTIVATION_NAMES),
    "norm": list(NORMS),
    "norm_position": list(NORM_POSITIONS),
    "residual": list(RESIDUALS),
    "eps": [1e-3],
    "bias": [True, False],
    "qkv_bias": [None, True, False],
    "o_bias": [None, True, False],
    "ffn_bias": [None, True, False],
    "causal": [True, False],
    "sliding_window": [None, 3],
    "layer_windows": [None, (2, None)],
    "qk_norm": list(QK_NORMS),
    "attn_softcap": [None, 0.5],
    "logit_softcap": [None, 0.5],
    "query_pre_attn_scalar": [None, 3.0],
    "pos_encoding": list(POS_ENCODINGS),
    "rotary_fraction": [1.0, 0.5],
    "rotary_base": [10000.0, 100.0],
    "rotary_style": ["half", "interleaved"],
    "local_rotary_base": [None, 100.0],  # (observable where a layer has a window: mixtral-like's)
    "rope_scaling": [None, {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": 16}],
    "embed_scale": list(EMBED_SCALES),
    "embed_std": [1.0, 0.02],
    "pos_std": [0.5, None],
    "tie_embeddings": [True, False],
    "head_bias": [True, False],
    "positions_from_mask": [True, False],
    "final_norm": [True, False],
    "dropout": [0.1],
    "type_vocab_size": [2],
    "embed_norm": [True, False],
    "fused": [True, False, "auto"],
    "keep_residual": [True, False],
    "checkpoint_blocks": [True, False],
    "init": list(INIT_SCHEMES),
    "n_experts": [0, 3],
    "experts_per_token": [1, 3],
    "router_softmax": ["before_top_k", "after_top_k"],
    "renormalize_top_k": [True, False],
    "shared_expert_d_ff": [0, 8],
    "router_aux_loss_coef": [0.0],
}
SMALL = dict(d_model=16, n_heads=2, d_ff=32)  # the listops shape, narrower: the test builds ~150 models
BASES = {
    "post": ModelConfig(**SMALL),
    # learned positions: the base where pos_std is observable (sinusoidal bases refuse it, naming it)
    "pre-rms-lean": ModelConfig(**SMALL, norm_position="pre", norm="rms", fused=True, pos_encoding="learned"),
    "no-norm": ModelConfig(**SMALL, norm="none", norm_position="pre"),
    # the modern block: rotary positions (where their options are observable), grouped queries, causal
    "llama-like": ModelConfig(**SMALL, norm_position="pre", norm="rms", activation="swiglu", bias=False,
                              causal=True, pos_encoding="rotary", n_kv_heads=1),
    # the mixture of experts (Mixtral's block, smaller): each other field's alternatives work with experts;
    # a local layer and a global one (where a local layer's own rotary base is observable)
    "mixtral-like": ModelConfig(**SMALL, norm_position="pre", norm="rms", activation="swiglu", bias=False,
                                causal=True, pos_encoding="rotary", n_experts=4, experts_per_token=2,
                                layer_windows=(2, None)),
}


# Changes that build the same model by the math, not by a value being ignored: with no norm, every
# sequential layout wires the same x + F(x) (its norms are identities); the parallel ones still differ
# (x + MHA(x) + FFN(x)).
SAME_BY_THE_MATH = {("no-norm", "norm_position", "'post'"), ("no-norm", "norm_position", "'sandwich'"),
                    ("no-norm", "norm_position", "'res_post'")}


def _fingerprint(config: ModelConfig) -> list:
    """What a model of ``config`` shows: parameter shapes, eval and train outputs, the gradient of each
    parameter (how it learns: embed_scale draws the same token part at init but moves it at another
    rate), bytes kept for backward, and whether it accepts a 12-token input."""
    torch.manual_seed(0)
    model = Transformer(config)
    tokens = torch.randint(0, 18, (2, 8), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(tokens)
    mask[0, :3] = 0  # a left-padded row: where positions_from_mask counts its positions from
    with torch.no_grad():
        eval_out = model.eval()(tokens)
        masked_out = model(tokens, attention_mask=mask)[0, 3:]  # the padded row's real tokens
        torch.manual_seed(1)
        train_out = model.train()(tokens)
    kept = saved_activations(model, lambda t: model(t, targets=t)[1], tokens)[0].nbytes
    model.zero_grad()
    loss = model(tokens, targets=tokens)[1]
    balance = balancing_term(model)  # what training adds to the loss with experts (training/loop.py)
    (loss if balance is None else loss + balance[1]).backward()
    no_grad = torch.zeros(())
    grads = torch.stack([p.grad.norm() if p.grad is not None else no_grad for p in model.parameters()])
    try:
        model(torch.zeros(1, 12, dtype=torch.long))
        accepts_12 = True
    except ValueError:
        accepts_12 = False
    shapes = sorted((k, tuple(v.shape)) for k, v in model.state_dict().items())
    return [shapes, eval_out, masked_out, train_out, grads, kept, accepts_12,
            None if balance is None else balance[1].detach()]


def _same(a: list, b: list) -> bool:
    return all(
        torch.equal(x, y)
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.shape == y.shape
        else x == y
        if not isinstance(x, torch.Tensor)
        else False
        for x, y in zip(a, b, strict=True)
    )


def test_every_field_has_alternatives_to_try() -> None:
    assert set(ALTERNATIVES) == set(FIELDS), "give each new ModelConfig field its alternatives here"


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("field", FIELDS)
def test_every_field_changes_something_observable_or_is_refused(base: str, field: str) -> None:
    config = BASES[base]
    reference = _fingerprint(config)
    for value in ALTERNATIVES[field]:
        if value == getattr(config, field):
            continue
        try:
            changed = config.replace(**{field: value})
        except ValueError as error:
            assert f"ModelConfig.{field}" in str(error) or field in str(error), (field, value, error)
            continue  # refused, naming the field
        if field == "fused" and changed.components_fused == config.components_fused:
            continue  # "auto" resolving to what the other value says: the same model by definition
        if field in RESOLVED_BY and resolved(changed, field) == resolved(config, field):
            continue  # unset means a derived value (one kv head per query head, as bias): the same model
        if (base, field, repr(value)) in SAME_BY_THE_MATH:
            assert _same(_fingerprint(changed), reference), f"{base}: {field}={value!r} now differs"
            continue
        assert not _same(_fingerprint(changed), reference), f"{base}: {field}={value!r} changed nothing"
