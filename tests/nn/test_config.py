"""ModelConfig: defaults, resolution rules, and one clear error per validation rule."""

import pytest

from blocklab import ModelConfig, preset
from blocklab.nn.config import FIELDS, from_dict, resolve_d_ff
from blocklab.nn.presets import PRESETS


def test_defaults_are_the_listops_seed_preset() -> None:
    assert ModelConfig() == preset("listops-seed")
    c = ModelConfig()
    assert (c.d_model, c.n_heads, c.n_layers, c.d_ff, c.activation, c.norm_position) == (
        64,
        4,
        2,
        256,
        "relu",
        "post",
    )


def test_final_norm_defaults_on_for_pre_norm_and_off_for_post_norm() -> None:
    assert ModelConfig(norm_position="pre").final_norm is True
    assert ModelConfig(norm_position="sandwich").final_norm is True
    assert ModelConfig(norm_position="post").final_norm is False
    assert ModelConfig(norm_position="post", final_norm=True).final_norm is True


@pytest.mark.parametrize(
    ("d_ff", "d_model", "expected"),
    [
        (256, 64, 256),
        (4.0, 64, 256),
        ("4x", 64, 256),
        ("8/3x", 384, 1024),
        ("8/3x", 64, 171),
        (2.5, 10, 25),
        ("300", 64, 300),
    ],
)
def test_d_ff_ratio_rounds_half_up(d_ff, d_model, expected) -> None:
    assert resolve_d_ff(d_ff, d_model) == expected
    assert ModelConfig(d_model=d_model, n_heads=1, d_ff=d_ff).d_ff == expected


@pytest.mark.parametrize(
    ("changes", "fragments"),
    [
        ({"n_heads": 3}, ["n_heads=3", "must divide d_model=64"]),
        ({"d_ff": 0}, ["d_ff=0", ">= 1"]),
        ({"d_ff": "abc"}, ["d_ff='abc'", "ratio"]),
        ({"d_ff": -2.0}, ["d_ff", "> 0"]),
        ({"vocab_size": 0}, ["vocab_size=0", ">= 1"]),
        ({"max_seq_len": -1}, ["max_seq_len=-1"]),
        ({"d_model": 0}, ["d_model=0"]),
        ({"n_layers": 0}, ["n_layers=0"]),
        ({"n_heads": 2.0}, ["n_heads=2.0", "integer"]),
        ({"activation": "swish"}, ["activation='swish'", "relu", "geglu"]),
        ({"norm": "layer"}, ["norm='layer'", "standard", "rms"]),
        ({"norm_position": "middle"}, ["norm_position='middle'", "post", "sandwich"]),
        ({"residual": "skip"}, ["residual='skip'", "rezero", "deepnorm"]),
        ({"pos_encoding": "rope"}, ["pos_encoding='rope'", "sinusoidal", "learned"]),
        ({"eps": 0.0}, ["eps=0.0", "> 0"]),
        ({"eps": -1e-5}, ["eps=-1e-05"]),
        ({"bias": 1}, ["bias=1", "true or false"]),
        ({"causal": "yes"}, ["causal='yes'", "true or false"]),
        ({"tie_embeddings": None}, ["tie_embeddings=None"]),
        ({"dropout": 1.0}, ["dropout=1.0", "[0, 1)"]),
        ({"dropout": -0.1}, ["dropout=-0.1"]),
        ({"type_vocab_size": -1}, ["type_vocab_size=-1"]),
        ({"residual": "rezero"}, ["rezero", "norm='standard'", "'none'"]),
        ({"residual": "deepnorm", "norm_position": "pre"}, ["deepnorm", "norm_position='pre'", "'post'"]),
        ({"residual": "deepnorm", "norm": "none"}, ["deepnorm", "norm='none'"]),
    ],
)
def test_invalid_config_names_field_value_and_rule(changes, fragments) -> None:
    with pytest.raises(ValueError) as info:
        ModelConfig(**changes)
    message = str(info.value)
    assert message.startswith("ModelConfig.")
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_valid_variants_construct() -> None:
    ModelConfig(residual="rezero", norm="none")
    ModelConfig(residual="deepnorm", norm_position="post")
    ModelConfig(residual="none", norm="rms", norm_position="sandwich", activation="swiglu")


def test_from_dict_rejects_unknown_fields_by_name() -> None:
    with pytest.raises(ValueError, match="no field d_hidden"):
        from_dict({"d_hidden": 3})


def test_round_trip_and_replace_revalidates() -> None:
    c = preset("gpt2")
    assert from_dict(c.to_dict()) == c
    assert c.replace(n_layers=2).n_layers == 2
    with pytest.raises(ValueError, match="n_heads=5"):
        c.replace(n_heads=5)
    assert set(c.to_dict()) == set(FIELDS)


def test_unknown_preset_lists_the_presets() -> None:
    with pytest.raises(ValueError) as info:
        preset("gpt5")
    assert "gpt2" in str(info.value) and "listops-seed" in str(info.value)


def test_every_preset_is_valid_and_frozen() -> None:
    for name in PRESETS:
        c = preset(name)
        with pytest.raises(AttributeError):
            c.d_model = 1  # type: ignore[misc]


def test_a_config_with_rope_scaling_hashes_and_keeps_its_own_copy() -> None:
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
    a = ModelConfig(pos_encoding="rotary", rope_scaling=scaling)
    b = ModelConfig(pos_encoding="rotary", rope_scaling=dict(scaling))
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    scaling["factor"] = 2.0  # the caller's dict changes; the config does not
    assert a.rope_scaling["factor"] == 8.0
