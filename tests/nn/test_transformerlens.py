"""TransformerLens code runs on blocklab with the same numbers: TransformerLens' own HookedTransformer
(its 3.x releases, which run on the transformers the suite uses) is the oracle, on GPT-2-shaped
weights built here with a byte-level BPE tokenizer trained here (no network).

Checked: the same logits; after fold_ln / center_writing_weights / center_unembed / fold_value_biases,
the same processed weights and the same cache at every TransformerLens hook name; a TransformerLens
script (text in, hooks reading ``hook.name`` and ``hook.layer()``, ``run_with_hooks`` ablating a
head, ``names_filter``, ``cache[name, layer]``, ``remove_batch_dim``, ``to_single_token``, greedy
``generate`` of text) run unchanged on both.
"""

from __future__ import annotations

import json

import pytest
import torch

import blocklab as bl

transformers = pytest.importorskip("transformers")
tl = pytest.importorskip("transformer_lens")
from tokenizers import ByteLevelBPETokenizer  # noqa: E402
from transformer_lens import HookedTransformer, HookedTransformerConfig  # noqa: E402
from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights, convert_llama_weights  # noqa: E402
from transformer_lens.utilities import get_act_name  # noqa: E402

EOT = "<|endoftext|>"
TEXT = "The cat sat on the mat. The dog sat on the log. A cat and a dog sat on a mat and a log."
PROMPT = "The cat sat on"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(blocklab's import of a random GPT-2 folder, TransformerLens' HookedTransformer of the same
    weights, unprocessed, and the folder)."""
    folder = tmp_path_factory.mktemp("gpt2-tl")
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([TEXT] * 20, vocab_size=300, min_frequency=1, special_tokens=[EOT])
    (folder / "tokenizer.json").write_text(bpe._tokenizer.to_str())
    (folder / "special_tokens_map.json").write_text(json.dumps({"bos_token": EOT, "eos_token": EOT,
                                                                "unk_token": EOT}))
    vocab = bpe.get_vocab_size()
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=vocab, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                     bos_token_id=0, eos_token_id=0)
    hf = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # spread the weights: the norms' gamma and beta too, so folding them matters
        for p in hf.parameters():
            p.add_(0.2 * torch.randn_like(p))
    hf.save_pretrained(str(folder))
    # the folder's tokenizer, as transformers (and TransformerLens) read it
    transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"), bos_token=EOT, eos_token=EOT, unk_token=EOT,
        pad_token=EOT).save_pretrained(str(folder))
    ours = bl.load(folder).model
    return ours, _hooked(hf, folder, process=False), folder


def _hooked(hf, folder, process: bool, refactor: bool = False) -> HookedTransformer:
    c = hf.config
    cfg = HookedTransformerConfig(
        n_layers=c.n_layer, d_model=c.n_embd, d_head=c.n_embd // c.n_head, n_heads=c.n_head,
        d_mlp=4 * c.n_embd, d_vocab=c.vocab_size, n_ctx=c.n_positions, act_fn="gelu_new",
        normalization_type="LN", eps=c.layer_norm_epsilon, positional_embedding_type="standard",
        original_architecture="GPT2LMHeadModel", default_prepend_bos=True, device="cpu",
    )
    model = HookedTransformer(cfg, tokenizer=transformers.AutoTokenizer.from_pretrained(str(folder)))
    model.load_and_process_state_dict(
        convert_gpt2_weights(hf, cfg), fold_ln=process, center_writing_weights=process,
        center_unembed=process, fold_value_biases=process, refactor_factored_attn_matrices=refactor)
    return model.eval()


@pytest.fixture(scope="module")
def processed(models):
    """Both models after TransformerLens' four processing steps."""
    ours, _, folder = models
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(folder)).eval()
    ours = bl.load(folder).model
    ours.process_weights_(fold_ln=True, center_writing_weights=True, center_unembed=True,
                          fold_value_biases=True)
    return ours, _hooked(hf, folder, process=True)


def test_text_becomes_the_same_tokens_with_the_bos_token_first(models):
    ours, theirs, _ = models
    assert torch.equal(ours.to_tokens(PROMPT), theirs.to_tokens(PROMPT))
    assert ours.to_tokens(PROMPT)[0, 0] == 0  # <|endoftext|>, TransformerLens' prepend_bos
    assert torch.equal(ours.to_tokens(PROMPT, prepend_bos=False), theirs.to_tokens(PROMPT, prepend_bos=False))
    assert ours.to_str_tokens(PROMPT) == theirs.to_str_tokens(PROMPT)
    assert ours.to_single_token(" cat") == theirs.to_single_token(" cat")


def test_the_same_logits_as_hooked_transformer(models):
    ours, theirs, _ = models
    tokens = theirs.to_tokens([TEXT[:40], TEXT[10:50]])
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens), theirs(tokens), rtol=0, atol=1e-4)
        torch.testing.assert_close(ours(PROMPT), theirs(PROMPT), rtol=0, atol=1e-4)  # text in
        loss = ours(PROMPT, return_type="loss")
        assert float(loss) == pytest.approx(float(theirs(PROMPT, return_type="loss")), abs=1e-5)


WEIGHTS = ("W_E", "W_pos", "W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O", "W_in", "b_in", "W_out",
           "b_out", "W_U", "b_U")


@pytest.mark.parametrize("name", WEIGHTS)
def test_processed_weights_equal_hooked_transformers(processed, name):
    ours, theirs = processed
    torch.testing.assert_close(getattr(ours, name), getattr(theirs, name), rtol=0, atol=1e-5)


def test_processing_keeps_the_log_probabilities(models, processed):
    plain, _, _ = models
    ours, theirs = processed
    tokens = theirs.to_tokens(TEXT[:60])
    with torch.no_grad():
        logp = ours(tokens).log_softmax(-1)
        torch.testing.assert_close(logp, plain(tokens).log_softmax(-1), rtol=0, atol=1e-4)
        torch.testing.assert_close(logp, theirs(tokens).log_softmax(-1), rtol=0, atol=1e-4)


def test_the_cache_at_every_transformerlens_hook_name_equals_hooked_transformers(processed):
    ours, theirs = processed
    tokens = theirs.to_tokens(TEXT[:50])
    with torch.no_grad():
        _, their_cache = theirs.run_with_cache(tokens)
        _, our_cache = ours.run_with_cache(tokens)
    assert len(their_cache) > 30
    for name, want in their_cache.items():
        got = our_cache[name]  # every TransformerLens name resolves, in TransformerLens' layout
        finite = torch.isfinite(want)
        assert torch.equal(finite, torch.isfinite(got)), name
        torch.testing.assert_close(got[finite], want[finite], rtol=0, atol=2e-4, msg=name)


def _assert_every_transformerlens_name_equal(ours, theirs, tokens) -> None:
    """Every name in TransformerLens' cache gives blocklab's value at it, in TransformerLens' layout."""
    with torch.no_grad():
        _, their_cache = theirs.run_with_cache(tokens)
        _, our_cache = ours.run_with_cache(tokens)
    for name, want in their_cache.items():
        got = our_cache[name]
        if name.endswith(("hook_k", "hook_v", "hook_rot_k")) and got.shape != want.shape:  # (B, T, h_kv, d)
            got = got.repeat_interleave(want.shape[2] // got.shape[2], dim=2)
        finite = torch.isfinite(want)
        assert torch.equal(finite, torch.isfinite(got)), name
        torch.testing.assert_close(got[finite], want[finite], rtol=0, atol=2e-4, msg=name)


def test_the_norms_hooks_before_gamma_and_beta_equal_transformerlens_unfolded(models, llama):
    """Issue 37: under TransformerLens' names, ln1/ln2/ln_final.hook_normalized are the normalised vector
    before gamma and beta, as TransformerLens hooks it; blocklab gave the norm's output after them, which is
    the same tensor only once fold_ln has moved gamma and beta into the next weights. Both models unfolded
    here (gamma and beta spread from 1 and 0), LayerNorm and RMSNorm."""
    ours, theirs, _ = models
    tokens = theirs.to_tokens(TEXT[:50])
    _assert_every_transformerlens_name_equal(ours, theirs, tokens)
    (plain_ours, plain_theirs), _ = llama
    _assert_every_transformerlens_name_equal(
        plain_ours, plain_theirs, torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(2)))
    with torch.no_grad():
        _, cache = ours.run_with_cache(tokens)
    ln1 = ours.blocks[0].ln1
    after_affine = cache["blocks.0.ln1.hook_normalized"] * ln1.weight + ln1.bias
    torch.testing.assert_close(after_affine, cache["blocks.0.ln1"], rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["blocks.0.ln1.hook_normalized", "blocks.1.ln2.hook_normalized",
                                  "ln_final.hook_normalized", "blocks.0.ln1.hook_scale"])
def test_a_hook_on_a_norms_stage_patches_what_transformerlens_patches(models, name):
    """Written for TransformerLens: double feature 3 of the normalised vector (or every scale) before gamma
    and beta; blocklab computes the norm explicitly through the hook and gives TransformerLens' logits."""
    ours, theirs, _ = models
    tokens = theirs.to_tokens(TEXT[:40])

    def double_feature_3(value, hook):
        value = value.clone()
        if value.shape[-1] == 1:
            return value * 2
        value[..., 3] *= 2
        return value

    with torch.no_grad():
        want = theirs.run_with_hooks(tokens, fwd_hooks=[(name, double_feature_3)])
        got = ours.run_with_hooks(tokens, fwd_hooks=[(name, double_feature_3)])
        assert (want - theirs(tokens)).abs().max() > 1e-2  # the patch matters
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)


