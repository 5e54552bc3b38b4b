"""Analytic parameter counts equal the built model's and the published totals."""

import itertools

import pytest
import torch

from blocklab import ModelConfig, Transformer, count_parameters, preset
from blocklab.nn.config import NORM_POSITIONS
from blocklab.nn.presets import PRESETS, PUBLISHED_TOTALS


def built(config: ModelConfig) -> int:
    with torch.device("meta"):  # shapes only: even gpt3-175b costs no memory
        return sum(p.numel() for p in Transformer(config).parameters())


VARIANTS = [
    dict(
        zip(
            ("norm_position", "residual", "norm", "activation", "bias", "tie_embeddings", "pos_encoding"),
            combo,
            strict=True,
        )
    )
    for combo in itertools.product(
        NORM_POSITIONS,
        ["add", "none"],
        ["standard", "rms", "none"],
        ["relu", "swiglu"],
        [True, False],
        [True, False],
        ["sinusoidal", "learned"],
    )
] + [
    dict(residual="rezero", norm="none"),
    dict(residual="deepnorm"),
    dict(type_vocab_size=2, embed_norm=True),
    dict(final_norm=True),
    dict(norm_position="pre", final_norm=False),
    # heads of their own width, grouped, with biases on q, k, v; QK-norm per head and over all heads
    dict(head_dim=24, n_kv_heads=2, qkv_bias=True, bias=False, qk_norm="head", norm="rms"),
    dict(head_dim=8, n_kv_heads=1, qk_norm="all_heads", norm="standard"),
]


@pytest.mark.parametrize("changes", VARIANTS, ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
def test_count_equals_built_model(changes) -> None:
    config = ModelConfig(**changes)
    count = count_parameters(config)
    assert count.total == built(config)
    assert sum(count.components.values()) == count.total


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_count_equals_built_model(name) -> None:
    assert count_parameters(preset(name)).total == built(preset(name))


def test_worked_examples_from_spec() -> None:
    per_layer = count_parameters(ModelConfig(d_model=64, d_ff=256, bias=False)).per_layer
    assert per_layer["attn"] == 16_384
    assert count_parameters(ModelConfig(d_model=64, d_ff=256)).per_layer["ffn"] == 33_088
    assert count_parameters(ModelConfig(d_model=64)).per_layer["ln1"] == 128


def test_gpt2_small_with_tied_embeddings_is_124_439_808() -> None:
    assert count_parameters(preset("gpt2")).total == 124_439_808


@pytest.mark.parametrize("name", ["gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"])
def test_gpt2_family_equals_transformers(name) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    c = preset(name)
    hf = GPT2Config(
        n_embd=c.d_model,
        n_layer=c.n_layers,
        n_head=c.n_heads,
        n_positions=c.max_seq_len,
        vocab_size=c.vocab_size,
    )
    with torch.device("meta"):
        total = sum(p.numel() for p in GPT2LMHeadModel(hf).parameters())  # tied head counted once
    assert count_parameters(c).total == total == PUBLISHED_TOTALS[name]


def test_bert_base_equals_transformers_bert_model_without_pooler() -> None:
    from transformers import BertConfig, BertModel

    with torch.device("meta"):
        bert = BertModel(BertConfig(), add_pooling_layer=False)
        total = sum(p.numel() for p in bert.parameters())
    assert count_parameters(preset("bert-base")).total == total == 108_891_648
    assert total + 768 * 768 + 768 == PUBLISHED_TOTALS["bert-base"]  # the pooler, which we don't build


@pytest.mark.parametrize(
    ("name", "paper"),
    [
        ("gpt3-small", 125e6),
        ("gpt3-medium", 350e6),
        ("gpt3-large", 760e6),
        ("gpt3-xl", 1.3e9),
        ("gpt3-2.7b", 2.7e9),
        ("gpt3-6.7b", 6.7e9),
        ("gpt3-13b", 13.0e9),
        ("gpt3-175b", 175.0e9),
    ],
)
def test_gpt3_family_matches_paper_table(name, paper) -> None:
    # Brown et al. 2020 Table 2.1 gives rounded totals, and some do not follow from its own shapes:
    # medium's 24 x 1024 gives 355.9M (listed 350M), XL 1.316B (1.3B), 175B 174.6B (175.0B).
    total = count_parameters(preset(name)).total
    assert abs(total - paper) / paper < 0.02
