"""Generation: the KV cache, greedy and sampled decoding, batches with padding, the sliding window,
stops and streaming.

Oracles: ``transformers``' GPT-2 (its ``generate``, its logits processors and its forward pass inside
a written-out sliding-window loop) for what the tokens must be; the full uncached forward pass for
what the cache must reproduce; each prompt generated alone for what a padded batch must give.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may come from a hub

import pytest
import torch

import blocklab as bl
from blocklab.nn.generate import (
    GenerationConfig,
    generate,
    new_kv_cache,
    penalize_repetition,
    top_k_filter,
    top_p_filter,
)
from blocklab.nn.tokens import pad_batch
from blocklab.tasks.vocab import Tokenizer
from blocklab.weights import load_pretrained

transformers = pytest.importorskip("transformers")

VOCAB = 61
N_POSITIONS = 40
EOS = VOCAB - 1


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """A small random GPT2LMHeadModel (weights spread so that decoding varies) and its blocklab import."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=N_POSITIONS, n_embd=32, n_layer=2,
                                     n_head=4, bos_token_id=EOS, eos_token_id=EOS)
    hf = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.25)
    folder = tmp_path_factory.mktemp("gpt2")
    hf.save_pretrained(str(folder))
    model, _ = load_pretrained(folder)
    return hf, model


def hf_generate(hf, prompt, mask=None, **settings):
    """transformers' generate, every default that would differ from blocklab's spelled out."""
    settings = {"do_sample": False, "eos_token_id": None, "pad_token_id": EOS, "top_k": 0, **settings}
    mask = torch.ones_like(prompt) if mask is None else mask
    with torch.no_grad():
        return hf.generate(prompt, attention_mask=mask, **settings)


def _model(**overrides) -> bl.Transformer:
    config = bl.preset("gpt2", vocab_size=VOCAB, max_seq_len=24, d_model=32, n_heads=4, n_layers=2, d_ff=64,
                       **overrides)
    model = bl.Transformer(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)  # spread the logits so that greedy decoding varies
    return model