def test_the_cache_iterates_under_the_names_it_was_asked_for(processed):
    """Issue 37, S4: the cache's keys were blocklab's names, so TransformerLens' idiom
    ``[v for k, v in cache.items() if k.endswith("hook_pattern")]`` found nothing. Asked as TransformerLens
    asks (no filter, or names_filter), its keys are TransformerLens' own, each with TransformerLens' tensor;
    asked with names=, blocklab's; either spelling indexes it."""
    ours, theirs = processed
    tokens = theirs.to_tokens(TEXT[:50])
    with torch.no_grad():
        _, their_cache = theirs.run_with_cache(tokens)
        _, our_cache = ours.run_with_cache(tokens)
    ours_by_key = dict(our_cache.items())
    # every key TransformerLens has, and beyond them only stages it does not hook by default
    assert set(their_cache.keys()) <= set(ours_by_key)
    assert set(ours_by_key) - set(their_cache.keys()) == {  # x0, each head's result, the norms' outputs
        "embed", "probs", *(f"blocks.{i}.{s}" for i in (0, 1) for s in ("attn.hook_result", "ln1", "ln2"))}
    for name, want in their_cache.items():
        torch.testing.assert_close(ours_by_key[name], want, rtol=0, atol=2e-4, msg=name)
    patterns = [v for k, v in our_cache.items() if k.endswith("hook_pattern")]
    want = [v for k, v in their_cache.items() if k.endswith("hook_pattern")]
    assert len(patterns) == len(want) == 2
    for got, expected in zip(patterns, want, strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=2e-4)

    chosen = lambda name: name.endswith(("hook_v", "hook_pattern", "hook_resid_post"))
    with torch.no_grad():
        _, their_some = theirs.run_with_cache(tokens, names_filter=chosen)
        _, our_some = ours.run_with_cache(tokens, names_filter=chosen)
    assert list(our_some.keys()) == list(their_some.keys())  # the same keys in the same (forward) order
    for (key, got), want in zip(our_some.items(), their_some.values(), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=2e-4, msg=key)  # v as (B, T, h, d_head)

    _, blocklab_style = ours.run_with_cache(tokens, names=["blocks.*.attn.v", "blocks.*.attn.weights"])
    assert list(blocklab_style) == ["blocks.0.attn.v", "blocks.0.attn.weights", "blocks.1.attn.v",
                                    "blocks.1.attn.weights"]
    assert blocklab_style["blocks.0.attn.v"].shape == (1, 4, tokens.shape[1], 8)  # blocklab's (B, h, T, d_k)
    assert torch.equal(blocklab_style["blocks.0.attn.hook_v"], our_some["blocks.0.attn.hook_v"])
    assert torch.equal(our_some["blocks.0.attn.v"], blocklab_style["blocks.0.attn.v"])  # blocklab's name


def transformerlens_script(model):
    """Written for TransformerLens: text in, a hook reading hook.name and hook.layer(), a head ablated
    with run_with_hooks, names_filter, cache[name, layer], remove_batch_dim, greedy generation."""
    tokens = model.to_tokens(PROMPT)
    logits, cache = model.run_with_cache(tokens, names_filter=lambda name: name.endswith("hook_pattern"))
    seen = []

    def ablate_head(z, hook):
        seen.append((hook.name, hook.layer()))
        z[:, :, 1] = 0.0
        return z

    ablated = model.run_with_hooks(tokens, fwd_hooks=[(get_act_name("z", 0), ablate_head)])
    pattern = cache["pattern", 1]
    _, one = model.run_with_cache(PROMPT, names_filter=get_act_name("resid_post", 1))
    one.remove_batch_dim()
    text = model.generate(PROMPT, max_new_tokens=6, do_sample=False, **(
        {} if isinstance(model, bl.Transformer) else {"verbose": False, "stop_at_eos": False}))
    return logits, pattern, ablated, seen, one[get_act_name("resid_post", 1)], text


def test_a_transformerlens_script_runs_unchanged_with_the_same_numbers(models):
    ours, theirs, _ = models
    with torch.no_grad():
        mine, reference = transformerlens_script(ours), transformerlens_script(theirs)
    for got, want in zip(mine[:3], reference[:3], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    assert mine[3] == reference[3] == [("blocks.0.attn.hook_z", 0)]
    torch.testing.assert_close(mine[4], reference[4], rtol=0, atol=1e-4)  # (T, d): the batch of one removed
    assert mine[4].dim() == 2
    assert mine[5] == reference[5]
    assert not torch.allclose(mine[2], mine[0])  # the ablation changed the logits


def hooks_script(model, kept: str = "resid_mid"):
    """add_hook (permanent and not, forward and backward, with hook.ctx), reset_hooks by direction,
    bwd_hooks in run_with_hooks, an intervention on a LayerNorm's hook_scale: TransformerLens' code.
    ``kept``: the stage whose gradient a backward hook keeps (a parallel block has no resid_mid)."""
    tokens = model.to_tokens(TEXT[:40])
    out = {}

    def halve(x, hook):
        hook.ctx["calls"] = hook.ctx.get("calls", 0) + 1
        return x * 0.5

    def keep_grad(key):
        def fn(grad, hook):
            out[key] = grad.detach().clone()
        return fn

    model.add_hook(get_act_name("resid_post", 0), halve, is_permanent=True)
    model.add_hook(get_act_name("mlp_out", 1), lambda x, hook: x * 0.0)
    model.add_hook(get_act_name(kept, 1), keep_grad("kept"), dir="bwd")
    logits = model(tokens)
    logits.sum().backward()
    out["both"] = logits.detach()
    model.reset_hooks(direction="bwd")  # the forward hooks stay
    out["fwd only"] = model(tokens).detach()
    model.reset_hooks()  # the permanent one stays
    out["permanent"] = model(tokens).detach()
    model.reset_hooks(including_permanent=True)
    out["none"] = model(tokens).detach()
    loss = model.run_with_hooks(tokens, return_type="loss", bwd_hooks=[
        (get_act_name("resid_pre", 1), keep_grad("resid_pre")),
        (get_act_name("pattern", 0), keep_grad("pattern"))])
    loss.backward()
    out["scaled"] = model.run_with_hooks(tokens, fwd_hooks=[
        ("blocks.1.ln1.hook_scale", lambda scale, hook: scale * 2.0)]).detach()
    model.zero_grad(set_to_none=True)
    return out


def test_add_hook_reset_hooks_and_backward_hooks_do_what_they_do_in_transformerlens(models):
    ours, theirs, _ = models
    mine, reference = hooks_script(ours), hooks_script(theirs)
    assert mine.keys() == reference.keys()
    for key, want in reference.items():
        torch.testing.assert_close(mine[key], want, rtol=0, atol=1e-4, msg=key)
    assert not torch.allclose(mine["both"], mine["none"]) and not torch.allclose(mine["scaled"], mine["none"])


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A random Llama folder with grouped-query attention (4 query heads, 2 key/value heads), rotary
    positions, RMSNorm and SwiGLU, and TransformerLens' HookedTransformer of it, both processed
    (fold_ln, center_unembed, fold_value_biases; RMSNorm has no mean to centre the stream by)."""
    folder = tmp_path_factory.mktemp("llama-tl")
    torch.manual_seed(1)
    config = transformers.LlamaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=False)
    hf = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.2 * torch.randn_like(p))
    hf.save_pretrained(str(folder))
    cfg = HookedTransformerConfig(
        n_layers=2, d_model=32, d_head=8, n_heads=4, n_key_value_heads=2, d_mlp=64, d_vocab=100, n_ctx=64,
        act_fn="silu", gated_mlp=True, normalization_type="RMS", final_rms=True, eps=1e-5,
        positional_embedding_type="rotary", rotary_dim=8, rotary_base=getattr(config, "rope_theta", 10000.0),
        original_architecture="LlamaForCausalLM", device="cpu")
    state = convert_llama_weights(hf, cfg)
    plain = HookedTransformer(cfg)
    plain.load_and_process_state_dict(state, fold_ln=False, center_writing_weights=False,
                                      center_unembed=False)
    processed = HookedTransformer(cfg)
    processed.load_and_process_state_dict(state, fold_ln=True, center_writing_weights=False,
                                          center_unembed=True,
                                          fold_value_biases=True)
    ours = bl.load(folder).model
    ours_processed = bl.load(folder).model
    ours_processed.process_weights_(fold_ln=True, center_writing_weights=False, center_unembed=True,
                                    fold_value_biases=True)
    return (ours, plain.eval()), (ours_processed, processed.eval())


LLAMA_WEIGHTS = ("W_E", "W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O", "W_in", "W_gate", "W_out",
                 "W_U")


def test_grouped_query_weights_as_transformerlens_shows_them(llama):
    for ours, theirs in llama:  # unprocessed, then processed
        for name in LLAMA_WEIGHTS:
            torch.testing.assert_close(getattr(ours, name), getattr(theirs, name), rtol=0, atol=1e-5,
                                       msg=name)
        assert ours.W_K.shape == (2, 4, 32, 8)  # each key head shown once per query head that reads it
        tokens = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            torch.testing.assert_close(ours(tokens), theirs(tokens), rtol=0, atol=1e-4)


def test_the_cache_of_a_llama_at_every_transformerlens_name(llama):
    _, (ours, theirs) = llama
    tokens = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        _, their_cache = theirs.run_with_cache(tokens)
        _, our_cache = ours.run_with_cache(tokens)
    assert any(name.endswith("hook_pre_linear") for name in their_cache)  # the gated FFN's linear branch
    assert any(name.endswith("hook_rot_k") for name in their_cache)
    for name, want in their_cache.items():
        got = our_cache[name]
        if name.endswith(("hook_k", "hook_v", "hook_rot_k")) and got.shape != want.shape:  # (B, T, h_kv, d)
            got = got.repeat_interleave(2, dim=2) if got.shape[2] * 2 == want.shape[2] else got
        torch.testing.assert_close(got, want, rtol=0, atol=2e-4, msg=name)


def test_olmo_with_norms_without_parameters_equals_hooked_transformer_at_every_name(tmp_path):
    """OLMo 1 (LayerNorms with no gamma and no beta, norm="nonparametric") against TransformerLens'
    HookedTransformer with its OLMo-1B config in small (normalization_type LN, gated SiLU MLP, rotary) and its
    convert_olmo_weights (gamma 1, beta 0): logits and every hook name, unprocessed and processed."""
    from transformer_lens.pretrained.weight_conversions import convert_olmo_weights

    torch.manual_seed(2)
    hf = transformers.OlmoForCausalLM(transformers.OlmoConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=64, pad_token_id=0)).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.2 * torch.randn_like(p))
    hf.save_pretrained(str(tmp_path))
    cfg = HookedTransformerConfig(
        n_layers=2, d_model=32, d_head=8, n_heads=4, d_mlp=64, d_vocab=100, n_ctx=64, act_fn="silu",
        gated_mlp=True, normalization_type="LN", eps=1e-5, positional_embedding_type="rotary", rotary_dim=8,
        rotary_base=10000.0, original_architecture="OlmoForCausalLM", device="cpu")
    tokens = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(3))
    for process in (False, True):
        theirs = HookedTransformer(cfg)
        theirs.load_and_process_state_dict(convert_olmo_weights(hf, cfg), fold_ln=process,
                                           center_writing_weights=process, center_unembed=process)
        ours = bl.load(tmp_path).model
        if process:
            ours.process_weights_()
        with torch.no_grad():
            torch.testing.assert_close(ours(tokens), theirs.eval()(tokens), rtol=0, atol=1e-4)
        _assert_every_transformerlens_name_equal(ours, theirs, tokens)


# ---- TransformerLens' layouts under its names: what a hook edits lands where TransformerLens' edit does --


@pytest.mark.parametrize("stage", ["v", "q", "k"])
@pytest.mark.parametrize("spelling", ["name", "short name", "predicate", "glob"])
def test_a_hook_under_transformerlens_names_edits_the_head_transformerlens_edits(models, stage, spelling):
    """Written for TransformerLens: zero head 3 of v (axis 2 of (B, T, h, d_head)). On blocklab's own
    heads-first layout the same line would zero position 3 instead (logits 3.69 away); under
    TransformerLens' names blocklab hands the hook TransformerLens' layout, so the logits agree."""
    ours, theirs, _ = models
    tokens = theirs.to_tokens(TEXT[:40])
    name = get_act_name(stage, 0)
    written = {"name": name, "short name": name, "predicate": lambda n: n == name,
               "glob": f"blocks.0.attn.hook_{stage}*"}[spelling]

    def zero_head_3(x, hook):
        assert x.shape[2] == 4 and x.shape[1] == tokens.shape[1]  # (B, T, h, d_head)
        x[:, :, 3, :] = 0.0
        return x

    with torch.no_grad():
        want = theirs.run_with_hooks(tokens, fwd_hooks=[(name, zero_head_3)])
        plain = theirs(tokens)
        got = ours.run_with_hooks(tokens, fwd_hooks=[(written, zero_head_3)])
    assert (want - plain).abs().max() > 0.1  # the edit matters
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)


def test_a_returned_tensor_and_a_backward_hook_under_transformerlens_names_keep_its_layout(models):
    """A hook that returns a new tensor (scaling q's head 1) and a backward hook reading v's gradient per
    head, both in TransformerLens' layout, on both models."""
    ours, theirs, _ = models
    tokens = theirs.to_tokens(TEXT[:40])
    scale = torch.ones(4).index_fill_(0, torch.tensor([1]), 0.25)[None, None, :, None]

    def scale_q(q, hook):
        return q * scale

    grads = {}

    def grad_of_v(grad, hook):
        grads[hook.name, len(grads)] = grad.clone()

    for model in (theirs, ours):
        model.zero_grad()
        logits = model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_q", scale_q)],
                                      bwd_hooks=[("blocks.0.attn.hook_v", grad_of_v)])
        logits[0, -1, 5].backward()
    (_, want_logits), (_, got_logits) = [(k, v) for k, v in grads.items()]
    assert want_logits.shape == got_logits.shape == (1, tokens.shape[1], 4, 8)
    torch.testing.assert_close(got_logits, want_logits, rtol=0, atol=1e-5)
    with torch.no_grad():
        want = theirs.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_q", scale_q)])
        got = ours.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_q", scale_q)])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)


def test_blocklab_names_keep_blocklab_layout_and_transformerlens_names_view_the_same_tensor(models):
    ours, _, _ = models
    tokens = torch.tensor([[1, 2, 3, 4, 5]])
    _, cache = ours.run_with_cache(tokens)
    mine = cache["blocks.0.attn.v"]  # (B, h, T, d_k)
    assert mine.shape == (1, 4, 5, 8)
    for key in ("blocks.0.attn.hook_v", ("v", 0), ("hook_v", 0)):
        theirs_view = cache[key]
        assert theirs_view.shape == (1, 5, 4, 8)
        assert torch.equal(theirs_view, mine.transpose(1, 2))
    assert cache[("attn.v", 0)] is mine
    assert cache.stack_activation("v").shape == (2, 1, 5, 4, 8)
    cache.remove_batch_dim()
    assert cache["blocks.0.attn.hook_v"].shape == (5, 4, 8)
    with pytest.raises(KeyError, match="reshaped by variant"):
        cache["blocks.0.attn.q_norm.hook_scale"]


# ---- QK-norm: Qwen3 (per head) and OLMo 2 (over all heads, res-post-norm block) --------------------

QK_SHAPE = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, max_position_embeddings=64, rms_norm_eps=1e-6)


