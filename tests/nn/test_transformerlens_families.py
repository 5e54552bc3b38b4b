"""The shared-norm parallel families (Phi, GPT-J), GPT-Neo (unscaled scores, local layers), Phi-3 (fused
projections), BLOOM (ALiBi, the embedding LayerNorm), OPT (offset positions), Mistral (a window on every
layer) and Qwen2 (q, k, v biases; text without BOS, as TransformerLens' Qwen2) against
TransformerLens' HookedTransformer built by its own config reader and weight converters from the same local
folder (no network): tokens, logits, the cache at every TransformerLens hook name (TransformerLens gives the
shared-norm blocks two tied norms, ln1 and ln2, where the block has one), the processed weights' logits, and
a hook that edits a head."""

from __future__ import annotations

import json

import pytest
import torch

import blocklab as bl

transformers = pytest.importorskip("transformers")
pytest.importorskip("transformer_lens")
from tokenizers import ByteLevelBPETokenizer  # noqa: E402
from transformer_lens import HookedTransformer, HookedTransformerConfig  # noqa: E402
from transformer_lens.loading_from_pretrained import convert_hf_model_config  # noqa: E402
from transformer_lens.pretrained.weight_conversions import (  # noqa: E402
    convert_bloom_weights,
    convert_gptj_weights,
    convert_mistral_weights,
    convert_neo_weights,
    convert_opt_weights,
    convert_phi3_weights,
    convert_phi_weights,
    convert_qwen2_weights,
)

EOT = "<|endoftext|>"
TEXT = "The cat sat on the mat. The dog sat on the log. A cat and a dog sat on a mat and a log."
FAMILIES = {  # name -> (transformers model of a vocabulary size, TransformerLens' converter)
    "phi": (lambda vocab: transformers.PhiForCausalLM(transformers.PhiConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=64, partial_rotary_factor=0.5, bos_token_id=0, eos_token_id=0)),
        convert_phi_weights),
    "gptj": (lambda vocab: transformers.GPTJForCausalLM(transformers.GPTJConfig(  # TL's d_mlp is 4 d
        vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=64, rotary_dim=4, bos_token_id=0,
        eos_token_id=0)), convert_gptj_weights),
    # GPT-Neo: unscaled scores, a global and a local layer (TL's d_mlp is 4 d: intermediate_size unset)
    "gpt_neo": (lambda vocab: transformers.GPTNeoForCausalLM(transformers.GPTNeoConfig(
        vocab_size=vocab, hidden_size=32, num_layers=2, num_heads=4, max_position_embeddings=64,
        attention_types=[[["global", "local"], 1]], window_size=5, bos_token_id=0, eos_token_id=0)),
        convert_neo_weights),
    # Phi-3: Llama's block from fused qkv_proj and gate_up_proj (TL reads neither a window nor partial rotary)
    "phi3": (lambda vocab: transformers.Phi3ForCausalLM(transformers.Phi3Config(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=0)),
        convert_phi3_weights),
    # BLOOM: ALiBi, the embedding LayerNorm, q, k, v fused head by head. 4 heads: for a count that is no power
    # of two TransformerLens' slopes (2^(-8/h) stepped geometrically) are not BLOOM's (the paper's rule, which
    # transformers and blocklab follow; tests/weights/test_hf_families.py): 2e-3 apart in logits at 6 heads
    "bloom": (lambda vocab: transformers.BloomForCausalLM(transformers.BloomConfig(
        vocab_size=vocab, hidden_size=32, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0)),
        convert_bloom_weights),
    # OPT: learned positions read at an offset of 2, ReLU, biased LayerNorm (pre-norm: TransformerLens reads
    # neither the 350m's post-norm block, do_layer_norm_before, nor its project_in/out)
    "opt": (lambda vocab: transformers.OPTForCausalLM(transformers.OPTConfig(
        vocab_size=vocab, hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=64, word_embed_proj_dim=32, bos_token_id=0, eos_token_id=0, pad_token_id=0)),
        convert_opt_weights),
    # Mistral: grouped queries, a window shorter than the input on every layer
    "mistral": (lambda vocab: transformers.MistralForCausalLM(transformers.MistralConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=None, max_position_embeddings=64, sliding_window=5, bos_token_id=0,
        eos_token_id=0)), convert_mistral_weights),
    # Qwen2: q, k, v biases, grouped queries, an untied head
    "qwen2": (lambda vocab: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False, bos_token_id=0,
        eos_token_id=0)), convert_qwen2_weights),
}
SHARED_NORM = ("phi", "gptj")  # one norm feeding both branches, which TransformerLens gives two names
# blocklab's fold_ln refuses a model whose embeddings pass a LayerNorm (BLOOM's; TransformerLens leaves that
# norm unfolded): the processed weights are not compared for these
UNFOLDED = ("bloom",)
# names under which TransformerLens holds another tensor than blocklab's alias: its BLOOM's hook_embed is the
# token embedding after the embedding LayerNorm (blocklab's embed, x0, with ALiBi adding no position), where
# every other HookedTransformer's is the token part (tok): refused by name on a model with an embedding norm
DIFFERENT = {"bloom": {"hook_embed": "embed"}}