def left_padded(lengths, seed=0):
    """Random prompts of the given lengths, left-padded with EOS: (ids, mask, the prompts as lists)."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(0, VOCAB - 1, (n,), generator=g).tolist() for n in lengths]
    ids, mask = pad_batch(rows, EOS, "left")
    return ids, mask, rows


# ---- the KV cache ----------------------------------------------------------------------------------


@pytest.mark.parametrize("overrides", [
    {},
    {"norm_position": "post", "final_norm": False},
    {"norm_position": "sandwich"},
    {"norm_position": "parallel"},
    {"norm_position": "parallel_shared"},
    {"pos_encoding": "sinusoidal", "activation": "swiglu", "bias": False},
    {"pos_encoding": "rotary", "pos_std": None, "n_kv_heads": 2, "norm": "rms", "bias": False},
    {"pos_encoding": "rotary", "pos_std": None, "n_kv_heads": 1, "sliding_window": 5, "rotary_fraction": 0.5},
], ids=["pre", "post", "sandwich", "parallel", "parallel_shared", "sinusoidal-swiglu", "rotary-gqa",
        "rotary-mqa-window"])
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


@pytest.mark.parametrize("overrides", [
    {}, {"norm_position": "post"},
    {"pos_encoding": "rotary", "pos_std": None, "n_kv_heads": 2, "sliding_window": 4},
], ids=["pre", "post", "rotary-gqa-window"])
def test_kv_cached_generation_gives_the_same_tokens_as_uncached(overrides):
    model = _model(**overrides)
    ids, mask, _ = left_padded([4, 2, 6])
    cached = generate(model, ids, attention_mask=mask, max_new_tokens=30)  # 36 columns: the window slides
    assert cached.shape == (3, 36) and torch.equal(cached[:, :6], ids)
    assert len(set(cached[:, 6:].flatten().tolist())) > 5, "the continuation should vary"
    assert torch.equal(cached, generate(model, ids, attention_mask=mask, max_new_tokens=30, use_cache=False))
    sampled = dict(do_sample=True, top_k=5, top_p=0.9, seed=3, max_new_tokens=30)
    assert torch.equal(generate(model, ids, attention_mask=mask, **sampled),
                       generate(model, ids, attention_mask=mask, use_cache=False, **sampled))


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


# ---- equal to transformers -------------------------------------------------------------------------


def test_greedy_equals_transformers_greedy(gpt2):
    hf, model = gpt2
    prompt = torch.randint(0, VOCAB - 1, (2, 5))
    assert torch.equal(generate(model, prompt, max_new_tokens=20), hf_generate(hf, prompt, max_new_tokens=20))


def test_a_weight_changed_after_a_first_generation_is_what_the_next_one_uses(gpt2):
    """Nothing built from the weights at the first call (a concatenated q/k/v or gate/up matrix) is kept
    stale: the same change to attention's q and the FFN's first matrix in both models, after a first
    generation, gives transformers' tokens again, and other tokens than before."""
    import copy
    import dataclasses

    hf = copy.deepcopy(gpt2[0])
    model = bl.Transformer(dataclasses.replace(gpt2[1].config, fused=True)).eval()  # the fused kernels
    model.load_state_dict(gpt2[1].state_dict())
    prompt = torch.randint(0, VOCAB - 1, (2, 5), generator=torch.Generator().manual_seed(3))
    before = generate(model, prompt, max_new_tokens=12)
    d = model.config.d_model
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for block, layer in zip(model.blocks, hf.transformer.h, strict=True):
            dq = 0.5 * torch.randn(d, d, generator=g, dtype=torch.float64).float()  # (out, in)
            dw = 0.5 * torch.randn(block.ffn.w1.weight.shape, generator=g, dtype=torch.float64).float()
            block.attn.q.weight += dq
            layer.attn.c_attn.weight[:, :d] += dq.T  # Conv1D: (in, out), q's columns first
            block.ffn.w1.weight += dw
            layer.mlp.c_fc.weight += dw.T
    after = generate(model, prompt, max_new_tokens=12)
    assert torch.equal(after, hf_generate(hf, prompt, max_new_tokens=12))
    assert not torch.equal(after, before)


def test_left_padded_batch_equals_each_prompt_alone_and_transformers_greedy(gpt2):
    hf, model = gpt2
    ids, mask, rows = left_padded([3, 7, 1, 5], seed=1)
    ours = generate(model, ids, attention_mask=mask, max_new_tokens=16)
    assert torch.equal(ours, hf_generate(hf, ids, mask, max_new_tokens=16))
    for i, row in enumerate(rows):  # positions count from each row's first real token
        alone = generate(model, torch.tensor([row]), max_new_tokens=16)
        assert ours[i, ids.shape[1] - len(row):].tolist() == alone[0].tolist()


# Sampling settings where blocklab and transformers run the same algorithm: the same processors in the
# same order (repetition penalty; temperature, top-k, top-p), softmax over the whole vocabulary and one
# torch.multinomial draw per row and step from a generator seeded alike. They differ (and are not
# compared) for repetition penalty on a padded batch: transformers also penalises the pad id, which is
# in its input ids; blocklab penalises real tokens only.
AGREE = {
    "temperature": dict(do_sample=True, temperature=0.7),
    "top-k": dict(do_sample=True, top_k=5),
    "top-p": dict(do_sample=True, top_p=0.8),
    "all": dict(do_sample=True, temperature=1.3, top_k=12, top_p=0.9),
    "repetition-greedy": dict(repetition_penalty=1.8),
    "repetition-sampled": dict(do_sample=True, top_p=0.95, repetition_penalty=1.4),
}