@pytest.fixture(scope="module", params=["qwen3", "olmo2"])
def qk_normed(request, tmp_path_factory):
    """(blocklab's import of a random Qwen3 / OLMo 2 folder, TransformerLens' HookedTransformer of the
    same weights, converted by TransformerLens' own functions, and the family)."""
    from transformer_lens.pretrained.weight_conversions.olmo2 import convert_olmo2_weights
    from transformer_lens.pretrained.weight_conversions.qwen3 import convert_qwen3_weights

    family = request.param
    torch.manual_seed(0)
    if family == "qwen3":
        config = transformers.Qwen3Config(**QK_SHAPE, num_key_value_heads=2, head_dim=16)  # wide heads
        hf = transformers.Qwen3ForCausalLM(config)
    else:
        hf = transformers.Olmo2ForCausalLM(transformers.Olmo2Config(**QK_SHAPE))
    with torch.no_grad():  # spread the weights, the norms' gammas too
        for p in hf.parameters():
            p.normal_(0.0, 0.3) if p.dim() == 2 else p.add_(0.3 * torch.randn_like(p))
    folder = tmp_path_factory.mktemp(family)
    hf.eval().save_pretrained(str(folder))
    d_head = 16 if family == "qwen3" else 8  # Qwen3's 4 heads of 16 on a width of 32, as Qwen3-0.6B's
    cfg = HookedTransformerConfig(
        n_layers=2, d_model=32, d_head=d_head, n_heads=4, n_key_value_heads=2 if family == "qwen3" else None,
        d_mlp=64, d_vocab=100, n_ctx=64, act_fn="silu", gated_mlp=True, normalization_type="RMS",
        final_rms=True, eps=1e-6, positional_embedding_type="rotary", rotary_dim=d_head, rotary_base=10000,
        use_qk_norm=family == "qwen3", default_prepend_bos=False, device="cpu",
        original_architecture="Qwen3ForCausalLM" if family == "qwen3" else "Olmo2ForCausalLM")
    theirs = HookedTransformer(cfg)
    convert = convert_qwen3_weights if family == "qwen3" else convert_olmo2_weights
    theirs.load_and_process_state_dict(convert(hf, cfg), fold_ln=False, center_writing_weights=False,
                                       center_unembed=False, fold_value_biases=False)
    return bl.load(folder).model, theirs.eval(), family


def test_qk_norm_models_equal_hooked_transformer_at_every_name(qk_normed):
    """The same logits; TransformerLens' q_norm/k_norm hooks (its scale, its output before gamma) against
    blocklab's stages; q, k, the rotated q and k, the pattern and what attention adds, named as in
    TransformerLens, and every other name in its cache. OLMo 2 in TransformerLens calls its output norms ln1
    and ln2 (blocklab's ln1_out / ln2_out: its ln1.hook_normalized reads and edits ln1_out.normalized) and
    its attention output hook sees the output before that norm: blocklab's attn.out, then ln1_out."""
    ours, theirs, family = qk_normed
    tokens = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, their_cache = theirs.run_with_cache(tokens)
        mine, our_cache = ours.run_with_cache(tokens)
    torch.testing.assert_close(mine, logits, rtol=0, atol=1e-4)
    for i in range(2):
        attn = ours.blocks[i].attn
        for letter in "qk":
            ours_normed = our_cache[f"blocks.{i}.attn.{letter}_norm"]  # (B, heads, T, d_k)
            # under TransformerLens' name: (B, T, heads, d_k)
            tl_named = our_cache[f"blocks.{i}.attn.hook_{letter}_normed"]
            assert torch.equal(tl_named, ours_normed.transpose(1, 2))
            gamma = getattr(attn, f"{letter}_norm").weight
            before_gamma = their_cache[f"blocks.{i}.attn.{letter}_norm.hook_normalized"]
            scale = their_cache[f"blocks.{i}.attn.{letter}_norm.hook_scale"]
            ours_scale = our_cache[f"blocks.{i}.attn.{letter}_norm.scale"]
            d_k = ours_normed.shape[-1]
            if family == "qwen3":  # TransformerLens flattens (B, T, h, d_k) to rows of d_k for the norm
                want = (before_gamma * gamma).view(2, 12, -1, d_k).transpose(1, 2)
                ours_scale = ours_scale.transpose(1, 2).reshape(-1, 1)
            else:  # over all heads: (B, T, h d_k)
                want = (before_gamma * gamma).view(2, 12, -1, d_k).transpose(1, 2)
            torch.testing.assert_close(ours_normed, want, rtol=0, atol=1e-5)
            torch.testing.assert_close(ours_scale, scale, rtol=0, atol=1e-6)
        for name in ("attn.hook_q", "attn.hook_k", "attn.hook_rot_q", "attn.hook_rot_k"):
            got = our_cache[f"blocks.{i}.{name}"]
            torch.testing.assert_close(got, their_cache[f"blocks.{i}.{name}"], rtol=0, atol=1e-4)
        for name in ("attn.hook_pattern", "attn.hook_z", "hook_attn_out", "hook_resid_mid",
                     "hook_resid_post"):
            torch.testing.assert_close(our_cache[f"blocks.{i}.{name}"], their_cache[f"blocks.{i}.{name}"],
                                       rtol=0, atol=1e-4, msg=name)
        for name in ("W_Q", "W_K", "W_V", "W_O"):  # (h, d, d_head), (h, d_head, d): Qwen3's heads are 16 wide
            torch.testing.assert_close(getattr(ours, name)[i], getattr(theirs, name)[i], rtol=0, atol=0,
                                       msg=name)
        if family == "olmo2":
            their_ln1 = their_cache[f"blocks.{i}.ln1.hook_normalized"] * ours.blocks[i].ln1_out.weight
            torch.testing.assert_close(our_cache[f"blocks.{i}.ln1_out"], their_ln1, rtol=0, atol=1e-4)
    _every_name_but_the_qk_norms(their_cache, our_cache)
    double = [("blocks.0.ln1.hook_normalized", lambda x, hook: 2 * x)]  # OLMo 2: the output norm's
    with torch.no_grad():
        want = theirs.run_with_hooks(tokens, fwd_hooks=double)
        torch.testing.assert_close(ours.run_with_hooks(tokens, fwd_hooks=double), want, rtol=0, atol=1e-4)
    assert (want - logits).abs().max() > 1e-2


def _every_name_but_the_qk_norms(their_cache, our_cache, refused: tuple[str, ...] = ()) -> None:
    """Every TransformerLens name in its cache holds blocklab's tensor (OLMo 2's ln1 / ln2: its output
    norms), but its q_norm/k_norm hooks (rows reshaped by variant, before gamma: compared above) and the
    ``refused`` names, which are refused by name."""
    for name, want in their_cache.items():
        if "_norm.hook_" in name or name in refused:
            with pytest.raises(KeyError, match=rf"'{name}' \(TransformerLens\) (has no blocklab stage|is "
                                               "another tensor on this model)"):
                our_cache[name]
            continue
        assert name in our_cache.keys(), name
        torch.testing.assert_close(our_cache[name], want, rtol=0, atol=2e-4, msg=name)


# ---- Gemma 3: sandwich norms, QK-norm per head, a rotary base of its own on the local layers ----------


