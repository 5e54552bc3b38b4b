"""The input embedding: token part (scale, init), position part (sinusoidal, learned, position_ids),
the ModelConfig fields that size them, and the presets' choices."""

from __future__ import annotations

import math

import pytest
import torch

import blocklab as bl
from blocklab.nn.config import from_saved_dict
from blocklab.nn.embedding import sinusoidal_table
from blocklab.nn.presets import EMBEDDING_CHOICES, PRESETS


def test_sinusoidal_table_follows_spec_formula() -> None:
    pe = sinusoidal_table(20, 10)
    for p in range(20):
        for i in range(5):
            assert pe[p, 2 * i].item() == pytest.approx(math.sin(p / 10000 ** (2 * i / 10)), abs=1e-6)
            assert pe[p, 2 * i + 1].item() == pytest.approx(math.cos(p / 10000 ** (2 * i / 10)), abs=1e-6)
    assert sinusoidal_table(4, 7).shape == (4, 7)  # odd widths work too


def small(**fields: object) -> bl.ModelConfig:
    return bl.ModelConfig(**{"vocab_size": 13, "max_seq_len": 12, "d_model": 16, "n_heads": 2,
                             "n_layers": 1, "d_ff": 32, **fields})


# ---- the token part: factor and init ------------------------------------------------------------


@pytest.mark.parametrize(("embed_scale", "factor"), [("sqrt_d_model", 4.0), ("none", 1.0)])
def test_token_part_is_the_factor_times_the_looked_up_row(embed_scale: str, factor: float) -> None:
    model = bl.Transformer(small(embed_scale=embed_scale)).double()
    tokens = torch.tensor([[3, 0, 12, 3]])
    _, cache = model.run_with_cache(tokens, names="tok")
    torch.testing.assert_close(cache["tok"], factor * model.embed.weight.detach()[tokens], rtol=0, atol=0)


@pytest.mark.parametrize(("fields", "weight_std", "part_std"), [
    (dict(embed_scale="sqrt_d_model", embed_std=1.0), 1 / 16, 1.0),  # tensor2tensor: N(0, 1/d) * sqrt(d)
    (dict(embed_scale="none", embed_std=1.0), 1.0, 1.0),  # nn.Embedding's N(0, 1)
    (dict(embed_scale="none", embed_std=0.02), 0.02, 0.02),  # GPT-2, BERT
    (dict(embed_scale="sqrt_d_model", embed_std=0.5), 0.5 / 16, 0.5),
])
def test_embed_std_is_the_token_parts_std_at_init(fields: dict, weight_std: float, part_std: float) -> None:
    torch.manual_seed(0)
    config = bl.ModelConfig(vocab_size=4000, d_model=256, n_heads=4, n_layers=1, d_ff=16, **fields)
    model = bl.Transformer(config)
    w = model.embed.weight.detach()
    # 1,024,000 draws: the sample std is within 0.5% of the true one with overwhelming probability
    assert float(w.std()) == pytest.approx(weight_std, rel=5e-3)
    assert float(model.embed(torch.arange(4000)[None]).detach().std()) == pytest.approx(part_std, rel=5e-3)


@pytest.mark.parametrize(("pos_std", "expected"), [(None, 0.7), (0.01, 0.01)])
def test_learned_positions_start_at_pos_std_or_embed_std(pos_std: float | None, expected: float) -> None:
    torch.manual_seed(0)
    config = bl.ModelConfig(max_seq_len=4096, d_model=256, n_heads=4, n_layers=1, d_ff=16,
                            pos_encoding="learned", embed_std=0.7, pos_std=pos_std)
    model = bl.Transformer(config)
    assert float(model.pos.weight.detach().std()) == pytest.approx(expected, rel=5e-3)


def test_a_tied_head_keeps_the_embedding_init_not_the_linear_init() -> None:
    torch.manual_seed(0)
    config = bl.ModelConfig(vocab_size=4000, d_model=256, n_heads=4, n_layers=1, d_ff=16, tie_embeddings=True,
                            embed_scale="none", embed_std=1.0)
    model = bl.Transformer(config)
    assert model.head.weight is model.embed.weight
    assert float(model.head.weight.detach().std()) == pytest.approx(1.0, rel=5e-3)


def test_state_dict_keys_are_unchanged() -> None:
    keys = set(bl.Transformer(small(pos_encoding="learned", type_vocab_size=2, embed_norm=True)).state_dict())
    assert {"embed.weight", "pos.weight", "token_type.weight", "embed_ln.weight", "embed_ln.bias"} <= keys
    assert not any("scale" in k for k in keys)  # the factor is a constant, not a parameter


# ---- position_ids -------------------------------------------------------------------------------


@pytest.mark.parametrize("pos_encoding", ["sinusoidal", "learned"])
def test_position_ids_pick_the_rows_of_the_position_code(pos_encoding: str) -> None:
    model = bl.Transformer(small(pos_encoding=pos_encoding)).double().eval()
    tokens = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    ids = torch.tensor([[0, 1, 2, 3], [0, 0, 5, 11]])
    _, cache = model.run_with_cache(tokens, position_ids=ids, names=["pos", "embed"])
    d = 16
    if pos_encoding == "sinusoidal":
        angle = lambda p, j: p / 10000 ** ((j - j % 2) / d)  # PE[p, 2i], PE[p, 2i+1]
        rows = [[math.sin(angle(p, j)) if j % 2 == 0 else math.cos(angle(p, j)) for j in range(d)]
                for p in range(12)]
        table = torch.tensor(rows, dtype=torch.float64)
    else:
        table = model.pos.weight.detach()
    torch.testing.assert_close(cache["pos"], table[ids], rtol=0, atol=1e-12)
    default = model(tokens[:1])  # 0..T-1 when no ids are given
    torch.testing.assert_close(model(tokens[:1], position_ids=ids[:1]), default, rtol=0, atol=0)