@pytest.mark.parametrize("settings", AGREE.values(), ids=AGREE)
@pytest.mark.parametrize("seed", [0, 1])
def test_sampling_equals_transformers_with_the_same_seed(gpt2, settings, seed):
    hf, model = gpt2
    prompt = torch.randint(0, VOCAB - 1, (3, 4), generator=torch.Generator().manual_seed(seed))
    seeded = {"seed": seed} if settings.get("do_sample") else {}
    ours = generate(model, prompt, max_new_tokens=24, **settings, **seeded)
    torch.manual_seed(seed)  # transformers draws from the global generator
    theirs = hf_generate(hf, prompt, max_new_tokens=24, **settings)
    assert torch.equal(ours, theirs)


def test_sampled_left_padded_batch_equals_transformers(gpt2):
    hf, model = gpt2
    ids, mask, _ = left_padded([2, 6, 4], seed=2)
    ours = generate(model, ids, attention_mask=mask, max_new_tokens=20, do_sample=True, top_k=8, seed=5)
    torch.manual_seed(5)
    assert torch.equal(ours, hf_generate(hf, ids, mask, max_new_tokens=20, do_sample=True, top_k=8))


class StepTemperature:
    """A transformers logits processor dividing the step-th new token's logits by temperatures[step]
    (transformers has no temperature schedule; its own warpers still do top-k, top-p and the draws)."""

    def __init__(self, prompt_len, temperatures):
        self.prompt_len, self.temperatures = prompt_len, temperatures

    def __call__(self, input_ids, scores):
        return scores / self.temperatures[input_ids.shape[1] - self.prompt_len]


@pytest.mark.parametrize("start, end, filters", [
    (2.0, 0.3, {}),
    (0.4, 1.6, {"top_k": 12, "top_p": 0.9}),
])
@pytest.mark.parametrize("seed", [0, 1])
def test_temperature_schedule_equals_transformers_per_step(gpt2, start, end, filters, seed):
    from transformers import LogitsProcessorList

    hf, model = gpt2
    n = 24
    ids, mask, _ = left_padded([3, 6, 1], seed=seed)
    ours = generate(model, ids, n, attention_mask=mask, temperature=start, temperature_end=end, seed=seed,
                    **filters)
    temperatures = torch.linspace(start, end, n, dtype=torch.float64).tolist()  # first .. last new token
    torch.manual_seed(seed)
    theirs = hf_generate(hf, ids, mask, max_new_tokens=n, do_sample=True, **filters,
                         logits_processor=LogitsProcessorList([StepTemperature(ids.shape[1], temperatures)]))
    assert torch.equal(ours, theirs)
    constant = generate(model, ids, n, attention_mask=mask, temperature=start, seed=seed, **filters)
    assert not torch.equal(ours, constant)  # the schedule changes the draws


def test_filters_equal_transformers_logits_processors():
    from transformers.generation.logits_process import (
        RepetitionPenaltyLogitsProcessor,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0)) * 3
    logits[0, :10] = 2.5  # ties at the k-th value stay in both
    for k in (1, 5, 10, 50, 80):
        assert torch.equal(top_k_filter(logits, k), TopKLogitsWarper(k)(None, logits))
    for p in (0.05, 0.5, 0.9, 0.999, 1.0):
        assert torch.equal(top_p_filter(logits, p), TopPLogitsWarper(p)(None, logits))
    ids = torch.randint(0, 50, (6, 7))
    seen = torch.zeros(6, 50, dtype=torch.bool).scatter_(1, ids, True)
    expected = RepetitionPenaltyLogitsProcessor(1.3)(ids, logits)
    assert torch.equal(penalize_repetition(logits, seen, 1.3), expected)


@pytest.mark.parametrize("temperature", [1e-40, 4e-45, 1e-300])
def test_a_vanishing_temperature_samples_the_argmax_not_nan(gpt2, temperature):
    """Issue 30, E5: l / 1e-40 is infinite and softmax of it NaN; softmax((l - max l) / T) tends to the
    argmax, so sampling at such a temperature gives transformers' greedy tokens."""
    hf, model = gpt2
    ids, mask, _ = left_padded([5, 9], seed=11)
    ours = generate(model, ids, 12, attention_mask=mask, do_sample=True, temperature=temperature, seed=0)
    assert torch.equal(ours, hf_generate(hf, ids, mask, max_new_tokens=12))