def test_gemma3_equals_hooked_transformer_built_from_model_cfg_at_every_name(tmp_path):
    """TransformerLens 3 reads Gemma 3's shapes from its own table of official names only, so its config here
    is blocklab's model.cfg (windows, attn_types, rotary_base_local, the scalar, the logit cap, the sandwich
    norms), with the weights converted by TransformerLens' convert_gemma_weights: the same logits and, on the
    local layer (base 10) and the global one (base 10000), q, k, their rotations, the pattern, z and the
    stream. TransformerLens' hook_attn_out / hook_mlp_out are after its ln1_post / ln2_post: blocklab's
    ln1_out / ln2_out stages, which those names read on this block (the cache, its short names, hooks,
    hook_dict; elsewhere they read attn.out / ffn.out)."""
    from transformer_lens.pretrained.weight_conversions.gemma import convert_gemma_weights

    torch.manual_seed(0)
    hf = transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
        **QK_SHAPE, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=12, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"], rope_theta=10000.0, rope_local_base_freq=10.0,
        final_logit_softcapping=5.0, tie_word_embeddings=False)).eval()
    with torch.no_grad():  # spread the weights, the norms' gammas too
        for p in hf.parameters():
            p.normal_(0.0, 0.3) if p.dim() == 2 else p.add_(0.3 * torch.randn_like(p))
    hf.save_pretrained(str(tmp_path))
    ours = bl.load(tmp_path).model
    fields = set(HookedTransformerConfig.__dataclass_fields__)
    cfg = HookedTransformerConfig(**{k: v for k, v in ours.cfg.to_dict().items() if k in fields},
                                  normalization_type="RMS")  # Gemma's 1 + w: the converter adds the 1
    assert (cfg.rotary_base_local, cfg.attn_types, cfg.use_normalization_before_and_after) == (
        10.0, ["local", "global"], True)
    theirs = HookedTransformer(cfg)
    theirs.load_and_process_state_dict(convert_gemma_weights(hf, cfg), fold_ln=False,
                                       center_writing_weights=False, center_unembed=False,
                                       fold_value_biases=False)
    tokens = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, their_cache = theirs.eval().run_with_cache(tokens)
        mine, our_cache = ours.run_with_cache(tokens)
    torch.testing.assert_close(mine, logits, rtol=0, atol=1e-5)
    for i in range(2):
        for name in ("attn.hook_q", "attn.hook_k", "attn.hook_rot_q", "attn.hook_rot_k", "attn.hook_pattern",
                     "attn.hook_z", "hook_resid_mid", "hook_resid_post"):
            torch.testing.assert_close(our_cache[f"blocks.{i}.{name}"], their_cache[f"blocks.{i}.{name}"],
                                       rtol=0, atol=1e-5, msg=name)
        for stage, name in (("ln1_out", "hook_attn_out"), ("ln2_out", "hook_mlp_out")):
            want = their_cache[f"blocks.{i}.{name}"]
            torch.testing.assert_close(our_cache[f"blocks.{i}.{stage}"], want, rtol=0, atol=1e-5, msg=name)
            # under TransformerLens' name, its short name and a hook: the sandwich norm's output, not attn.out
            torch.testing.assert_close(our_cache[f"blocks.{i}.{name}"], want, rtol=0, atol=1e-5, msg=name)
            torch.testing.assert_close(our_cache[name.removeprefix("hook_"), i], want, rtol=0, atol=1e-5)
            assert ours.hook_dict[f"blocks.{i}.{name}"] is getattr(ours.blocks[i], f"hook_{stage}")

            def zeroed(x, hook):  # what the hook removes from the stream, TransformerLens' and blocklab's
                return torch.zeros_like(x)

            with torch.no_grad():
                got = ours.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{i}.{name}", zeroed)])
                expected = theirs.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{i}.{name}", zeroed)])
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    assert "blocks.0.hook_attn_out" in our_cache.keys() and "blocks.0.attn.out" in our_cache.keys()
    _every_name_but_the_qk_norms(their_cache, our_cache)  # unembed.hook_out: head.uncapped, before the cap


# ---- text in as TransformerLens tokenizes it: each family's default_prepend_bos, prepend_bos=False -----


def _bpe_json(adds_bos: bool) -> str:
    """A byte-level BPE over single characters; with ``adds_bos`` its post-processor puts <s> first
    (Llama's)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(33, 127):
        vocab.setdefault(chr(b), len(vocab))
    vocab["Ġ"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    if adds_bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tok.to_str()


_SMALL = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
              num_attention_heads=4, max_position_embeddings=64)
# folder name (TransformerLens reads "llama" in a path as a model's name) -> (model, tokenizer adds <s>)
TOKENIZING = {
    "neox": (lambda: transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**_SMALL, rotary_pct=0.25)),
             False),
    "lm": (lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**_SMALL)), True),
    "gpt": (lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=128, n_embd=32, n_layer=1, n_head=4, n_positions=64, n_ctx=64)), False),
}


@pytest.mark.parametrize("family", list(TOKENIZING))
def test_text_is_tokenized_as_transformerlens_tokenizes_it_for_each_family(family, tmp_path):
    """TransformerLens' own config for the folder (convert_hf_model_config: GPT-NeoX's
    default_prepend_bos is False) and its to_tokens / to_str_tokens / to_single_token against blocklab's,
    for prepend_bos None, True and False (False takes off a BOS the tokenizer adds itself, as
    TransformerLens does), and the same after blocklab import writes the model as a checkpoint."""
    from transformer_lens.loading_from_pretrained import convert_hf_model_config

    from blocklab.weights.load import import_model

    build, adds_bos = TOKENIZING[family]
    folder = tmp_path / family
    build().save_pretrained(str(folder))
    (folder / "tokenizer.json").write_text(_bpe_json(adds_bos))
    transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"), bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        pad_token="</s>").save_pretrained(str(folder))
    cfg = HookedTransformerConfig.unwrap(convert_hf_model_config(str(folder)))
    assert cfg.default_prepend_bos is (family != "neox")
    theirs = HookedTransformer(cfg, tokenizer=transformers.AutoTokenizer.from_pretrained(str(folder)))
    import_model(folder, tmp_path / "model.safetensors")
    texts = ["a b c", "a"]
    for ours in (bl.load(folder).model, bl.load(tmp_path / "model.safetensors").model):
        for prepend_bos in (None, True, False):
            given = {} if prepend_bos is None else {"prepend_bos": prepend_bos}
            want = theirs.to_tokens(texts, **given)
            assert torch.equal(ours.to_tokens(texts, **given), want), (prepend_bos, want)
            assert ours.to_str_tokens("a b", **given) == theirs.to_str_tokens("a b", **given)
        assert ours.to_single_token("b") == theirs.to_single_token("b")


def test_left_padded_text_keeps_each_rows_positions_as_transformerlens_does(models):
    """GPT-2's learned position table: with padding_side="left" the short row's real tokens take positions
    0, 1, ... as the row alone does (they were shifted by the padding: 10.4 off in the logits), equal to
    TransformerLens' logits and resid_post at every real position."""
    ours, theirs, _ = models
    texts = ["The cat sat on the mat. The dog", "A cat"]
    with torch.no_grad():
        want = theirs(texts, padding_side="left")
        got = ours(texts, padding_side="left")
        _, their_cache = theirs.run_with_cache(texts, padding_side="left")
        _, our_cache = ours.run_with_cache(texts, padding_side="left")
        alone = ours(texts[1])
    mask = ours.tokenize(texts, prepend_bos=None, padding="left").attention_mask.bool()
    assert not mask[1].all()  # the short row is padded
    torch.testing.assert_close(got[mask], want[mask], rtol=0, atol=1e-4)
    torch.testing.assert_close(got[1][mask[1]], alone[0], rtol=0, atol=1e-4)
    for name in ("blocks.0.hook_resid_pre", "blocks.1.hook_resid_post"):
        torch.testing.assert_close(our_cache[name][mask], their_cache[name][mask], rtol=0, atol=1e-4)


# ---- model.cfg: TransformerLens' config fields, and TransformerLens' own patching module on blocklab -----

CFG_FIELDS = ("n_layers", "d_model", "n_heads", "d_head", "n_key_value_heads", "d_mlp", "d_vocab", "n_ctx",
              "act_fn", "normalization_type", "positional_embedding_type", "gated_mlp", "eps",
              "default_prepend_bos", "parallel_attn_mlp", "attn_only", "use_attn_result", "num_experts",
              "experts_per_token", "norm_topk_prob")


def test_model_cfg_holds_what_hooked_transformers_cfg_holds(models, llama):
    # the llama fixture's two HookedTransformers share one cfg, which fold_ln changed: the processed pair
    (gpt2, their_gpt2, _), (_, (folded_llama, their_llama)) = models, llama
    assert their_llama.cfg.normalization_type == "RMSPre" and gpt2.cfg.normalization_type == "LN"
    for ours, theirs in ((gpt2, their_gpt2), (folded_llama, their_llama)):
        for name in CFG_FIELDS:
            assert getattr(ours.cfg, name) == getattr(theirs.cfg, name), name
        assert ours.cfg.device.type == "cpu" and ours.cfg.dtype == torch.float32
    assert folded_llama.cfg.rotary_dim == their_llama.cfg.rotary_dim
    sinusoidal = bl.Transformer(bl.preset("listops-seed", activation="gelu_sigmoid"))
    with pytest.raises(ValueError, match="pos_encoding='sinusoidal' has no TransformerLens"):
        _ = sinusoidal.cfg.positional_embedding_type
    with pytest.raises(ValueError, match="activation='gelu_sigmoid'"):
        _ = sinusoidal.cfg.act_fn
    with pytest.raises(AttributeError, match="has no 'n_params'"):
        _ = sinusoidal.cfg.n_params
    with pytest.raises(AttributeError, match="read-only"):
        sinusoidal.cfg.n_layers = 3


MOE = dict(vocab_size=30, max_seq_len=16, d_model=16, n_heads=2, d_ff=24, activation="swiglu", norm="rms",
           norm_position="pre", bias=False, causal=True, pos_encoding="rotary", n_experts=5)


