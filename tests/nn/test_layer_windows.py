"""Per-layer attention kinds (issue 39 item 4): ``layer_windows`` gives each layer its own sliding window or
none (global), against a float64 hand attention with that layer's window, in generation and in model.cfg."""

from __future__ import annotations

import json
import math

import pytest
import torch

import blocklab as bl
from blocklab.cli import main
from blocklab.nn.config import from_dict
from blocklab.nn.generate import generate

WINDOWS = (2, None, 3)


def _model(**fields) -> bl.Transformer:
    torch.manual_seed(5)
    config = bl.ModelConfig(vocab_size=29, max_seq_len=16, d_model=16, n_heads=2, n_layers=3, d_ff=32,
                            causal=True, norm_position="pre", pos_encoding="rotary", bias=False,
                            **{"layer_windows": WINDOWS, **fields})
    return bl.Transformer(config).double().eval()


def hand_pattern(q, k, window, pad):
    """softmax(q k^T / sqrt(d_k) + mask): key j visible to query i when j <= i, j > i - window (a window)
    and key j is not padding; plain float64 torch. (B, h, T, T)"""
    T = q.shape[2]
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    allowed = (j <= i) & ((j > i - window) if window is not None else True)
    allowed = allowed[None, None] & ~pad[:, None, None, :]
    scores = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, -1)


def test_each_layer_attends_within_its_own_window() -> None:
    model = _model()
    tokens = torch.randint(0, 29, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :2] = 0  # left padding
    pad = mask == 0
    _, cache = model.run_with_cache(tokens, attention_mask=mask)
    real = ~pad[1]
    for layer, window in enumerate(WINDOWS):
        q = cache[f"blocks.{layer}.attn.hook_rot_q"].transpose(1, 2)  # (B, T, h, d_k) -> (B, h, T, d_k)
        k = cache[f"blocks.{layer}.attn.hook_rot_k"].transpose(1, 2)
        want = hand_pattern(q, k, window, pad)
        got = cache[f"blocks.{layer}.attn.hook_pattern"]
        torch.testing.assert_close(got[0], want[0], rtol=0, atol=1e-14)
        seen = lambda p: p[1][:, real][..., real]  # the padded row's real queries and keys
        torch.testing.assert_close(seen(got), seen(want), rtol=0, atol=1e-14)
        far = torch.ones(9, 9, dtype=torch.bool).tril(-(window or 3))  # keys i - window (i - 3) or earlier
        if window is None:
            assert (got[0][:, far] > 0).all()  # a global layer sees them
        else:
            assert (got[0][:, far] == 0).all()