def test_top_k_samples_stay_in_the_oracles_top_k(gpt2):
    hf, model = gpt2
    prompt = torch.randint(0, VOCAB - 1, (4, 3))
    out = generate(model, prompt, max_new_tokens=15, do_sample=True, top_k=3, seed=1)
    with torch.no_grad():
        logits = hf(out).logits  # (B, T, V): position t predicts token t + 1
    allowed = logits[:, 2:-1].topk(3, dim=-1).indices  # (B, 15, 3) for the 15 sampled positions
    assert (allowed == out[:, 3:, None]).any(-1).all()


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_top_k_sampling_frequencies_follow_the_renormalised_softmax(gpt2, temperature):
    hf, model = gpt2
    n, k = 6000, 4
    prompt = torch.tensor([[3, 14, 15]]).repeat(n, 1)
    first = generate(model, prompt, max_new_tokens=1, do_sample=True, top_k=k, temperature=temperature,
                     seed=0)[:, -1]
    with torch.no_grad():
        logits = hf(prompt[:1]).logits[0, -1].double() / temperature
    top = logits.topk(k)
    expected = torch.softmax(top.values, dim=-1)  # the oracle's distribution over its top k
    counts = torch.stack([(first == i).sum() for i in top.indices]).double()
    assert counts.sum() == n  # nothing outside the top k
    # binomial standard error <= sqrt(0.25 / 6000) = 0.0065: 0.03 is ~4.6 sigma
    assert (counts / n - expected).abs().max().item() < 0.03


# ---- the sliding window ----------------------------------------------------------------------------


def windowed_oracle(hf, prompt, new, shift):
    """The window written out over transformers' forward pass: the last columns, at most n_positions,
    dropping ``shift`` columns whenever the next token would not fit; greedy."""
    seq, start = prompt, max(0, prompt.shape[1] - N_POSITIONS)
    for _ in range(new):
        if seq.shape[1] - start > N_POSITIONS:
            start += shift
        with torch.no_grad():
            logits = hf(seq[:, start:]).logits[:, -1]  # positions 0.. from the window's first column
        seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], dim=1)
    return seq


@pytest.mark.parametrize("shift", [1, 7])
@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "no-cache"])
def test_sliding_window_past_max_seq_len_equals_the_written_out_window(gpt2, shift, use_cache):
    hf, model = gpt2
    prompt = torch.randint(0, VOCAB - 1, (2, 10), generator=torch.Generator().manual_seed(3))
    ours = generate(model, prompt, max_new_tokens=50, window_shift=shift, use_cache=use_cache)  # 60 > 40
    assert ours.shape == (2, 60)
    assert torch.equal(ours, windowed_oracle(hf, prompt, 50, shift))


def test_a_prompt_longer_than_the_window_keeps_its_last_columns_in_view(gpt2):
    hf, model = gpt2
    prompt = torch.randint(0, VOCAB - 1, (1, 45), generator=torch.Generator().manual_seed(4))
    ours = generate(model, prompt, max_new_tokens=8)
    assert torch.equal(ours[:, :45], prompt)
    assert torch.equal(ours, windowed_oracle(hf, prompt, 8, 1))


@pytest.mark.parametrize("shift", [1, 3, 7])
@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "no-cache"])
def test_padded_batch_with_the_window_equals_each_prompt_alone(gpt2, shift, use_cache):
    """Issue 30, W2: each row's window slides when its own sequence outgrows the window, as it does alone;
    with shift > 1 a 1-token prompt beside a 12-token one continued differently from alone."""
    hf, model = gpt2
    ids, mask, rows = left_padded([12, 1, 3, 8], seed=5)
    ours = generate(model, ids, attention_mask=mask, max_new_tokens=45, window_shift=shift,
                    use_cache=use_cache)  # 57 columns: every row slides
    for i, row in enumerate(rows):
        alone = windowed_oracle(hf, torch.tensor([row]), 45, shift)  # transformers, the row on its own
        assert ours[i, ids.shape[1] - len(row):].tolist() == alone[0].tolist(), (i, len(row))


