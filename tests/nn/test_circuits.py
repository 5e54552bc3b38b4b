"""TransformerLens' weight views, circuits and weight processing (blocklab/nn/circuits.py), against
float64 arithmetic on the weights themselves: the views are the matrices the forward pass multiplies
by; processing leaves every layout's log-probabilities unchanged, or is refused with the reason.
(test_transformerlens.py checks the same views and processing against HookedTransformer.)"""

from __future__ import annotations

import pytest
import torch

import blocklab as bl
from blocklab.nn.layouts import LAYOUTS
from blocklab.training.checkpoint import save_checkpoint
from blocklab.weights.hf_folder import save_pretrained

BASE = dict(vocab_size=23, d_model=16, n_heads=4, n_layers=2, d_ff=32, max_seq_len=16, dropout=0.0)
TOKENS = torch.randint(0, 23, (3, 9), generator=torch.Generator().manual_seed(0))


def spread(**fields: object) -> bl.Transformer:
    """A float64 model with every weight (norms' gamma and beta included) moved off its init."""
    torch.manual_seed(0)
    model = bl.Transformer(bl.ModelConfig(**{**BASE, **fields})).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


def test_the_views_are_the_matrices_the_attention_multiplies_by() -> None:
    model = spread(n_kv_heads=2, qkv_bias=True)
    attn, x = model.blocks[0].attn, torch.randn(5, 16, dtype=torch.float64)
    q = x @ attn.q.weight.T + attn.q.bias  # (5, h * d_head): head i is columns i d_head .. (i+1) d_head
    k = x @ attn.k.weight.T + attn.k.bias  # (5, h_kv * d_head)
    for head in range(4):
        torch.testing.assert_close(x @ model.W_Q[0, head] + model.b_Q[0, head], q[:, head * 4:(head + 1) * 4])
        kv_head = head // 2  # query heads 0, 1 read key head 0; 2, 3 read key head 1
        torch.testing.assert_close(x @ model.W_K[0, head] + model.b_K[0, head],
                                   k[:, kv_head * 4:(kv_head + 1) * 4])
    z = torch.randn(5, 4, 4, dtype=torch.float64)  # (T, h, d_head): o reads the heads concatenated
    torch.testing.assert_close(torch.einsum("thd,hdm->tm", z, model.W_O[0]) + model.b_O[0],
                               z.flatten(1) @ attn.o.weight.T + attn.o.bias)
    assert model.W_in.shape == (2, 16, 32) and model.W_out.shape == (2, 32, 16)
    assert model.W_U.shape == (16, 23)


def test_qk_and_ov_circuits_are_the_products_kept_factored() -> None:
    model = spread()
    qk, ov = model.QK, model.OV
    assert qk.shape == ov.shape == (2, 4, 16, 16)
    torch.testing.assert_close(qk.AB, model.W_Q @ model.W_K.transpose(-1, -2))
    torch.testing.assert_close(ov[1, 2].AB, model.W_V[1, 2] @ model.W_O[1, 2])
    torch.testing.assert_close(qk.T.AB, qk.AB.transpose(-1, -2))
    full = torch.linalg.eigvals(ov[0, 0].AB)  # (16,): rank 4, so 12 are zero
    nonzero = full[full.abs() > 1e-8]
    ours = ov[0, 0].eigenvalues
    assert len(nonzero) == len(ours) == 4
    torch.testing.assert_close(sorted(ours, key=lambda z: (z.real, z.imag)),
                               sorted(nonzero, key=lambda z: (z.real, z.imag)))


@pytest.mark.parametrize("position", list(LAYOUTS))
@pytest.mark.parametrize("fields", [{}, {"norm": "rms", "activation": "swiglu"}, {"tie_embeddings": False}])
def test_processing_keeps_the_log_probabilities_or_says_why_not(position: str, fields: dict) -> None:
    model = spread(norm_position=position, **fields)
    with torch.no_grad():
        before = model(TOKENS).log_softmax(-1)
    try:
        model.fold_ln()
    except ValueError as error:  # a norm that writes to the stream cannot fold into a linear layer
        assert "feeds the residual stream" in str(error)
        layout = LAYOUTS[position]  # post, sandwich, res_post: a norm's output is added to the stream;
        # simplified: the block's output is its norm's
        assert any(norm in (s.x, *s.branches) for s in layout.sums for norm in layout.norms) or \
            layout.output in layout.norms
        return
    if model.config.norm != "rms":
        model.center_writing_weights()
    model.center_unembed()
    model.fold_value_biases()
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS).log_softmax(-1), before, rtol=0, atol=1e-10)
    for name, norm in model.named_modules():
        if name.split(".")[-1] in ("ln1", "ln2", "ln_f"):
            assert torch.equal(norm.weight, torch.ones_like(norm.weight))  # folded away


def test_what_processing_cannot_do_is_refused() -> None:
    with pytest.raises(ValueError, match="norm='batch' has no affine to fold"):
        spread(norm="batch").fold_ln()
    with pytest.raises(ValueError, match="the embedding norm"):
        spread(embed_norm=True).fold_ln()
    with pytest.raises(ValueError, match="needs every reader of the stream to subtract the mean"):
        spread(norm="rms").center_writing_weights()


def test_a_processed_model_is_not_saved_as_if_it_were_its_config(tmp_path) -> None:
    model = spread(norm_position="pre", causal=True, pos_encoding="learned", embed_scale="none")  # GPT-2's
    model.process_weights_()
    assert model.weights_processed == [
        "fold_ln", "center_writing_weights", "center_unembed", "fold_value_biases"]
    assert model.head.weight is not model.embed.weight  # untied: W_U and W_E were processed differently
    for save in (lambda: save_checkpoint(tmp_path / "m.safetensors", model),
                 lambda: save_pretrained(model, tmp_path / "hf")):
        with pytest.raises(ValueError, match="processed .*fold_ln.* for analysis"):
            save()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("fields, reason", [(dict(pos_encoding="rotary"), "rotary"),
                                            (dict(qk_norm="head"), "qk_norm"),
                                            (dict(n_kv_heads=2), "shared")])
def test_refactoring_the_attention_matrices_is_refused_where_qk_is_not_one_matrix(fields, reason) -> None:
    model = spread(**fields)
    with pytest.raises(ValueError, match=reason):
        model.refactor_factored_attn_matrices()


@pytest.mark.parametrize("fields", [dict(qkv_bias=True), dict(qkv_bias=False), dict(norm_position="post")])
def test_refactored_heads_compute_the_same_in_float64(fields) -> None:
    model = spread(**fields)
    before = model(TOKENS)
    model.refactor_factored_attn_matrices()
    torch.testing.assert_close(model(TOKENS), before, rtol=0, atol=1e-10)
    torch.testing.assert_close(model.W_O @ model.W_O.transpose(-2, -1), torch.eye(4, dtype=torch.float64)
                               .expand(2, 4, 4, 4), rtol=0, atol=1e-12)