@pytest.mark.parametrize("k, renormalize", [(2, True), (3, False), (1, True)])
def test_a_mixtures_cfg_builds_transformerlens_moe_computing_blocklabs_numbers(k, renormalize):
    """model.cfg's num_experts, experts_per_token, norm_topk_prob and d_mlp make TransformerLens' own MoE;
    given the mixture's weights (router -> W_gate; each expert's w1, w3, w2 -> W_gate, W_in, W_out) it
    gives the same output and the same experts for every token."""
    from transformer_lens.components.mlps.moe import MoE

    torch.manual_seed(k)
    model = bl.Transformer(bl.ModelConfig(**MOE, experts_per_token=k, renormalize_top_k=renormalize))
    theirs = MoE(HookedTransformerConfig(**{name: model.cfg.to_dict()[name] for name in (
        "n_layers", "d_model", "n_ctx", "d_head", "d_mlp", "act_fn", "gated_mlp", "num_experts",
        "experts_per_token", "norm_topk_prob")}, d_vocab=30))
    ffn = model.blocks[0].ffn
    with torch.no_grad():
        theirs.W_gate.weight.copy_(ffn.router.weight)
        for expert, mine in zip(theirs.experts, ffn.experts, strict=True):
            for their_name, our_name in (("W_gate", "w1"), ("W_in", "w3"), ("W_out", "w2")):
                getattr(expert, their_name).weight.copy_(getattr(mine, our_name).weight)
    x = 3 * torch.randn(2, 7, 16)  # (B, T, d): spread, so that the routes differ token to token
    chosen = {}
    theirs.hook_expert_indices.add_hook(lambda t, hook: chosen.setdefault("theirs", t))  # (B T, k)
    with torch.no_grad():
        torch.testing.assert_close(ffn(x), theirs(x), rtol=0, atol=1e-5)  # float32 sums: 1.1e-6 apart
        ours = ffn.route(ffn.router(x))[1]  # (B, T, k)
    assert torch.equal(ours.reshape(-1, k), chosen["theirs"])
    assert len(set(ours.reshape(-1).tolist())) > 1


def test_a_mixture_transformerlens_has_no_place_for_is_refused_by_name():
    shared = bl.Transformer(bl.ModelConfig(**MOE, shared_expert_d_ff=8))
    with pytest.raises(ValueError, match=r"model.cfg.num_experts: shared_expert_d_ff=8 \(a shared expert\) "
                                         "has no place in TransformerLens' MoE"):
        _ = shared.cfg.num_experts
    after = bl.Transformer(bl.ModelConfig(**MOE, router_softmax="after_top_k"))
    with pytest.raises(ValueError, match="router_softmax='after_top_k' has no place"):
        _ = after.cfg.experts_per_token
    dense_experts = bl.Transformer(bl.ModelConfig(**{**MOE, "activation": "gelu"}))
    with pytest.raises(ValueError, match="activation='gelu' .experts that are not gated MLPs."):
        _ = dense_experts.cfg.norm_topk_prob


@pytest.mark.parametrize("patch", ["get_act_patch_resid_pre", "get_act_patch_attn_head_out_all_pos",
                                   "get_act_patch_attn_head_v_all_pos"])
def test_transformerlens_patching_module_gives_its_numbers_on_blocklab(models, patch):
    """TransformerLens' own activation patching (it reads model.cfg, the cache under its names and
    patches v per head in its layout) run on both models: the same patching map."""
    from transformer_lens import patching

    ours, theirs, _ = models
    clean = theirs.to_tokens("The cat sat on the mat")
    corrupted = theirs.to_tokens("The dog sat on the log")
    answer = int(clean[0, -1])

    def metric(logits):
        return logits[0, -2, answer] - logits[0, -2].mean()

    maps = []
    for model in (theirs, ours):
        with torch.no_grad():
            _, clean_cache = model.run_with_cache(clean)
            maps.append(getattr(patching, patch)(model, corrupted, clean_cache, metric))
    assert maps[0].shape == maps[1].shape and maps[0].abs().max() > 0.01
    torch.testing.assert_close(maps[1], maps[0], rtol=0, atol=2e-4)


# ---- generate as TransformerLens users call it (issue 37 item 5) ------------------------------------


@pytest.mark.parametrize("kwargs", [
    {"do_sample": False},
    {"temperature": 0.0},  # TL: greedy
    {"do_sample": False, "use_past_kv_cache": False},
    {"do_sample": False, "return_type": "tokens"},
    {"do_sample": False, "stop_at_eos": False},
])
def test_generate_with_transformerlens_keywords_gives_transformerlens_output(models, kwargs):
    ours, theirs, _ = models
    for given in (PROMPT, theirs.to_tokens(PROMPT)):
        want = theirs.generate(given, max_new_tokens=8, verbose=False, **kwargs)
        got = ours.generate(given, max_new_tokens=8, verbose=False, **kwargs)
        if isinstance(want, torch.Tensor):
            assert torch.equal(got, want), kwargs
        else:
            assert got == want, kwargs


def test_generate_stops_at_eos_and_fills_finished_rows_as_transformerlens(models):
    """TL's stop_at_eos (its default): a row stops at the EOS id and later columns hold it. The EOS id here
    is the token greedy decoding gives second, so one row stops early and the other goes on."""
    ours, theirs, _ = models
    prompts = [PROMPT, TEXT[:30]]
    free = theirs.generate(prompts, max_new_tokens=8, do_sample=False, stop_at_eos=False, verbose=False,
                           return_type="tokens")
    eos = int(free[0, -7])  # the first row's second new token
    want = theirs.generate(prompts, max_new_tokens=8, do_sample=False, eos_token_id=eos, verbose=False,
                           return_type="tokens")
    got = ours.generate(prompts, max_new_tokens=8, do_sample=False, eos_token_id=eos, verbose=False,
                        return_type="tokens")
    assert torch.equal(got, want) and (want == eos).any()
    assert ours.generate(prompts, max_new_tokens=8, do_sample=False, eos_token_id=eos, verbose=False) == \
        theirs.generate(prompts, max_new_tokens=8, do_sample=False, eos_token_id=eos, verbose=False)


def test_generate_refuses_what_it_cannot_do_as_transformerlens_would_by_name(models):
    ours, _, _ = models
    with pytest.raises(ValueError, match="padding_side='right'"):
        ours.generate(PROMPT, 4, padding_side="right")
    with pytest.raises(ValueError, match="return_type='embeds'"):
        ours.generate(PROMPT, 4, return_type="embeds")
    with pytest.raises(ValueError, match="frequency_penalty=0.5 only applies to sampling"):
        ours.generate(PROMPT, 4, do_sample=False, freq_penalty=0.5)
    with pytest.raises(ValueError, match="no field"):
        ours.generate(PROMPT, 4, top_q=0.5)


def test_freq_penalty_is_transformerlens_after_the_temperature():
    """TL's sample_logits: logits / T - freq_penalty * bincount(tokens); blocklab's sampling logits are the
    same up to the shift by the maximum, so the distributions are equal."""
    from blocklab.nn.generate import GenerationConfig, sampling_logits

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 11, generator=g)
    tokens = torch.tensor([[1, 1, 4, 7], [3, 3, 3, 9]])
    counts = torch.stack([torch.bincount(row, minlength=11).float() for row in tokens])
    want = torch.softmax(logits / 0.7 - 0.3 * counts, -1)
    config = GenerationConfig(temperature=0.7, frequency_penalty=0.3)
    torch.testing.assert_close(torch.softmax(sampling_logits(logits, config, 0, counts), -1), want)


def test_stop_at_layer_gives_the_stream_transformerlens_gives(models, llama):
    """model(x, stop_at_layer=k): the residual stream entering block k, as TransformerLens returns it (a
    negative k as a slice of the blocks); a loss cannot come from a stopped run and is refused by name."""
    (gpt2, their_gpt2, _), ((plain_llama, their_llama), _) = models, llama
    tokens = their_gpt2.to_tokens([TEXT[:40], TEXT[10:50]]) % 100  # the Llama's vocabulary is 100
    for ours, theirs in ((gpt2, their_gpt2), (plain_llama, their_llama)):
        with torch.no_grad():
            for k in (0, 1, 2, -1):
                stream = ours(tokens, stop_at_layer=k)
                assert stream.shape == (2, tokens.shape[1], 32)
                torch.testing.assert_close(stream, theirs(tokens, stop_at_layer=k), rtol=0, atol=1e-5)
            _, cache = ours.run_with_cache(tokens, stop_at_layer=1)
            _, their_cache = theirs.run_with_cache(tokens, stop_at_layer=1)
        assert set(their_cache) - {"hook_tokens"} <= set(cache)  # beyond it: x0, the per-head results
        assert not any(k.startswith(("blocks.1.", "ln_final", "unembed")) for k in cache)
        for name in set(their_cache) - {"hook_tokens"}:
            torch.testing.assert_close(cache[name], their_cache[name], rtol=0, atol=1e-5, msg=name)
    with pytest.raises(ValueError, match="stop_at_layer=1 returns the residual stream entering block 1"):
        gpt2(tokens, stop_at_layer=1, return_type="loss")


def test_run_with_cache_returns_a_plain_dict_as_transformerlens_without_the_cache_object(models):
    ours, theirs, _ = models
    tokens = theirs.to_tokens(PROMPT)
    _, ours_dict = ours.run_with_cache(tokens, return_cache_object=False, remove_batch_dim=True)
    _, their_dict = theirs.run_with_cache(tokens, return_cache_object=False, remove_batch_dim=True)
    assert type(ours_dict) is dict and type(their_dict) is dict
    for name, tensor in their_dict.items():
        if name != "hook_tokens":
            torch.testing.assert_close(ours_dict[name], tensor, rtol=0, atol=1e-4, msg=name)


def test_w_gate_is_none_on_an_ungated_model_as_in_transformerlens(models, llama):
    (gpt2, their_gpt2, _), ((plain_llama, their_llama), _) = models, llama
    assert gpt2.W_gate is None and their_gpt2.W_gate is None
    torch.testing.assert_close(plain_llama.W_gate, their_llama.W_gate, rtol=0, atol=1e-6)
    assert plain_llama.W_gate.shape == (2, 32, 64)


# TransformerLens' hook points for copies of the stream blocklab does not make (set_use_* refuses them)
COPIES = {"hook_attn_in", "hook_q_input", "hook_k_input", "hook_v_input", "hook_mlp_in"}


def test_hook_dict_and_mod_dict_hold_transformerlens_names(models, llama):
    """hook_dict: every name HookedTransformer's has (beyond it: the per-head copies set_use_* refuses, and
    hook_tokens), each a hook point whose .name is that name; mod_dict: its modules under its names."""
    (gpt2, their_gpt2, _), ((plain_llama, their_llama), _) = models, llama
    for ours, theirs in ((gpt2, their_gpt2), (plain_llama, their_llama)):
        missing = set(theirs.hook_dict) - set(ours.hook_dict)
        assert {name.rsplit(".", 1)[-1] for name in missing} - {"hook_tokens"} == COPIES, missing
        for name in set(theirs.hook_dict) - missing:
            if "ln_final.hook_normalized" != name != "unembed.hook_in":  # one stage, two names
                assert ours.hook_dict[name].name == name
        their_modules = {k for k in theirs.mod_dict if k not in theirs.hook_dict}
        assert their_modules <= set(ours.mod_dict)
        assert ours.mod_dict["unembed"] is ours.unembed is ours.head and ours.ln_final is ours.ln_f
        assert ours.mod_dict["blocks.1.mlp"] is ours.blocks[1].mlp is ours.blocks[1].ffn
        assert ours.mod_dict["blocks.0.attn.hook_z"] is ours.blocks[0].attn.hook_z
    assert gpt2.pos_embed is gpt2.pos and gpt2.blocks[0].attn.hook_z.name == "blocks.0.attn.hook_z"
    assert not hasattr(plain_llama, "pos_embed") and not hasattr(their_llama, "pos_embed")  # rotary