# ---- stops and streaming ---------------------------------------------------------------------------


def test_several_stop_ids_finish_rows_like_transformers_eos_list(gpt2):
    hf, model = gpt2
    ids, mask, _ = left_padded([4, 2, 5], seed=6)
    free = generate(model, ids, attention_mask=mask, max_new_tokens=14)
    stops = [int(free[0, 8]), int(free[1, 11])]  # tokens rows 0 and 1 produce along the way
    ours = generate(model, ids, attention_mask=mask, max_new_tokens=14, stop_ids=stops, pad_id=EOS)
    theirs = hf_generate(hf, ids, mask, max_new_tokens=14, eos_token_id=stops, pad_token_id=EOS)
    assert torch.equal(ours, theirs)
    first = next(c for c in range(ids.shape[1], free.shape[1]) if int(free[0, c]) in stops)
    assert torch.equal(ours[0, : first + 1], free[0, : first + 1]) and (ours[0, first + 1 :] == EOS).all()


def word_model() -> tuple[bl.Transformer, Tokenizer]:
    model = _model()
    model.tokenizer = Tokenizer(["<PAD>", *(f"w{i}" for i in range(1, VOCAB))])
    return model, model.tokenizer


def test_a_stop_string_finishes_the_row_at_the_token_that_completes_it():
    model, tok = word_model()
    ids, mask = tok.encode_batch(["w1 w2", "w3 w4 w5 w6"], padding="left")
    free = generate(model, ids, attention_mask=mask, max_new_tokens=12)
    words = tok.decode(free[0, ids.shape[1]:]).split()
    stop = " ".join(words[4:6])  # two words row 0 generates: a string spanning two tokens
    ours = generate(model, ids, attention_mask=mask, max_new_tokens=12, stop_strings=[stop])
    T = ids.shape[1]
    first = next(n for n in range(1, 13) if stop in tok.decode(free[0, T:T + n]))  # independent: text search
    assert ours[0, :T + first].tolist() == free[0, :T + first].tolist()
    assert (ours[0, T + first:] == tok.pad_id).all()
    row1_hits = [n for n in range(1, 13) if stop in tok.decode(free[1, T:T + n])]
    expected_row1 = free[1, :T + (row1_hits[0] if row1_hits else 12)]
    assert ours[1, :len(expected_row1)].tolist() == expected_row1.tolist()


def test_streaming_callback_sees_each_column_in_order_as_it_is_made(gpt2):
    _, model = gpt2
    ids, mask, _ = left_padded([3, 5], seed=7)
    free = generate(model, ids, attention_mask=mask, max_new_tokens=10)
    stop = int(free[1, 9])  # row 1 stops at its 5th new token
    calls = []

    def on_token(new, active):
        calls.append((new.clone(), active.clone()))

    out = generate(model, ids, attention_mask=mask, max_new_tokens=10, stop_ids=[stop], on_token=on_token)
    T = ids.shape[1]
    assert torch.equal(torch.stack([new for new, _ in calls], dim=1), out[:, T:])
    finished = (out[:, T:] == stop).int().cumsum(1)  # columns after a row's first stop token
    finished = torch.cat([torch.zeros(2, 1, dtype=torch.int), finished[:, :-1]], dim=1) > 0
    assert torch.equal(torch.stack([active for _, active in calls], dim=1), ~finished)


def test_streaming_happens_before_generation_ends():
    model = _model().train()
    seen = []

    def stop_after_three(new, active):
        seen.append(new)
        if len(seen) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        generate(model, torch.zeros(1, 2, dtype=torch.long), max_new_tokens=10, on_token=stop_after_three)
    assert len(seen) == 3 and model.training  # the mode is restored however generation ends