def test_left_padded_row_with_position_ids_equals_the_unpadded_row() -> None:
    model = bl.Transformer(small(norm_position="pre", causal=True, pos_encoding="learned")).double().eval()
    real = torch.tensor([[4, 9, 2, 7, 1]])
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), real], dim=1)  # 3 pads on the left
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1]])
    ids = (mask.cumsum(-1) - 1).clamp(min=0)  # [0, 0, 0, 0, 1, 2, 3, 4]
    out = model(padded, attention_mask=mask, position_ids=ids)[:, 3:]
    torch.testing.assert_close(out, model(real), rtol=0, atol=1e-12)


def test_position_ids_with_a_kv_cache_continue_each_row() -> None:
    from blocklab.nn.generate import new_kv_cache

    model = bl.Transformer(small(norm_position="pre", causal=True)).double().eval()
    tokens = torch.tensor([[4, 9, 2, 7, 1, 3]])
    full = model.encode(tokens)
    cache = new_kv_cache(model, 1, 6)
    first = model.encode(tokens[:, :4], kv_cache=cache, position_ids=torch.arange(4)[None])
    rest = model.encode(tokens[:, 4:], kv_cache=cache, position_ids=torch.tensor([[4, 5]]))
    torch.testing.assert_close(torch.cat([first, rest], dim=1), full, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("ids", "match"), [
    (torch.tensor([[0, 1, 2]]), r"position_ids must be \(batch, seq\) integers like tokens \(1, 4\)"),
    (torch.tensor([[0, 1, 2, 12]]), r"position_ids must be in \[0, 12\) \(max_seq_len\); got min 0, max 12"),
    (torch.tensor([[0, -1, 2, 3]]), r"got min -1"),
    (torch.tensor([[0.0, 1.0, 2.0, 3.0]]), "integers"),
])
def test_bad_position_ids_are_refused(ids: torch.Tensor, match: str) -> None:
    model = bl.Transformer(small())
    with pytest.raises(ValueError, match=match):
        model(torch.tensor([[1, 2, 3, 4]]), position_ids=ids)


# ---- the config fields --------------------------------------------------------------------------


@pytest.mark.parametrize(("fields", "message"), [
    (dict(embed_scale="sqrt_d"), "ModelConfig.embed_scale='sqrt_d' is not one of: sqrt_d_model, none"),
    (dict(embed_std=0.0), "ModelConfig.embed_std=0.0 must be a finite number > 0"),
    (dict(embed_std=float("nan")), "ModelConfig.embed_std=nan must be a finite number > 0"),
    (dict(embed_std=True), "ModelConfig.embed_std=True must be a finite number > 0"),
    (dict(embed_std="1"), "ModelConfig.embed_std='1' must be a finite number > 0"),
    (dict(pos_encoding="learned", pos_std=-0.1), "ModelConfig.pos_std=-0.1 must be a finite number > 0"),
    (dict(pos_encoding="sinusoidal", pos_std=0.01),
     "ModelConfig.pos_std=0.01 initialises learned positions, but pos_encoding='sinusoidal' has none"),
    (dict(pos_encoding="none", pos_std=0.01),
     "ModelConfig.pos_std=0.01 initialises learned positions, but pos_encoding='none' has none"),
])
def test_embedding_fields_are_validated_naming_field_and_value(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        bl.ModelConfig(**fields)


def test_integer_stds_are_floats_so_equal_configs_compare_equal() -> None:
    a = bl.ModelConfig(embed_std=1, pos_encoding="learned", pos_std=2)
    assert a == bl.ModelConfig(embed_std=1.0, pos_encoding="learned", pos_std=2.0)
    assert isinstance(a.embed_std, float) and isinstance(a.pos_std, float)


def test_every_preset_states_its_embedding_choice() -> None:
    for name, fields in PRESETS.items():
        assert name in EMBEDDING_CHOICES, name
        assert {"embed_scale", "embed_std"} <= set(fields), name  # chosen, not inherited by accident
    assert set(EMBEDDING_CHOICES) == set(PRESETS)


def test_gpt2_and_bert_presets_follow_their_released_code() -> None:
    gpt2 = bl.preset("gpt2")
    assert (gpt2.embed_scale, gpt2.embed_std, gpt2.pos_std) == ("none", 0.02, 0.01)
    bert = bl.preset("bert-base")
    assert (bert.embed_scale, bert.embed_std, bert.pos_std) == ("none", 0.02, None)


def test_a_config_saved_before_the_embedding_fields_loads_as_the_model_it_was() -> None:
    old = bl.ModelConfig().to_dict()
    for name in ("embed_scale", "embed_std", "pos_std"):
        old.pop(name)
    loaded = from_saved_dict(old)
    assert (loaded.embed_scale, loaded.embed_std, loaded.pos_std) == ("none", 0.02, None)


def test_a_presets_learned_pos_std_goes_with_its_learned_table() -> None:
    """gpt2's pos_std=0.01 describes its learned table: overriding the position code drops it, and a
    pos_std given with the override is still refused."""
    assert bl.preset("gpt2").pos_std == 0.01
    assert bl.preset("gpt2", pos_encoding="sinusoidal").pos_std is None
    assert bl.preset("gpt2").replace(pos_encoding="none").pos_std is None
    assert bl.preset("gpt2").replace(n_layers=1).pos_std == 0.01
    with pytest.raises(ValueError, match="ModelConfig.pos_std=0.01 initialises learned positions"):
        bl.preset("gpt2", pos_encoding="sinusoidal", pos_std=0.01)