def hook_point_script(model, tokens):
    """TransformerLens' hook point objects: add_hook on hook_dict's and a block's hook point (v edited per
    head in TransformerLens' layout), a permanent one surviving remove_hooks, then reset_hooks."""
    seen = []
    model.blocks[0].attn.hook_z.add_hook(lambda z, hook: seen.append((hook.name, tuple(z.shape))))
    model.hook_dict["blocks.1.attn.hook_v"].add_hook(lambda v, hook: v * torch.arange(1, 5.0)[:, None])
    model.hook_dict["blocks.0.hook_resid_post"].add_hook(lambda x, hook: x + torch.arange(32.0) / 8,
                                                       is_permanent=True)  # not constant: LN centres
    with torch.no_grad():
        hooked = model(tokens)
        model.hook_dict["blocks.1.attn.hook_v"].remove_hooks()
        permanent = model(tokens)
        model.reset_hooks(including_permanent=True)
        plain = model(tokens)
    return seen, hooked, permanent, plain


def test_hook_points_add_and_remove_hooks_as_transformerlens(models):
    ours, theirs, _ = models
    tokens = theirs.to_tokens(PROMPT)
    mine, their = hook_point_script(ours, tokens), hook_point_script(theirs, tokens)
    assert mine[0] == their[0] == [("blocks.0.attn.hook_z", (1, tokens.shape[1], 4, 8))] * 2  # gone at reset
    for a, b in zip(mine[1:], their[1:], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4)
    assert (mine[1] - mine[3]).abs().max() > 0.1 and (mine[2] - mine[3]).abs().max() > 0.1
    with pytest.raises(ValueError, match="level=1: TransformerLens' hook levels"):
        ours.blocks[0].attn.hook_z.add_hook(lambda z, hook: z, level=1)
    # blocklab's model.hook_embed is x0; TransformerLens' hook_embed is the token part, which hook_dict has
    with pytest.raises(ValueError, match=r"hook_embed is blocklab's stage 'embed'.*hook_dict\['hook_"):
        ours.hook_embed.add_hook(lambda x, hook: x)
    assert ours.hook_dict["hook_embed"] is ours.hook_tok


def test_set_use_switches_give_hook_result_or_are_refused_by_name(models):
    ours, theirs, _ = models
    tokens = theirs.to_tokens(PROMPT)
    ours.set_use_attn_result(True)
    theirs.set_use_attn_result(True)
    try:
        assert ours.cfg.use_attn_result is True
        _, cache = ours.run_with_cache(tokens)
        _, their_cache = theirs.run_with_cache(tokens)
        name = "blocks.1.attn.hook_result"
        torch.testing.assert_close(cache[name], their_cache[name], rtol=0, atol=1e-5)
    finally:
        ours.set_use_attn_result(False)
        theirs.set_use_attn_result(False)
    for switch, instead in (("set_use_split_qkv_input", "blocks.{i}.attn.hook_q"),
                            ("set_use_attn_in", "blocks.{i}.attn.hook_q"),
                            ("set_use_hook_mlp_in", "blocks.{i}.ln2.hook_normalized")):
        getattr(ours, switch)(False)  # what blocklab does
        with pytest.raises(ValueError, match=rf"{switch}\(True\): TransformerLens then hooks .*{instead}"):
            getattr(ours, switch)(True)


POS_SLICES = [None, -1, 2, (1, 4), [0, 2, 3]]


def _processed_pairs(processed, llama):
    """(ours, theirs, tokens, their cache, our cache) for GPT-2 and the grouped-query Llama, processed (so
    TransformerLens' apply_ln_to_stack, which leaves gamma out, is the norm)."""
    (gpt2, their_gpt2), (_, (folded_llama, their_llama)) = processed, llama
    tokens = their_gpt2.to_tokens([TEXT[:30], TEXT[20:50]])
    pairs = []
    for ours, theirs, ids in ((gpt2, their_gpt2, tokens), (folded_llama, their_llama, tokens % 100)):
        with torch.no_grad():
            _, cache = ours.run_with_cache(ids)
            _, their_cache = theirs.run_with_cache(ids)
        pairs.append((ours, theirs, ids, cache, their_cache))
    return pairs


def _same(ours, theirs, what):
    (a, labels), (b, their_labels) = ours, theirs
    assert labels == their_labels, what
    torch.testing.assert_close(a, b, rtol=0, atol=5e-5, msg=what)


@pytest.mark.parametrize("pos_slice", POS_SLICES, ids=repr)
def test_the_cache_decompositions_take_pos_slice_as_transformerlens(processed, llama, pos_slice):
    """accumulated_resid, decompose_resid, stack_head_results, apply_ln_to_stack and logit_attrs with
    TransformerLens' pos_slice (an int drops the axis, a tuple is a slice, a list picks): its numbers and
    its labels (0_pre, final_post, embed, 0_attn_out, L0H0)."""
    for _, _, tokens, cache, their_cache in _processed_pairs(processed, llama):
        for kwargs in ({}, {"incl_mid": True, "apply_ln": True}, {"layer": 1, "apply_ln": True}):
            _same(cache.accumulated_resid(pos_slice=pos_slice, return_labels=True, **kwargs),
                  their_cache.accumulated_resid(pos_slice=pos_slice, return_labels=True, **kwargs), kwargs)
        for kwargs in ({}, {"apply_ln": True}, {"layer": 1, "mlp_input": True, "apply_ln": True}):
            _same(cache.decompose_resid(pos_slice=pos_slice, return_labels=True, **kwargs),
                  their_cache.decompose_resid(pos_slice=pos_slice, return_labels=True, **kwargs), kwargs)
        for kwargs in ({}, {"apply_ln": True}, {"layer": 1, "apply_ln": True}):
            _same(cache.stack_head_results(pos_slice=pos_slice, return_labels=True, **kwargs),
                  their_cache.stack_head_results(pos_slice=pos_slice, return_labels=True, **kwargs), kwargs)
        stack = their_cache.decompose_resid(pos_slice=pos_slice)
        torch.testing.assert_close(cache.apply_ln_to_stack(stack, 1, pos_slice=pos_slice),
                                   their_cache.apply_ln_to_stack(stack, 1, pos_slice=pos_slice),
                                   rtol=0, atol=5e-5)
        right, wrong = tokens[:, 1:2], tokens[:, 2:3]  # (B, 1): broadcast over the positions kept
        if isinstance(pos_slice, int):
            right, wrong = right[:, 0], wrong[:, 0]
        torch.testing.assert_close(cache.logit_attrs(stack, right, wrong, pos_slice=pos_slice),
                                   their_cache.logit_attrs(stack, right, wrong, pos_slice=pos_slice),
                                   rtol=0, atol=1e-4)


@pytest.mark.parametrize("pos_slice", [None, -1, (1, 4)], ids=repr)
def test_the_full_decomposition_and_neuron_results_equal_transformerlens(processed, llama, pos_slice):
    """get_full_resid_decomposition (heads, neurons or MLP outputs, x0, bias), stack_neuron_results and
    compute_head_results: TransformerLens' numbers and labels (L0H0, L0N0, 0_mlp_out, bias), and the parts
    sum to the stream."""
    for ours, _, tokens, cache, their_cache in _processed_pairs(processed, llama):
        for kwargs in ({}, {"expand_neurons": False}, {"layer": 1, "mlp_input": True, "apply_ln": True}):
            parts = cache.get_full_resid_decomposition(pos_slice=pos_slice, return_labels=True, **kwargs)
            _same(parts, their_cache.get_full_resid_decomposition(pos_slice=pos_slice, return_labels=True,
                                                                  **kwargs), kwargs)
        stream = cache.accumulated_resid(pos_slice=pos_slice)[-1]
        torch.testing.assert_close(cache.get_full_resid_decomposition(pos_slice=pos_slice).sum(0), stream,
                                   rtol=0, atol=1e-4)
        for neuron_slice in (None, (0, 5), [1, 7]):  # an int: TransformerLens 3 fails on its labels
            _same(cache.stack_neuron_results(2, pos_slice, neuron_slice, return_labels=True),
                  their_cache.stack_neuron_results(2, pos_slice, neuron_slice, return_labels=True),
                  neuron_slice)
        # a cache of z alone: the results computed from z and W_O, as TransformerLens computes them
        _, z_only = ours.run_with_cache(tokens, names_filter=lambda name: name.endswith("hook_z"))
        assert "blocks.0.attn.hook_result" not in z_only
        z_only.compute_head_results()
        name = "blocks.1.attn.hook_result"
        torch.testing.assert_close(z_only[name], their_cache[name], rtol=0, atol=1e-5)


def test_the_full_decomposition_is_refused_where_the_stream_is_not_that_sum():
    model = bl.Transformer(bl.preset("tiny-lm", norm_position="sandwich")).eval()
    _, cache = model.run_with_cache(torch.tensor([[1, 2, 3, 4]]))
    with pytest.raises(ValueError, match=r"block 0 .* adds ln1_out times 1 to 1 x its stream.*per_head=True"):
        cache.get_full_resid_decomposition()


def test_the_full_decomposition_is_refused_where_attention_feeds_the_ffn():
    """The simplified block, LN1(x + FFN(MHA(x))): its heads are not parts of the stream (TransformerLens
    would list them as if they were); the stream before the norm still decomposes as x + ffn.out."""
    model = bl.Transformer(bl.preset("tiny-lm", norm_position="simplified")).eval()
    _, cache = model.run_with_cache(torch.tensor([[1, 2, 3, 4]]))
    with pytest.raises(ValueError, match=r"block 0 .* adds no attention output to its stream"):
        cache.get_full_resid_decomposition()
    with pytest.raises(ValueError, match="model.cfg.parallel_attn_mlp: norm_position='simplified' feeds the "
                                         "attention output to the FFN"):
        getattr(model.cfg, "parallel_attn_mlp")  # noqa: B009 (the attribute read is what is tested)
    parts, labels = cache.decompose("blocks.0.resid_post", return_labels=True)
    assert labels == ["embed", "pos_embed", "0_mlp_out"]  # TransformerLens' labels: no 0_attn_out
    torch.testing.assert_close(parts[-1], cache["blocks.0.ffn.out"])
    torch.testing.assert_close(parts.sum(0), cache["blocks.0.resid_post"])


