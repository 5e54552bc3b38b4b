"""Gemma and Gemma 2 against TransformerLens' HookedTransformer with the same weights, converted by its own
convert_gemma_weights (no network; TransformerLens reads Gemma's shapes from its table of official names, so
the config is written here as that table writes Gemma's and Gemma 2's, at a tiny shape): logits and the
cache at every TransformerLens hook name, soft-caps, local layers and the query pre-attention scalar
included."""

from __future__ import annotations

import math

import pytest
import torch

import blocklab as bl

transformers = pytest.importorskip("transformers")
pytest.importorskip("transformer_lens")
from transformer_lens import HookedTransformer, HookedTransformerConfig  # noqa: E402
from transformer_lens.pretrained.weight_conversions import convert_gemma_weights  # noqa: E402

SHAPE = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=64, rms_norm_eps=1e-6,
             hidden_activation="gelu_pytorch_tanh", pad_token_id=0)
# Gemma 2: a local layer with a window shorter than the input, both soft-caps, a query pre-attention scalar
# that is not d_head (its scale 1/sqrt(24))
GEMMA2 = dict(sliding_window=5, attn_logit_softcapping=5.0, final_logit_softcapping=3.0,
              query_pre_attn_scalar=24)


def their_config(family: str) -> HookedTransformerConfig:
    """TransformerLens' config for the tiny shape, as its table writes google/gemma-2b's and gemma-2-2b's
    (the layer kinds in transformers' order: layer 0 local, as Gemma2Config's layer_types)."""
    common = dict(d_model=32, d_head=16, n_heads=4, n_key_value_heads=2, d_mlp=64, n_layers=2, n_ctx=64,
                  eps=1e-6, d_vocab=100, act_fn="gelu_pytorch_tanh", normalization_type="RMS",
                  rotary_base=10000.0, rotary_dim=16, positional_embedding_type="rotary", use_attn_scale=True,
                  gated_mlp=True, final_rms=True, default_prepend_bos=False, device="cpu")
    if family == "gemma":
        return HookedTransformerConfig(**common, original_architecture="GemmaForCausalLM")
    return HookedTransformerConfig(
        **common, attn_scale=math.sqrt(GEMMA2["query_pre_attn_scalar"]), window_size=GEMMA2["sliding_window"],
        use_local_attn=True, attn_types=["local", "global"],
        attn_scores_soft_cap=GEMMA2["attn_logit_softcapping"],
        output_logits_soft_cap=GEMMA2["final_logit_softcapping"], use_normalization_before_and_after=True,
        original_architecture="Gemma2ForCausalLM")


@pytest.fixture(scope="module", params=["gemma", "gemma2"])
def pair(request, tmp_path_factory):
    """(blocklab's import of a random folder of the family, TransformerLens' model of the same weights)."""
    family = request.param
    torch.manual_seed(0)
    if family == "gemma":
        hf = transformers.GemmaForCausalLM(transformers.GemmaConfig(**SHAPE))
    else:
        hf = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(**SHAPE, **GEMMA2))
    with torch.no_grad():  # spread the weights, the norms' (1 + w) too
        for p in hf.parameters():
            p.normal_(0.0, 0.3) if p.dim() == 2 else p.add_(0.3 * torch.randn_like(p))
    folder = tmp_path_factory.mktemp(family)
    hf.eval().save_pretrained(str(folder))
    theirs = HookedTransformer(their_config(family))
    theirs.load_and_process_state_dict(convert_gemma_weights(hf, theirs.cfg), fold_ln=False,
                                       center_writing_weights=False, center_unembed=False,
                                       fold_value_biases=False)
    return bl.load(folder).model, theirs.eval(), family


def test_gemma_logits_and_every_transformerlens_hook_equal_hooked_transformers(pair):
    ours, theirs, family = pair
    tokens = torch.randint(1, 100, (2, 12), generator=torch.Generator().manual_seed(1))  # 12 > a window
    with torch.no_grad():
        logits, their_cache = theirs.run_with_cache(tokens)
        mine, our_cache = ours.run_with_cache(tokens)
    torch.testing.assert_close(mine, logits, rtol=0, atol=1e-4)
    if family == "gemma2":
        assert logits.abs().max() <= GEMMA2["final_logit_softcapping"]  # (the cap acts on these weights)
        assert their_cache["blocks.0.attn.hook_pattern"][0, :, -1, :6].abs().max() == 0  # layer 0 is local
    missing = sorted(set(their_cache) - set(our_cache.keys()))
    assert not missing, missing
    for name, want in their_cache.items():
        torch.testing.assert_close(our_cache[name], want, rtol=0, atol=2e-4, msg=name)
    if family == "gemma2":  # TransformerLens' unembed.hook_out is before its logit cap: blocklab's too
        assert not torch.allclose(our_cache["unembed.hook_out"], mine)
        cap = GEMMA2["final_logit_softcapping"]
        torch.testing.assert_close(torch.tanh(our_cache["head.uncapped"] / cap) * cap, mine)

        def halved(x, hook):  # an edit under TransformerLens' name: before the cap in both
            return x / 2

        with torch.no_grad():
            edited = ours.run_with_hooks(tokens, fwd_hooks=[("unembed.hook_out", halved)])
            torch.testing.assert_close(edited, theirs.run_with_hooks(tokens, fwd_hooks=[
                ("unembed.hook_out", halved)]), rtol=0, atol=1e-4)
        assert not torch.allclose(edited, mine)


def test_a_hook_under_each_transformerlens_name_receives_that_name_as_hook_name(pair):
    """TransformerLens code that dispatches on ``hook.name`` sees the name it hooked, on this model's own
    names too (Gemma 2's hook_attn_out is blocklab's ln1_out: its hook.name says hook_attn_out)."""
    ours, theirs, family = pair
    tokens = torch.randint(1, 100, (1, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        _, their_cache = theirs.run_with_cache(tokens)
        got: dict[str, str] = {}
        ours.run_with_hooks(tokens, fwd_hooks=[
            (name, lambda x, hook, name=name: got.update({name: hook.name})) for name in their_cache])
    assert got == {name: name for name in their_cache}