@pytest.fixture(scope="module", params=list(FAMILIES))
def pair(request, tmp_path_factory):
    """(blocklab's import of a random folder of the family, TransformerLens' HookedTransformer of it,
    unprocessed, and both after TransformerLens' processing)."""
    build, convert = FAMILIES[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([TEXT] * 20, vocab_size=300, min_frequency=1, special_tokens=[EOT])
    torch.manual_seed(3)
    hf = build(bpe.get_vocab_size()).eval()
    with torch.no_grad():  # spread the weights: norms and biases too, so that processing them matters
        for p in hf.parameters():
            p.add_(0.2 * torch.randn_like(p))
    hf.save_pretrained(str(folder))
    (folder / "tokenizer.json").write_text(bpe._tokenizer.to_str())
    (folder / "special_tokens_map.json").write_text(json.dumps({"bos_token": EOT, "eos_token": EOT}))
    transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"), bos_token=EOT, eos_token=EOT, unk_token=EOT,
        pad_token=EOT).save_pretrained(str(folder))
    cfg = HookedTransformerConfig.unwrap(convert_hf_model_config(str(folder)))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    theirs = HookedTransformer(cfg, tokenizer=tokenizer)
    theirs.load_and_process_state_dict(convert(hf, cfg), fold_ln=False, center_unembed=False,
                                       center_writing_weights=False, fold_value_biases=False)
    processed = HookedTransformer(cfg, tokenizer=tokenizer)
    processed.load_and_process_state_dict(convert(hf, cfg))  # from_pretrained's processing
    if request.param in UNFOLDED:
        return bl.load(folder).model, theirs.eval(), None, None, request.param
    ours_processed = bl.load(folder).model
    # (TransformerLens centres the writing weights only where LayerNorm reads the stream: not under RMSNorm)
    ours_processed.process_weights_(center_writing_weights=ours_processed.config.norm == "standard")
    return bl.load(folder).model, theirs.eval(), ours_processed, processed.eval(), request.param


def test_tokens_logits_and_the_cache_at_every_transformerlens_name(pair):
    ours, theirs, *_, family = pair
    tokens = theirs.to_tokens([TEXT[:40], TEXT[10:50]])
    assert torch.equal(ours.to_tokens([TEXT[:40], TEXT[10:50]]), tokens)  # BOS as TransformerLens decides
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens), theirs(tokens), rtol=0, atol=1e-4)
        _, their_cache = theirs.run_with_cache(tokens)
        _, our_cache = ours.run_with_cache(tokens)
    assert any(name.endswith("ln2.hook_normalized") for name in their_cache)  # (a tied norm in SHARED_NORM)
    different = DIFFERENT.get(family, {})
    assert set(their_cache) - set(different) <= set(our_cache.keys())  # a filter finds what it finds there
    assert not set(different) & set(our_cache.keys())
    for name, want in their_cache.items():
        if name in different:  # the stage holding TransformerLens' tensor: what the refusal points to
            torch.testing.assert_close(our_cache[different[name]], want, rtol=0, atol=2e-4, msg=name)
            continue
        torch.testing.assert_close(our_cache[name], want, rtol=0, atol=2e-4, msg=name)


