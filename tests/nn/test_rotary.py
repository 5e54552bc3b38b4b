"""Tests for blocklab.nn.rotary and the attention that uses it: rotary positions against
``transformers``' own functions (Llama's rotate_half with Llama 3 scaling, GPT-NeoX's partial
rotation, GPT-J's interleaved pairs) and a float64 hand rotation; grouped-query attention and the
sliding window through the hook points. (Every stage of a rotary, grouped-query, windowed model
against a float64 hand forward: tests/nn/test_hooks.py.)"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb as neox_rotate
from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb as gptj_rotate
from transformers.models.gptj.modeling_gptj import create_sinusoidal_positions
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as llama_rotate

import blocklab as bl
from blocklab.nn.rotary import Rotary, inverse_frequencies

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}


LINEAR = {"rope_type": "linear", "factor": 8.0}  # Gemma 3 4B's (on its global layers)


@pytest.mark.parametrize("scaling", [LLAMA3, LINEAR], ids=["llama3", "linear"])
def test_llama_rotation_with_its_scalings_equals_transformers_bit_for_bit(scaling) -> None:
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, num_attention_heads=2, rope_theta=5000.0, rope_scaling=scaling,
                         max_position_embeddings=512)
    theirs = LlamaRotaryEmbedding(config)
    q, k = torch.randn(2, 2, 300, 32), torch.randn(2, 2, 300, 32)
    positions = torch.arange(300)[None].expand(2, -1)
    cos, sin = theirs(q, positions)
    want_q, want_k = llama_rotate(q, k, cos, sin)
    angles = Rotary(32, base=5000.0, scaling=scaling).angles(positions, q.dtype)
    assert torch.equal(angles.rotate(q), want_q) and torch.equal(angles.rotate(k), want_k)
    assert torch.equal(inverse_frequencies(32, 5000.0, scaling), theirs.inv_freq)  # the scaling changed some
    assert not torch.equal(inverse_frequencies(32, 5000.0, scaling), inverse_frequencies(32, 5000.0))


@pytest.mark.parametrize("scaling, message", [
    ({"rope_type": "linear", "factor": 0.0}, "needs finite numbers > 0 for factor"),
    ({"rope_type": "linear", "factor": 2.0, "original_max_position_embeddings": 16}, "exactly the keys"),
    ({"rope_type": "dynamic", "factor": 2.0}, "other scalings are not computed"),
])
def test_a_rope_scaling_blocklab_does_not_compute_exactly_is_refused_by_name(scaling, message) -> None:
    with pytest.raises(ValueError, match=r"ModelConfig\.rope_scaling=.*" + message):
        bl.ModelConfig(pos_encoding="rotary", rope_scaling=scaling)


def test_partial_rotation_equals_gpt_neox() -> None:
    """Pythia rotates the first 25% of each head and passes the rest."""
    torch.manual_seed(1)
    q, k = torch.randn(1, 3, 7, 64), torch.randn(1, 3, 7, 64)
    rotary = Rotary(64, fraction=0.25)
    angles = rotary.angles(torch.arange(7), q.dtype)
    want_q, want_k = neox_rotate(q, k, angles.cos[:, 0], angles.sin[:, 0])
    assert rotary.dim == 16
    assert torch.equal(angles.rotate(q), want_q) and torch.equal(angles.rotate(k), want_k)
    assert torch.equal(angles.rotate(q)[..., 16:], q[..., 16:])


def test_interleaved_rotation_equals_gpt_j() -> None:
    torch.manual_seed(2)
    x = torch.randn(2, 5, 4, 32)  # GPT-J's (B, T, h, d) layout
    sincos = create_sinusoidal_positions(5, 32)
    sin, cos = torch.split(sincos[None], 16, dim=-1)  # (1, T, 16) each
    want = gptj_rotate(x, sin, cos)
    angles = Rotary(32, style="interleaved").angles(torch.arange(5), x.dtype)
    torch.testing.assert_close(angles.rotate(x.transpose(1, 2)).transpose(1, 2), want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("style", ["half", "interleaved"])
def test_rotation_equals_a_float64_hand_rotation_of_each_pair(style: str) -> None:
    torch.manual_seed(3)
    d, T, base = 12, 9, 100.0
    x = torch.randn(1, 2, T, d, dtype=torch.float64)
    got = Rotary(d, base=base, style=style).angles(torch.arange(T), torch.float64).rotate(x)
    want = x.clone()
    for p in range(T):
        for m in range(d // 2):
            w = base ** (-2 * m / d)
            a, b = (m, m + d // 2) if style == "half" else (2 * m, 2 * m + 1)
            c, s = math.cos(p * w), math.sin(p * w)
            want[..., p, a] = x[..., p, a] * c - x[..., p, b] * s
            want[..., p, b] = x[..., p, b] * c + x[..., p, a] * s
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)  # the angles are float32, as transformers'


def test_rotated_dot_products_depend_on_the_distance_only() -> None:
    """q_i . k_j after rotation is a function of i - j: shifting both positions changes nothing."""
    torch.manual_seed(4)
    rotary = Rotary(16, base=50.0)
    q, k = torch.randn(1, 1, 1, 16, dtype=torch.float64), torch.randn(1, 1, 1, 16, dtype=torch.float64)
    at = lambda x, p: rotary.angles(torch.tensor([p]), torch.float64).rotate(x)
    near = (at(q, 5) * at(k, 3)).sum()
    assert float((at(q, 105) * at(k, 103)).sum()) == pytest.approx(float(near), abs=1e-4)
    assert abs(float((at(q, 5) * at(k, 0)).sum()) - float(near)) > 1e-2


def _model(**fields: object) -> bl.Transformer:
    torch.manual_seed(0)
    llama = dict(causal=True, norm_position="pre", norm="rms", activation="swiglu", bias=False,
                 pos_encoding="rotary")
    config = bl.ModelConfig(vocab_size=23, max_seq_len=16, d_model=32, n_heads=4, n_layers=2, d_ff=48,
                            **{**llama, **fields})
    return bl.Transformer(config).eval()


def test_grouped_query_heads_share_their_key_and_value_head() -> None:
    model = _model(n_kv_heads=2)
    _, cache = model.run_with_cache(torch.randint(0, 23, (2, 9)))
    assert cache["blocks.0.attn.k"].shape == (2, 2, 9, 8) and cache["blocks.0.attn.q"].shape == (2, 4, 9, 8)
    q, k = cache["blocks.0.attn.rot_q"], cache["blocks.0.attn.rot_k"]
    scores = cache["blocks.0.attn.scores"]
    for head in range(4):  # heads 0, 1 read key head 0; heads 2, 3 key head 1
        want = q[:, head] @ k[:, head // 2].transpose(-1, -2) / math.sqrt(8)
        causal = want.masked_fill(torch.ones(9, 9).triu(1).bool(), -math.inf)
        torch.testing.assert_close(scores[:, head], causal)
    assert model.blocks[0].attn.k.weight.shape == (16, 32)
    assert bl.count_parameters(model.config).total == sum(p.numel() for p in model.parameters())


def test_the_sliding_window_hides_keys_further_back_than_the_window() -> None:
    model = _model(sliding_window=3)
    _, cache = model.run_with_cache(torch.randint(0, 23, (1, 10)))
    weights = cache["blocks.1.attn.weights"][0]  # (h, T, T)
    i, j = torch.meshgrid(torch.arange(10), torch.arange(10), indexing="ij")
    assert (weights[:, (i - j >= 3) | (j > i)] == 0).all()
    assert (weights[:, (i - j < 3) & (j <= i)] > 0).all()


def test_a_left_padded_row_with_its_own_positions_equals_the_row_alone() -> None:
    model = _model(n_kv_heads=1)
    row = torch.randint(1, 23, (1, 6))
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), row], 1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 6, dtype=torch.long)], 1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        alone = model(row)
        together = model(padded, attention_mask=mask, position_ids=positions)[:, 3:]
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("stage", "fields"), [("rot_k", {}), ("k_norm", {"qk_norm": "head"})])
def test_an_intervention_on_the_rotated_keys_changes_what_attention_computes(stage: str,
                                                                             fields: dict) -> None:
    """Zeroing rot_k zeroes every score: each query spreads its weight evenly over what it may see.
    So does zeroing QK-norm's normalised keys (rotating zeros leaves zeros)."""
    model = _model(**fields)
    tokens = torch.randint(0, 23, (1, 5))
    with torch.no_grad():
        plain = model(tokens)
        with model.hooks({f"blocks.0.attn.{stage}": lambda x, name: torch.zeros_like(x)}):
            hooked, cache = model.run_with_cache(tokens, names=["blocks.0.attn.weights"])
    want = torch.ones(5, 5).tril() / torch.arange(1, 6)[:, None]
    torch.testing.assert_close(cache["blocks.0.attn.weights"][0, 0], want)
    assert not torch.allclose(hooked, plain)


@pytest.mark.parametrize("fields", [
    dict(), dict(n_kv_heads=2), dict(n_kv_heads=1, rotary_fraction=0.5),
    dict(qk_norm="head", n_kv_heads=2), dict(qk_norm="all_heads", n_kv_heads=1),  # QK-norm: Qwen3, OLMo 2
    dict(qk_norm="head", norm="standard", bias=True, norm_position="post"),  # a LayerNorm per head, post-norm
])
def test_the_lean_path_computes_the_module_paths_values_with_rotary_and_grouped_heads(fields) -> None:
    torch.manual_seed(0)
    lean = _model(fused=True, **fields)
    tokens = torch.randint(0, 23, (2, 11))
    assert lean.blocks[0].uses_lean_path
    out = lean(tokens, targets=tokens)[1]
    with lean.hooks({"blocks.*.resid_post": lambda x, name: None}):  # an intervention: the module path
        assert not lean.blocks[0].uses_lean_path
        module = lean(tokens, targets=tokens)[1]
    assert torch.equal(out, module)
    grads = torch.autograd.grad(out, list(lean.parameters()))
    module_grads = torch.autograd.grad(module, list(lean.parameters()))
    for a, b in zip(grads, module_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