# ---- errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("fields, message", [
    ({"do_sample": False, "top_k": 5}, r"top_k=5 only applies to sampling, but do_sample=False"),
    ({"seed": 3}, r"GenerationConfig.seed=3 only applies to sampling: set do_sample=True \(or a temperature"),
    ({"do_sample": True, "temperature": 0.0}, r"GenerationConfig.temperature=0.0 must be > 0"),
    ({"temperature_end": -1.0}, r"GenerationConfig.temperature_end=-1.0 must be > 0 \(or None"),
    ({"do_sample": False, "temperature_end": 0.5}, r"temperature_end=0.5 only applies to sampling, but do_s"),
    ({"do_sample": True, "top_k": 0}, r"GenerationConfig.top_k=0 must be an integer >= 1"),
    ({"do_sample": True, "top_p": 1.5}, r"GenerationConfig.top_p=1.5 must be in \(0, 1\]"),
    ({"repetition_penalty": 0}, r"GenerationConfig.repetition_penalty=0 must be > 0"),
    ({"max_new_tokens": -1}, r"GenerationConfig.max_new_tokens=-1 must be an integer >= 0"),
    ({"window_shift": 0}, r"GenerationConfig.window_shift=0 must be an integer >= 1"),
    ({"stop_strings": [""]}, r"GenerationConfig.stop_strings=\(''.*must be non-empty strings"),
    ({"top_q": 1}, r"GenerationConfig has no field 'top_q'"),
])
def test_generation_config_names_field_value_and_rule(fields, message):
    with pytest.raises(ValueError, match=message):
        generate(_model(), torch.zeros(1, 2, dtype=torch.long), **fields)


def test_generation_errors_name_the_problem():
    model = _model()
    prompt = torch.randint(0, VOCAB, (2, 4))
    right = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    with pytest.raises(ValueError, match=r"row 1 has padding after a real token: generate needs left pad"):
        generate(model, prompt, attention_mask=right)
    with pytest.raises(ValueError, match=r"prompt row 0 is all padding"):
        generate(model, prompt, attention_mask=torch.tensor([[0, 0, 0, 0], [1, 1, 1, 1]]))
    with pytest.raises(ValueError, match=r"window_shift=25 must be <= the model's max_seq_len=24"):
        generate(model, prompt, window_shift=25)
    with pytest.raises(ValueError, match=r"stop_strings need the model's tokenizer"):
        generate(model, prompt, stop_strings=["w1"])
    with pytest.raises(ValueError, match=r"stop_ids=\(61,\) must be ids below the model's vocab_size=61"):
        generate(model, prompt, stop_ids=[VOCAB])
    encoder = bl.Transformer(bl.ModelConfig())
    with pytest.raises(ValueError, match="generate needs a causal model"):
        generate(encoder, torch.zeros(1, 2, dtype=torch.long))


def test_generate_restores_training_mode():
    model = _model(dropout=0.1).train()
    generate(model, torch.zeros(1, 2, dtype=torch.long), max_new_tokens=2)
    assert model.training


def test_config_object_and_field_overrides_combine():
    model = _model()
    prompt = torch.randint(0, VOCAB, (1, 3))
    config = GenerationConfig(max_new_tokens=6, do_sample=True, top_k=4, seed=2)
    from_config = generate(model, prompt, config=config)
    assert torch.equal(from_config, generate(model, prompt, config=config.replace(seed=3, top_p=0.5).replace(
        seed=2, top_p=None)))
    assert torch.equal(from_config, generate(model, prompt, 6, do_sample=True, top_k=4, seed=2))
    assert generate(model, prompt, 2, config=config).shape == (1, 5)  # the positional count wins


def test_a_sampling_setting_turns_sampling_on_unless_do_sample_is_false():
    assert GenerationConfig(top_p=0.9).sampling and GenerationConfig(temperature=0.5).sampling
    assert GenerationConfig(temperature_end=0.5).sampling
    assert not GenerationConfig().sampling and not GenerationConfig(repetition_penalty=1.2).sampling
    model = _model()
    prompt = torch.randint(0, VOCAB, (4, 3))
    assert torch.equal(generate(model, prompt, max_new_tokens=8, top_k=6, seed=1),
                       generate(model, prompt, max_new_tokens=8, top_k=6, seed=1, do_sample=True))