def test_a_name_transformerlens_gives_another_tensor_is_refused_wherever_it_is_written(pair):
    """BLOOM's hook_embed (after the embedding LayerNorm in TransformerLens, the token part in blocklab's
    alias): the cache, hooks, names filters, hook_dict and ``cache[name, layer]``-style reads refuse it by
    name; a predicate meaning it selects nothing (no stage is TransformerLens' hook_embed there)."""
    ours, theirs, *_, family = pair
    if family not in DIFFERENT:
        pytest.skip("every TransformerLens name of this family holds blocklab's tensor")
    tokens = theirs.to_tokens(TEXT[:30])
    refusal = r"'hook_embed' \(TransformerLens\) is another tensor on this model \(embed_norm=True\)"
    _, cache = ours.run_with_cache(tokens)
    with pytest.raises(KeyError, match=refusal):
        cache["hook_embed"]
    with pytest.raises(KeyError, match=refusal):
        ours.hook_dict["hook_embed"]
    with pytest.raises(ValueError, match=refusal):
        ours.run_with_cache(tokens, names_filter="hook_embed")
    with pytest.raises(ValueError, match=refusal):
        ours.run_with_hooks(tokens, fwd_hooks=[("hook_embed", lambda x, hook: x)])
    with pytest.raises(ValueError, match=refusal):
        ours.add_hook("hook_embed", lambda x, hook: x)
    _, picked = ours.run_with_cache(tokens, names_filter=lambda name: name == "hook_embed")
    assert len(picked) == 0
    their_key = {"hook_embed"} & set(theirs.run_with_cache(tokens)[1].keys())
    assert their_key == {"hook_embed"}  # (the name is TransformerLens' on this family: the refusal matters)


def test_processed_weights_give_transformerlens_logits_and_weights(pair):
    _, _, ours, theirs, family = pair
    if family in UNFOLDED:
        pytest.skip("blocklab's fold_ln refuses the embedding LayerNorm")
    tokens = theirs.to_tokens(TEXT[:50])
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens), theirs(tokens), rtol=0, atol=1e-4)
    for name in ("W_Q", "W_K", "W_V", "W_O", "b_O", "W_in", "b_in", "W_out", "b_out", "W_U", "b_U"):
        torch.testing.assert_close(getattr(ours, name), getattr(theirs, name), rtol=0, atol=1e-5, msg=name)


def test_a_hook_on_a_head_edits_what_transformerlens_edits_and_one_on_the_tied_copy_is_refused(pair):
    """TransformerLens' ln2 in these blocks is a copy of ln1 feeding the MLP alone: editing it there edits
    the MLP's input only; blocklab's block has one norm feeding both branches, so an edit under that name
    is refused by name (reading it gives ln1's values, above)."""
    ours, theirs, *_, family = pair
    tokens = theirs.to_tokens(TEXT[:30])

    def zero_head_1(v, hook):  # (B, T, heads, d_head) under TransformerLens' names (Phi-3: 2 kv heads)
        v[:, :, 1] = 0.0
        return v

    with torch.no_grad():
        got = ours.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_v", zero_head_1)])
        want = theirs.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_v", zero_head_1)])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    if family not in SHARED_NORM:
        return
    with pytest.raises(ValueError, match=r"blocks\.0\.ln2\.hook_normalized.*ln1"):
        ours.run_with_hooks(tokens, fwd_hooks=[("blocks.0.ln2.hook_normalized", lambda x, hook: 2 * x)])