def test_cached_generation_on_a_left_padded_batch_equals_the_uncached_one() -> None:
    model = _model()
    tokens = torch.randint(1, 29, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[0, :3] = 0
    for fields in ({}, {"do_sample": True, "seed": 3, "top_k": 8}):
        cached = generate(model, tokens, 7, attention_mask=mask, **fields)
        plain = generate(model, tokens, 7, attention_mask=mask, use_cache=False, **fields)
        assert torch.equal(cached, plain), fields
    global_only = generate(_model(layer_windows=None), tokens, 7, attention_mask=mask)
    assert not torch.equal(global_only, generate(model, tokens, 7, attention_mask=mask))  # the windows matter


def test_the_windows_survive_json_and_a_list_is_read_as_a_tuple() -> None:
    config = _model().config
    again = from_dict(json.loads(json.dumps(config.to_dict())))
    assert again == config and again.layer_windows == WINDOWS and hash(again) == hash(config)
    assert [config.window(i) for i in range(3)] == [2, None, 3]
    assert bl.ModelConfig(causal=True, sliding_window=4).window(1) == 4


@pytest.mark.parametrize("fields,message", [
    ({"layer_windows": (2, None)}, r"\(2, None\) must list one window per layer \(3: n_layers\)"),
    ({"layer_windows": "2,none,2"}, "must list one window per layer"),
    ({"layer_windows": (2, 0, None)}, r"each must be an integer >= 1 or None"),
    ({"layer_windows": (2, 1.5, None)}, r"each must be an integer >= 1 or None"),
    ({"causal": False}, r"limit causal attention, but causal=False"),
    ({"sliding_window": 4}, r"so sliding_window=4 must be unset"),
])
def test_windows_that_cannot_apply_are_refused_by_name(fields, message) -> None:
    base = {"causal": True, "n_layers": 3, "layer_windows": WINDOWS}
    with pytest.raises(ValueError, match=r"ModelConfig\.layer_windows=.*" + message):
        bl.ModelConfig(**{**base, **fields})


def test_model_cfg_gives_transformerlens_attn_types_or_refuses_two_window_sizes() -> None:
    cfg = _model(layer_windows=(4, None, 4)).cfg
    assert cfg.use_local_attn and cfg.window_size == 4 and cfg.attn_types == ["local", "global", "local"]
    plain = _model(layer_windows=None).cfg
    assert not plain.use_local_attn and plain.window_size is None and plain.attn_types is None
    with pytest.raises(ValueError, match=r"cfg.window_size: layer_windows=\(2, None, 3\) \(windows of 2"):
        _ = _model().cfg.window_size


def test_params_show_each_layers_window(capsys) -> None:
    assert main(["params", "--causal", "true", "--n-layers", "4", "--layer-windows", "8,none,8,none"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "attention per layer: 0, 2 local, window 8; 1, 3 global" in out


# ---- each layer's rotary base (Gemma 3: local layers 10000, global 1e6) --------------------------------


def hand_rotation(x, base):
    """x (B, h, T, d) with each half-pair (m, m + d/2) at position p rotated by p base^(-2m/d); float64."""
    d, T = x.shape[-1], x.shape[-2]
    out = x.clone()
    for p in range(T):
        for m in range(d // 2):
            c, s = math.cos(p * base ** (-2 * m / d)), math.sin(p * base ** (-2 * m / d))
            out[..., p, m] = x[..., p, m] * c - x[..., p, m + d // 2] * s
            out[..., p, m + d // 2] = x[..., p, m + d // 2] * c + x[..., p, m] * s
    return out


def test_local_layers_rotate_by_their_own_base_and_global_layers_by_rotary_base() -> None:
    """Layers 0 and 2 (a window) by local_rotary_base, layer 1 (global) by rotary_base, against a float64 hand
    rotation (blocklab's angles are float32, as transformers'); the other base is far off."""
    model = _model(rotary_base=10000.0, local_rotary_base=7.0)
    tokens = torch.randint(0, 29, (2, 9))
    _, cache = model.run_with_cache(tokens)
    for layer, window in enumerate(WINDOWS):
        assert model.config.rotary_of(layer) == ((7.0, None) if window else (10000.0, None))
        q = cache[f"blocks.{layer}.attn.q"]  # (B, h, T, d_k), before the rotation
        own, other = (7.0, 10000.0) if window is not None else (10000.0, 7.0)
        got = cache[f"blocks.{layer}.attn.rot_q"]
        torch.testing.assert_close(got, hand_rotation(q, own), rtol=0, atol=1e-6)
        assert (got - hand_rotation(q, other)).abs().max() > 1e-2


def test_a_local_base_reaches_the_lean_path_the_cache_and_generation() -> None:
    model = _model(local_rotary_base=7.0)
    lean = _model(local_rotary_base=7.0, fused=True)
    tokens = torch.randint(1, 29, (2, 6))
    assert lean.blocks[0].uses_lean_path
    torch.testing.assert_close(lean(tokens), model(tokens), rtol=0, atol=1e-12)
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[0, :3] = 0
    for fields in ({}, {"do_sample": True, "seed": 3, "top_k": 8}):
        cached = generate(model, tokens, 7, attention_mask=mask, **fields)
        assert torch.equal(cached, generate(model, tokens, 7, attention_mask=mask, use_cache=False, **fields))
    assert (_model()(tokens) - model(tokens)).abs().max() > 1e-3  # the same weights: the base matters
    assert model.cfg.rotary_base_local == 7.0 and _model().cfg.rotary_base_local is None
    again = from_dict(json.loads(json.dumps(model.config.to_dict())))
    assert again == model.config and again.local_rotary_base == 7.0


@pytest.mark.parametrize("fields,message", [
    ({"local_rotary_base": 0.0}, r"local_rotary_base=0.0 must be a finite number > 0"),
    ({"local_rotary_base": 7.0, "layer_windows": None}, r"local_rotary_base=7.0 is the rotary base of the "
                                                        r"layers with a window, but no layer has one"),
    ({"local_rotary_base": 7.0, "pos_encoding": "sinusoidal"}, r"local_rotary_base=7.0 applies to rotary"),
])
def test_a_local_rotary_base_that_cannot_apply_is_refused_by_name(fields, message) -> None:
    base = {"causal": True, "n_layers": 3, "layer_windows": WINDOWS, "pos_encoding": "rotary"}
    with pytest.raises(ValueError, match=r"ModelConfig\." + message):
        bl.ModelConfig(**{**base, **fields})


def test_params_show_each_layers_rotary_base(capsys) -> None:
    assert main(["params", "--causal", "true", "--n-layers", "2", "--layer-windows", "8,none",
                 "--pos-encoding", "rotary", "--local-rotary-base", "10000", "--rotary-base", "1e6"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "rotary base per layer: 10000 on the local layers (local_rotary_base), 1e+06 on the global" in out