def test_the_batch_slice_and_the_models_logit_helpers_as_transformerlens(models):
    ours, theirs, _ = models
    tokens = theirs.to_tokens([TEXT[:30], TEXT[20:50]])
    with torch.no_grad():
        _, cache = ours.run_with_cache(tokens)
        _, their_cache = theirs.run_with_cache(tokens)
    for batch_slice in (1, (0, 1), [1, 0]):
        sliced = cache.apply_slice_to_batch_dim(batch_slice)
        their_sliced = their_cache.apply_slice_to_batch_dim(batch_slice)
        for name in ("blocks.1.hook_resid_post", "blocks.0.attn.hook_v", "blocks.0.attn.hook_pattern"):
            torch.testing.assert_close(sliced[name], their_sliced[name], rtol=0, atol=1e-5)
    for layer, mlp_input in ((0, False), (1, True), (2, False)):
        torch.testing.assert_close(ours.accumulated_bias(layer, mlp_input),
                                   theirs.accumulated_bias(layer, mlp_input), rtol=0, atol=1e-6)
        torch.testing.assert_close(ours.accumulated_bias(layer, mlp_input, include_mlp_biases=False),
                                   theirs.accumulated_bias(layer, mlp_input, include_mlp_biases=False),
                                   rtol=0, atol=1e-6)
    for which in (" cat", 7, torch.tensor(7), tokens[0], tokens):
        torch.testing.assert_close(ours.tokens_to_residual_directions(which),
                                   theirs.tokens_to_residual_directions(which), rtol=0, atol=0)
    for mode in ("first", "last"):
        assert ours.get_token_position(" sat", TEXT, mode) == theirs.get_token_position(" sat", TEXT, mode)
        ids = theirs.to_tokens(TEXT)
        assert ours.get_token_position(" sat", ids, mode) == theirs.get_token_position(" sat", ids, mode)
    assert [ours.to_single_str_token(i) for i in range(20)] == \
        [theirs.to_single_str_token(i) for i in range(20)]


@pytest.mark.parametrize("pos_slice", [None, -1], ids=repr)
def test_the_decompositions_other_transformerlens_keywords_give_its_parts(processed, llama, pos_slice):
    """decompose_resid's mode and incl_embeds, accumulated_resid's mlp_input, the stacks' incl_remainder:
    TransformerLens' parts, labels and numbers."""
    for _, _, _, cache, their_cache in _processed_pairs(processed, llama):
        for kwargs in ({"mode": "attn"}, {"mode": "mlp", "incl_embeds": False},
                       {"layer": 1, "mlp_input": True, "mode": "attn", "apply_ln": True}):
            _same(cache.decompose_resid(pos_slice=pos_slice, return_labels=True, **kwargs),
                  their_cache.decompose_resid(pos_slice=pos_slice, return_labels=True, **kwargs), kwargs)
        for kwargs in ({"layer": 1, "mlp_input": True}, {"layer": 1, "mlp_input": True, "apply_ln": True}):
            _same(cache.accumulated_resid(pos_slice=pos_slice, return_labels=True, **kwargs),
                  their_cache.accumulated_resid(pos_slice=pos_slice, return_labels=True, **kwargs), kwargs)
        for layer in (1, 2):
            _same(cache.stack_head_results(layer, True, True, pos_slice=pos_slice),
                  their_cache.stack_head_results(layer, True, True, pos_slice=pos_slice), layer)
            _same(cache.stack_neuron_results(layer, pos_slice, (0, 4), True, incl_remainder=True),
                  their_cache.stack_neuron_results(layer, pos_slice, (0, 4), True, incl_remainder=True),
                  layer)
    with pytest.raises(ValueError, match="mode='heads' is not one of: all, attn, mlp"):
        cache.decompose_resid(mode="heads")


def _attribute(model, name):
    """``model.blocks[0].attn.hook_pattern`` for ``blocks.0.attn.hook_pattern``: attribute by attribute."""
    for part in name.split("."):
        model = model[int(part)] if part.isdigit() else getattr(model, part)
    return model


def test_hook_points_are_attributes_under_transformerlens_names(models, llama):
    """Every hook name both models have reaches, attribute by attribute, the hook point hook_dict gives (and
    HookedTransformer's own of that name), so model.blocks[0].mlp.hook_post.add_hook(fn) runs as there;
    model.hook_embed alone stays blocklab's x0 (its add_hook refused, above)."""
    (gpt2, their_gpt2, _), ((plain_llama, their_llama), _) = models, llama
    for ours, theirs in ((gpt2, their_gpt2), (plain_llama, their_llama)):
        shared = set(theirs.hook_dict) & set(ours.hook_dict)
        for name in shared - {"hook_embed"}:
            assert _attribute(ours, name) is ours.hook_dict[name], name
            assert _attribute(theirs, name) is theirs.hook_dict[name], name
        assert ours.hook_embed.stage == "embed" and not ours.state_dict().keys() & {"blocks.0.mlp.hook_post"}


def test_batch_slice_has_batch_dim_and_recompute_ln_as_transformerlens(processed, llama):
    """apply_ln_to_stack's and logit_attrs' batch_slice (the rows of the stack and of the denominators),
    has_batch_dim (a cache after remove_batch_dim) and recompute_ln: TransformerLens' numbers."""
    for _, _, tokens, cache, their_cache in _processed_pairs(processed, llama):
        stack = their_cache.decompose_resid(pos_slice=-1)  # (parts, B, d)
        for batch_slice in (None, 1, [1, 0]):
            for kwargs in ({}, {"recompute_ln": True} if batch_slice != 1 else {}):  # TL 3 fails on an int
                kwargs.update(pos_slice=-1, batch_slice=batch_slice)
                torch.testing.assert_close(cache.apply_ln_to_stack(stack, None, **kwargs),
                                           their_cache.apply_ln_to_stack(stack, None, **kwargs),
                                           rtol=0, atol=5e-5)
        torch.testing.assert_close(cache.logit_attrs(stack, tokens[1, 1], pos_slice=-1, batch_slice=1),
                                   their_cache.logit_attrs(stack, tokens[1, 1], pos_slice=-1, batch_slice=1),
                                   rtol=0, atol=1e-4)
        row, their_row = cache.apply_slice_to_batch_dim(0), their_cache.apply_slice_to_batch_dim(0)
        assert row.has_batch_dim is False and their_row.has_batch_dim is False
        one = stack[:, 0]  # (parts, d): the first row's parts
        kwargs = {"pos_slice": -1, "has_batch_dim": False}
        torch.testing.assert_close(row.logit_attrs(one, tokens[0, 1], **kwargs),
                                   their_row.logit_attrs(one, tokens[0, 1], **kwargs), rtol=0, atol=1e-4)
        with pytest.raises(ValueError, match="this cache has no batch dimension"):
            row.apply_slice_to_batch_dim(0)


def test_cache_keys_with_a_sublayer_and_stack_activation_as_transformerlens(processed):
    """cache[name, layer, sublayer] (TransformerLens' get_act_name: the norm's scale by ln1 or ln2, q in its
    layout) and stack_activation(name, layer, sublayer_type): TransformerLens' tensors."""
    ours, theirs = processed
    tokens = theirs.to_tokens([TEXT[:30], TEXT[20:50]])
    with torch.no_grad():
        _, cache = ours.run_with_cache(tokens)
        _, their_cache = theirs.run_with_cache(tokens)
    for key in (("scale", 1, "ln2"), ("normalized", 0, "ln1"), ("q", -1, "attn"), ("pattern", 0, "a"),
                ("post", 1, "m"), ("resid_mid", 0, "b"), ("z", 1, None)):
        torch.testing.assert_close(cache[key], their_cache[key], rtol=0, atol=1e-5, msg=str(key))
    torch.testing.assert_close(cache.stack_activation("scale", -1, "ln1"),
                               their_cache.stack_activation("scale", -1, "ln1"), rtol=0, atol=1e-5)


@pytest.mark.parametrize("mode", ["Q", "K", "V"])
def test_all_composition_scores_and_circuit_products_equal_transformerlens(models, mode):
    ours, theirs, _ = models
    torch.testing.assert_close(ours.all_composition_scores(mode), theirs.all_composition_scores(mode),
                               rtol=0, atol=1e-5)
    # the full OV circuit of one head, token to token, as a circuits notebook writes it
    ov_ours, ov_theirs = ours.W_E @ ours.OV[1, 2] @ ours.W_U, theirs.W_E @ theirs.OV[1, 2] @ theirs.W_U
    assert ov_ours.shape == ov_theirs.shape == (ours.config.vocab_size, ours.config.vocab_size)
    torch.testing.assert_close(ov_ours.AB, ov_theirs.AB, rtol=0, atol=1e-4)
    torch.testing.assert_close(ours.QK[0].S, theirs.QK[0].S, rtol=0, atol=1e-4)
    with pytest.raises(ValueError, match="'Q', 'K', 'V'"):
        ours.all_composition_scores("O")


def test_refactored_attention_matrices_are_transformerlens_and_keep_the_logits(models):
    plain, _, folder = models
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(folder)).eval()
    theirs = _hooked(hf, folder, process=True, refactor=True)
    ours = bl.load(folder).model
    ours.process_weights_(refactor_factored_attn_matrices=True)
    assert ours.weights_processed[-1] == "refactor_factored_attn_matrices"
    tokens = theirs.to_tokens(TEXT[:60])
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens).log_softmax(-1), plain(tokens).log_softmax(-1), rtol=0,
                                   atol=1e-4)
        torch.testing.assert_close(ours(tokens), theirs(tokens), rtol=0, atol=1e-4)

    def gram(t):  # blind to the sign each singular vector may take
        return t @ t.transpose(-2, -1)

    q_side = lambda m: torch.cat([m.W_Q, m.b_Q[:, :, None, :]], dim=2)
    k_side = lambda m: torch.cat([m.W_K, m.b_K[:, :, None, :]], dim=2)
    for side in (q_side, k_side, lambda m: m.W_V, lambda m: m.W_O.transpose(-2, -1)):
        torch.testing.assert_close(gram(side(ours)), gram(side(theirs)), rtol=0, atol=1e-4)
    torch.testing.assert_close(ours.b_O, theirs.b_O, rtol=0, atol=1e-5)
    assert float(ours.b_V.detach().abs().max()) == 0.0
    eye = torch.eye(theirs.cfg.d_head).expand_as(ours.W_O @ ours.W_O.transpose(-2, -1))
    torch.testing.assert_close(ours.W_O @ ours.W_O.transpose(-2, -1), eye, rtol=0, atol=1e-5)  # a rotation