# ---- blocklab generate -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpt2_folder(gpt2, tmp_path_factory):
    """The GPT-2 fixture's folder with a word-level tokenizer: w0 .. w59 and <|endoftext|> (id 60)."""
    from tokenizers import Tokenizer as HFTokenizers
    from tokenizers import models, pre_tokenizers

    hf, _ = gpt2
    folder = tmp_path_factory.mktemp("gpt2-words")
    hf.save_pretrained(str(folder))
    words = [f"w{i}" for i in range(VOCAB - 1)] + ["<|endoftext|>"]
    tok = HFTokenizers(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "special_tokens_map.json").write_text('{"eos_token": "<|endoftext|>"}')
    return folder


def run_cli(capsys, *argv):
    from blocklab.cli import main

    code = main(["generate", *map(str, argv)])
    return code, capsys.readouterr()


def test_cli_batch_of_inputs_equals_transformers_on_the_left_padded_batch(gpt2, gpt2_folder, capsys):
    import json

    hf, _ = gpt2
    prompts = ["w5 w17 w3", "w40", "w1 w2 w3 w4 w5"]
    code, out = run_cli(capsys, "--checkpoint", gpt2_folder, *sum((["--input", p] for p in prompts), []),
                        "--max-new-tokens", 12, "--json")
    assert code == 0
    rows = [json.loads(line) for line in out.out.splitlines()]
    ids, mask = pad_batch([[int(w[1:]) for w in p.split()] for p in prompts], EOS, "left")
    expected = hf_generate(hf, ids, mask, max_new_tokens=12, eos_token_id=EOS)
    for i, row in enumerate(rows):
        new = expected[i, ids.shape[1]:].tolist()
        new = new[: new.index(EOS) + 1] if EOS in new else new  # up to and with the end of text
        assert row["prompt_ids"] == [int(w[1:]) for w in prompts[i].split()] and row["new_ids"] == new
        assert row["text"].split()[: len(row["prompt_ids"])] == prompts[i].split()


def test_cli_sampling_flags_equal_transformers_sampling(gpt2, gpt2_folder, capsys):
    import json

    hf, _ = gpt2
    stop = 23  # any id: rows that reach it end there, in both
    code, out = run_cli(capsys, "--checkpoint", gpt2_folder, "--input", "w5 w17 w3", "--max-new-tokens", 15,
                        "--top-p", 0.9, "--temperature", 0.8, "--seed", 4, "--stop-id", stop, "--json")
    assert code == 0
    torch.manual_seed(4)
    prompt = torch.tensor([[5, 17, 3]])
    expected = hf_generate(hf, prompt, max_new_tokens=15, do_sample=True, top_p=0.9, temperature=0.8,
                           eos_token_id=stop)
    new = expected[0, 3:].tolist()
    new = new[: new.index(stop) + 1] if stop in new else new
    assert json.loads(out.out)["new_ids"] == new


def test_cli_temperature_end_schedules_the_temperature(gpt2, gpt2_folder, capsys):
    import json

    from transformers import LogitsProcessorList

    hf, _ = gpt2
    code, out = run_cli(capsys, "--checkpoint", gpt2_folder, "--input", "w5 w17 w3", "--max-new-tokens", 15,
                        "--temperature", 1.5, "--temperature-end", 0.5, "--stop-id", 23, "--json")
    assert code == 0  # no --seed: sampling is seeded with 0
    torch.manual_seed(0)
    prompt = torch.tensor([[5, 17, 3]])
    schedule = StepTemperature(3, torch.linspace(1.5, 0.5, 15, dtype=torch.float64).tolist())
    expected = hf_generate(hf, prompt, max_new_tokens=15, do_sample=True, eos_token_id=23,
                           logits_processor=LogitsProcessorList([schedule]))
    new = expected[0, 3:].tolist()
    new = new[: new.index(23) + 1] if 23 in new else new
    assert json.loads(out.out)["new_ids"] == new


