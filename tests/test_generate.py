"""Generation: the KV cache, greedy and top-k sampling, end-of-sequence handling.

Oracles: ``transformers``' GPT-2 (its logits and its ``generate``) for what the tokens must be,
and the full uncached forward pass for what the cache must reproduce.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may come from a hub

import pytest  # noqa: E402
import torch  # noqa: E402

import blocklab as bl  # noqa: E402
from blocklab.generate import generate, new_kv_cache  # noqa: E402
from blocklab.interop import load_pretrained  # noqa: E402

transformers = pytest.importorskip("transformers")

VOCAB = 61


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """A small random GPT2LMHeadModel (weights spread so that decoding varies) and its blocklab import."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=40, n_embd=32, n_layer=2, n_head=4,
                                     bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)
    hf = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.25)
    folder = tmp_path_factory.mktemp("gpt2")
    hf.save_pretrained(str(folder))
    model, _ = load_pretrained(folder)
    return hf, model


def _model(**overrides) -> bl.Transformer:
    config = bl.preset("gpt2", vocab_size=VOCAB, max_seq_len=24, d_model=32, n_heads=4, n_layers=2, d_ff=64,
                       **overrides)
    model = bl.Transformer(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)  # spread the logits so that greedy decoding varies
    return model


@pytest.mark.parametrize("overrides", [
    {},
    {"norm_position": "post", "final_norm": False},
    {"norm_position": "sandwich"},
    {"pos_encoding": "sinusoidal", "activation": "swiglu", "bias": False},
], ids=["pre", "post", "sandwich", "sinusoidal-swiglu"])
def test_cached_hidden_states_equal_the_full_forward_in_chunks(overrides):
    model = _model(**overrides)
    tokens = torch.randint(0, VOCAB, (2, 20))
    with torch.no_grad():
        full = model.encode(tokens)  # the oracle: every position in one causal pass
        cache = new_kv_cache(model, 2, 20)
        spans = ((0, 7), (7, 8), (8, 13), (13, 20))  # a prompt, one token, then several at once
        chunks = [model.encode(tokens[:, a:b], kv_cache=cache) for a, b in spans]
    assert cache[0].length == 20
    assert (torch.cat(chunks, dim=1) - full).abs().max().item() < 1e-5


@pytest.mark.parametrize("overrides", [{}, {"norm_position": "post"}], ids=["pre", "post"])
def test_kv_cached_generation_gives_the_same_tokens_as_uncached(overrides):
    model = _model(**overrides)
    prompt = torch.randint(0, VOCAB, (3, 4))
    cached = generate(model, prompt, 18)
    assert cached.shape == (3, 22) and torch.equal(cached[:, :4], prompt)
    assert len(set(cached[:, 4:].flatten().tolist())) > 5, "the continuation should vary"
    assert torch.equal(cached, generate(model, prompt, 18, use_cache=False))
    sampled = generate(model, prompt, 18, top_k=5, seed=3)
    assert torch.equal(sampled, generate(model, prompt, 18, top_k=5, seed=3, use_cache=False))


def test_cache_path_through_the_explicit_attention_matches_the_fast_path():
    model = _model()
    tokens = torch.randint(0, VOCAB, (2, 12))
    with torch.no_grad():
        cache = new_kv_cache(model, 2, 12)
        model.encode(tokens[:, :5], kv_cache=cache)
        fast = model.encode(tokens[:, 5:], kv_cache=cache)
        cache = new_kv_cache(model, 2, 12)
        _, seen = model.run_with_cache(tokens[:, :5], names="blocks.*.attn.weights")
        with model.hooks({"blocks.*.attn.weights": lambda w, name: None}):  # forces the explicit path
            model.encode(tokens[:, :5], kv_cache=cache)
            explicit = model.encode(tokens[:, 5:], kv_cache=cache)
    assert (fast - explicit).abs().max().item() < 1e-5
    assert seen["blocks.0.attn.weights"].shape == (2, 4, 5, 5)


def test_greedy_with_top_k_one_equals_transformers_greedy(gpt2):
    hf, model = gpt2
    prompt = torch.randint(0, VOCAB - 1, (2, 5))
    expected = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=20, do_sample=False,
                           eos_token_id=None, pad_token_id=0)
    assert torch.equal(generate(model, prompt, 20), expected)
    assert torch.equal(generate(model, prompt, 20, top_k=1, seed=7), expected)


def test_top_k_samples_stay_in_the_oracles_top_k(gpt2):
    hf, model = gpt2
    prompt = torch.randint(0, VOCAB - 1, (4, 3))
    out = generate(model, prompt, 15, top_k=3, seed=1)
    with torch.no_grad():
        logits = hf(out).logits  # (B, T, V): position t predicts token t + 1
    allowed = logits[:, 2:-1].topk(3, dim=-1).indices  # (B, 15, 3) for the 15 sampled positions
    assert (allowed == out[:, 3:, None]).any(-1).all()


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_top_k_sampling_frequencies_follow_the_renormalised_softmax(gpt2, temperature):
    hf, model = gpt2
    n, k = 6000, 4
    prompt = torch.tensor([[3, 14, 15]]).repeat(n, 1)
    first = generate(model, prompt, 1, top_k=k, temperature=temperature, seed=0)[:, -1]
    with torch.no_grad():
        logits = hf(prompt[:1]).logits[0, -1].double() / temperature
    top = logits.topk(k)
    expected = torch.softmax(top.values, dim=-1)  # the oracle's distribution over its top k
    counts = torch.stack([(first == i).sum() for i in top.indices]).double()
    assert counts.sum() == n  # nothing outside the top k
    # binomial standard error <= sqrt(0.25 / 6000) = 0.0065: 0.03 is ~4.6 sigma
    assert (counts / n - expected).abs().max().item() < 0.03


def test_rows_that_reach_eos_are_padded_and_generation_stops_like_transformers(gpt2):
    hf, model = gpt2
    prompt = torch.randint(0, VOCAB - 1, (3, 4))
    free = generate(model, prompt, 12)
    eos = int(free[0, 6])  # a token row 0 produces at its 3rd step: use it as the end of sequence
    ours = generate(model, prompt, 12, eos_id=eos)
    theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12, do_sample=False,
                         eos_token_id=eos, pad_token_id=eos)
    assert torch.equal(ours, theirs)
    assert (ours[0, 7:] == eos).all()


def test_generation_errors_name_the_problem():
    model = _model()
    prompt = torch.randint(0, VOCAB, (1, 20))
    too_long = r"\(20 tokens\) \+ max_new_tokens \(5\) = 25 exceeds the model's max_seq_len=24"
    with pytest.raises(ValueError, match=too_long):
        generate(model, prompt, 5)
    with pytest.raises(ValueError, match="top_k=0 must be >= 1"):
        generate(model, prompt[:, :3], 2, top_k=0)
    with pytest.raises(ValueError, match="temperature=0.0 must be > 0"):
        generate(model, prompt[:, :3], 2, top_k=2, temperature=0.0)
    encoder = bl.Transformer(bl.ModelConfig())
    with pytest.raises(ValueError, match="generate needs a causal model"):
        generate(encoder, torch.zeros(1, 2, dtype=torch.long), 2)


def test_generate_restores_training_mode():
    model = _model(dropout=0.1).train()
    generate(model, torch.zeros(1, 2, dtype=torch.long), 2)
    assert model.training