def test_to_string_and_the_tokenizer_calls_give_what_transformerlens_gives(models):
    ours, theirs, _ = models
    tokens = theirs.to_tokens([PROMPT, TEXT[:30]])  # a BOS first, the short row padded with end of text
    assert ours.to_string(tokens) == theirs.to_string(tokens)
    assert ours.to_string(tokens[0]) == theirs.to_string(tokens[0])
    for kwargs in (dict(padding=True, return_tensors="pt"), dict(padding=True, padding_side="left")):
        texts = [PROMPT, TEXT[:30]]
        mine, their = ours.tokenizer(texts, **kwargs), theirs.tokenizer(texts, **kwargs)
        for key in ("input_ids", "attention_mask"):
            assert (torch.equal if "return_tensors" in kwargs else list.__eq__)(mine[key], their[key])
    assert ours.tokenizer.batch_decode(tokens) == theirs.tokenizer.batch_decode(tokens)
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "padding_side"):
        assert getattr(ours.tokenizer, name) == getattr(theirs.tokenizer, name), name


def test_transformerlens_module_attributes_hold_its_weights(models, llama):
    for ours, theirs in (models[:2], llama[0]):  # both unprocessed: the norms keep gamma (and beta)
        pairs = [(ours.unembed.W_U, theirs.unembed.W_U), (ours.embed.W_E, theirs.embed.W_E),
                 (ours.blocks[1].ln1.w, theirs.blocks[1].ln1.w), (ours.ln_final.w, theirs.ln_final.w),
                 (ours.blocks[0].mlp.W_in, theirs.blocks[0].mlp.W_in),
                 (ours.blocks[0].attn.W_Q, theirs.blocks[0].attn.W_Q)]
        if ours.config.pos_encoding == "learned":
            pairs += [(ours.pos_embed.W_pos, theirs.pos_embed.W_pos), (ours.unembed.b_U, theirs.unembed.b_U),
                      (ours.blocks[0].ln2.b, theirs.blocks[0].ln2.b)]
        else:  # RMSNorm has no beta, in TransformerLens as here
            assert not hasattr(ours.blocks[0].ln2, "b") and not hasattr(theirs.blocks[0].ln2, "b")
        for mine, their in pairs:
            torch.testing.assert_close(mine, their, rtol=0, atol=1e-6)


# ---- the GPT-NeoX battery: parallel attention and MLP, partial rotary, no BOS by default ------------------


@pytest.fixture(scope="module")
def neox(tmp_path_factory):
    """(blocklab's import of a random GPT-NeoX folder: 2 layers, attention and MLP in parallel, rotary on a
    quarter of each head, LayerNorm with beta; TransformerLens' HookedTransformer of it by its own config
    reader and converter, unprocessed; the folder; both again after from_pretrained's processing), with the
    byte-level BPE the GPT-2 fixture trains."""
    from transformer_lens.loading_from_pretrained import convert_hf_model_config
    from transformer_lens.pretrained.weight_conversions import convert_neox_weights

    folder = tmp_path_factory.mktemp("neox-tl")
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([TEXT] * 20, vocab_size=300, min_frequency=1, special_tokens=[EOT])
    torch.manual_seed(2)
    config = transformers.GPTNeoXConfig(
        vocab_size=bpe.get_vocab_size(), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=64, rotary_pct=0.25, bos_token_id=0, eos_token_id=0)
    hf = transformers.GPTNeoXForCausalLM(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.2 * torch.randn_like(p))
    hf.save_pretrained(str(folder))
    (folder / "tokenizer.json").write_text(bpe._tokenizer.to_str())
    transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"), bos_token=EOT, eos_token=EOT, unk_token=EOT,
        pad_token=EOT).save_pretrained(str(folder))
    cfg = HookedTransformerConfig.unwrap(convert_hf_model_config(str(folder)))
    theirs = HookedTransformer(cfg, tokenizer=transformers.AutoTokenizer.from_pretrained(str(folder)))
    theirs.load_and_process_state_dict(convert_neox_weights(hf, cfg), fold_ln=False, center_unembed=False,
                                       center_writing_weights=False, fold_value_biases=False)
    processed = HookedTransformer(cfg, tokenizer=theirs.tokenizer)
    processed.load_and_process_state_dict(convert_neox_weights(hf, cfg))  # from_pretrained's processing
    ours_processed = bl.load(folder).model
    ours_processed.process_weights_()
    return bl.load(folder).model, theirs.eval(), folder, ours_processed, processed.eval()


def test_neox_logits_and_the_cache_at_every_transformerlens_name(neox):
    ours, theirs, *_ = neox
    tokens = theirs.to_tokens([TEXT[:40], TEXT[10:50]])
    assert torch.equal(ours.to_tokens([TEXT[:40], TEXT[10:50]]), tokens)  # no BOS, as TransformerLens' NeoX
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens), theirs(tokens), rtol=0, atol=1e-4)
        _, their_cache = theirs.run_with_cache(tokens)
        _, our_cache = ours.run_with_cache(tokens)
    assert any(name.endswith("hook_rot_q") for name in their_cache)
    for name, want in their_cache.items():
        torch.testing.assert_close(our_cache[name], want, rtol=0, atol=2e-4, msg=name)


def test_neox_transformerlens_scripts_run_unchanged_with_the_same_numbers(neox):
    ours, theirs, *_ = neox
    with torch.no_grad():
        mine, reference = transformerlens_script(ours), transformerlens_script(theirs)
    for got, want in zip(mine[:3] + mine[4:5], reference[:3] + reference[4:5], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    assert mine[3] == reference[3] and mine[5] == reference[5]
    mine, reference = hooks_script(ours, kept="attn_out"), hooks_script(theirs, kept="attn_out")
    assert mine.keys() == reference.keys()
    for key, want in reference.items():
        torch.testing.assert_close(mine[key], want, rtol=0, atol=1e-4, msg=key)


@pytest.mark.parametrize("patch", ["get_act_patch_resid_pre", "get_act_patch_attn_head_out_all_pos"])
def test_neox_transformerlens_patching_and_logit_attribution_give_its_numbers(neox, patch):
    """TransformerLens' patching on the models as loaded; its logit-attribution idioms on the models as its
    from_pretrained gives them (processed: its logit_attrs scales by the final norm's denominator without
    gamma, which is the attribution only once gamma is folded into W_U)."""
    from transformer_lens import patching

    _, theirs, _, ours_processed, theirs_processed = neox
    clean, corrupted = theirs.to_tokens("The cat sat on the mat"), theirs.to_tokens("The dog sat on the log")
    answer = int(clean[0, -1])
    results = []
    for model, processed in ((theirs, theirs_processed), (neox[0], ours_processed)):
        with torch.no_grad():
            _, cache = model.run_with_cache(clean)
            patched = getattr(patching, patch)(model, corrupted, cache,
                                               lambda lg: lg[0, -2, answer] - lg[0, -2].mean())
            _, cache = processed.run_with_cache(clean)
            stack, labels = cache.accumulated_resid(pos_slice=-2, return_labels=True)
            scaled = cache.apply_ln_to_stack(stack, layer=-1, pos_slice=-2)
            attrs = cache.logit_attrs(stack, torch.tensor([answer]), pos_slice=-2)
            heads = cache.stack_head_results(layer=-1, pos_slice=-2)
            direction = processed.tokens_to_residual_directions(torch.tensor([answer]))
            results.append(((patched, stack, scaled, attrs, heads, direction), labels))
    (theirs_numbers, their_labels), (our_numbers, our_labels) = results
    assert our_labels == their_labels
    names = ("patched", "accumulated_resid", "apply_ln_to_stack", "logit_attrs", "stack_head_results",
             "tokens_to_residual_directions")
    for got, want, name in zip(our_numbers, theirs_numbers, names, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=2e-4, msg=name)


# ---- rotary scalings in model.cfg: TransformerLens' NTK-by-parts (Llama 3) and linear factor ----------


@pytest.mark.parametrize("scaling", [
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 16},
    {"rope_type": "linear", "factor": 4.0}], ids=["llama3", "linear"])
def test_a_scaled_rotary_model_cfg_builds_hooked_transformer_with_the_same_logits(tmp_path, scaling):
    """A Llama with Llama 3's or the linear rope scaling: a HookedTransformer built from blocklab's model.cfg
    (use_NTK_by_parts_rope and its factors, or rotary_scaling_factor) with convert_llama_weights gives
    blocklab's logits, and TransformerLens' rotations; without the scaling fields it would not."""
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, rope_scaling=scaling)).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.3 * torch.randn_like(p))
    hf.save_pretrained(str(tmp_path))
    ours = bl.load(tmp_path).model
    fields = set(HookedTransformerConfig.__dataclass_fields__)
    stated = {k: v for k, v in ours.cfg.to_dict().items() if k in fields}
    tokens = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(1))

    def logits_of(cfg_fields: dict):
        cfg = HookedTransformerConfig(**{**cfg_fields, "original_architecture": "LlamaForCausalLM"})
        theirs = HookedTransformer(cfg).eval()
        theirs.load_and_process_state_dict(convert_llama_weights(hf, cfg), fold_ln=False,
                                           center_writing_weights=False, center_unembed=False)
        with torch.no_grad():
            return theirs.run_with_cache(tokens)

    (want, their_cache), mine = logits_of(stated), ours.run_with_cache(tokens)
    torch.testing.assert_close(mine[0], want, rtol=0, atol=1e-4)
    torch.testing.assert_close(mine[1]["blocks.1.attn.hook_rot_q"], their_cache["blocks.1.attn.hook_rot_q"],
                               rtol=0, atol=1e-4)
    unscaled = {**stated, "use_NTK_by_parts_rope": False, "rotary_scaling_factor": 1.0}
    assert (logits_of(unscaled)[0] - want).abs().max() > 1e-2  # the fields carry the scaling


def test_a_rotary_scaling_transformerlens_would_put_on_other_layers_is_refused_by_name():
    """Llama 3's scaling with a local base of its own (blocklab: global layers only; TransformerLens: all),
    the linear one with windows and no local base (blocklab: every layer; TransformerLens: global ones)."""
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 16}
    shape = dict(vocab_size=50, d_model=32, n_heads=4, n_layers=2, causal=True, pos_encoding="rotary",
                 layer_windows=(4, None))
    gemma_like = bl.Transformer(bl.ModelConfig(**shape, rope_scaling=llama3, local_rotary_base=10.0))
    with pytest.raises(ValueError, match="use_NTK_by_parts_rope: rope_scaling is Llama 3's on the global"):
        _ = gemma_like.cfg.use_NTK_by_parts_rope
    windowed = bl.Transformer(bl.ModelConfig(**shape, rope_scaling={"rope_type": "linear", "factor": 2.0}))
    with pytest.raises(ValueError, match="rotary_scaling_factor: rope_scaling is linear on layers with a "):
        _ = windowed.cfg.rotary_scaling_factor
    local_base = bl.Transformer(bl.ModelConfig(**shape, rope_scaling={"rope_type": "linear", "factor": 2.0},
                                               local_rotary_base=10.0))
    assert local_base.cfg.rotary_scaling_factor == 2.0 and local_base.cfg.rotary_base_local == 10.0