def test_cli_streams_text_while_it_generates(gpt2_folder, capsys, monkeypatch):
    import blocklab.nn.generate as gen

    steps, writes = [0], []
    real_next_token = gen.next_token

    def counting_next_token(*args, **kwargs):
        steps[0] += 1
        return real_next_token(*args, **kwargs)

    monkeypatch.setattr(gen, "next_token", counting_next_token)
    code, out = run_cli(capsys, "--checkpoint", gpt2_folder, "--input", "w5 w17 w3", "--max-new-tokens", 8)
    assert code == 0
    free = generate(load_pretrained(gpt2_folder)[0], torch.tensor([[5, 17, 3]]), max_new_tokens=8,
                    stop_ids=[EOS])
    words = [f"w{i}" for i in free[0].tolist() if i != EOS]
    assert out.out == " ".join(words) + "\n"

    class Recorder:  # stdout that notes how many tokens existed at each write
        def write(self, text):
            writes.append((steps[0], text))

        def flush(self):
            pass

    monkeypatch.setattr("sys.stdout", Recorder())
    steps[0] = 0
    from blocklab.cli import main

    argv = ["generate", "--checkpoint", str(gpt2_folder), "--input", "w5 w17 w3", "--max-new-tokens", "8"]
    assert main(argv) == 0
    shown = [(step, text) for step, text in writes if text]  # rich's help formatter writes "" once
    assert shown[0] == (0, "w5 w17 w3")  # the prompt first, before any token is generated
    token_writes = [step for step, text in writes if text.strip()][1:]
    assert token_writes == sorted(token_writes) and len(set(token_writes)) >= 2  # pieces as they come
    assert "".join(text for _, text in writes) == out.out


def test_cli_stop_text_window_and_errors(gpt2_folder, capsys):
    import json

    code, out = run_cli(capsys, "--checkpoint", gpt2_folder, "--input", "w5 w17 w3", "--max-new-tokens", 60,
                        "--json")  # 63 tokens > n_positions 40: the window slides
    assert code == 0
    free = json.loads(out.out)
    assert len(free["new_ids"]) == 60 or free["new_ids"][-1] == EOS
    new_words = free["text"].split()[3:]
    stop = new_words[3]  # the 4th new word; it may also sit inside an earlier word (w1 in w15)
    ends = next(n for n in range(1, 61) if stop in " ".join(new_words[:n]))
    code, out = run_cli(capsys, "--checkpoint", gpt2_folder, "--input", "w5 w17 w3", "--max-new-tokens", 60,
                        "--stop", stop, "--json")
    assert json.loads(out.out)["text"].split()[3:] == new_words[:ends]
    code, out = run_cli(capsys, "--checkpoint", gpt2_folder, "--input", "w1", "--seed", 3)
    assert code == 2 and "GenerationConfig.seed=3 only applies to sampling" in out.err
    code, out = run_cli(capsys, "--checkpoint", gpt2_folder, "--input", "w1", "--top-p", 1.5)
    assert code == 2 and "GenerationConfig.top_p=1.5 must be in (0, 1]" in out.err


def test_cli_refusal_before_the_first_token_is_the_only_output(tmp_path, capsys):
    """Issue 30: generate printed the prompt, then its error on the same line (``Max ( 1blocklab: error``)."""
    from blocklab.tasks import get_task
    from blocklab.training.checkpoint import save_checkpoint

    task = get_task("listops")  # a model that sees the future cannot generate
    path = tmp_path / "listops.safetensors"
    save_checkpoint(path, bl.Transformer(bl.preset("listops-seed", **task.config_overrides())),
                    tokenizer=task.tokenizer.to_dict())
    status, (out, err) = run_cli(capsys, "--model", path, "--input", "Max ( 1")
    assert status == 2 and out == ""
    assert err == "blocklab: error: generate needs a causal model (ModelConfig.causal=true); this one sees " \
                  "the future\n"
