"""BERT against TransformerLens' HookedEncoder with the same weights (its convert_bert_weights of a
BertForPreTraining; the config written as its reader writes BertForMaskedLM's, which it reads for every BERT):
the cache at every HookedEncoder hook name, a hook on a head, and the names of its MLM head refused by name
(blocklab loads BERT's encoder alone, BertModel, whose logits are the tied head on the final hidden state)."""

from __future__ import annotations

import pytest
import torch

import blocklab as bl

transformers = pytest.importorskip("transformers")
pytest.importorskip("transformer_lens")
from transformer_lens import HookedEncoder, HookedTransformerConfig  # noqa: E402
from transformer_lens.pretrained.weight_conversions import convert_bert_weights  # noqa: E402

TOKENS = torch.randint(1, 100, (2, 9), generator=torch.Generator().manual_seed(1))
LAST = "blocks.1.hook_normalized_resid_post"  # HookedEncoder's final hidden state (post-norm blocks)
# HookedEncoder's names for its MLM head (dense, GELU, LayerNorm, the unembedding with its bias) and the
# segment embedding: no blocklab stage holds these tensors
NO_STAGE = "has no blocklab stage"
ANOTHER = r"is another tensor on this model \(TransformerLens' HookedEncoder\)"
REFUSED = {"embed.hook_token_type_embed": NO_STAGE, "mlm_head.ln.hook_scale": NO_STAGE,
           "mlm_head.ln.hook_normalized": NO_STAGE, "unembed.hook_in": ANOTHER, "unembed.hook_out": ANOTHER}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(blocklab's import of a random BERT encoder, HookedEncoder of the same weights with an MLM head,
    transformers' encoder)."""
    torch.manual_seed(0)
    hf = transformers.BertForPreTraining(transformers.BertConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=64)).eval()
    with torch.no_grad():  # spread the weights, the norms' too
        for p in hf.parameters():
            p.normal_(0.0, 0.3) if p.dim() == 2 else p.add_(0.3 * torch.randn_like(p))
    folder = tmp_path_factory.mktemp("bert")
    hf.bert.save_pretrained(str(folder))
    cfg = HookedTransformerConfig(d_model=32, d_head=8, n_heads=4, d_mlp=64, n_layers=2, n_ctx=64, eps=1e-12,
                                  d_vocab=100, act_fn="gelu", attention_dir="bidirectional",
                                  original_architecture="BertForMaskedLM", device="cpu")
    theirs = HookedEncoder(cfg)
    theirs.load_state_dict(convert_bert_weights(hf, cfg), strict=False)  # (its NSP head and pooler unused)
    return bl.load(folder).model, theirs.eval(), hf.bert


def test_every_hooked_encoder_name_holds_blocklabs_tensor_or_is_refused_by_name(pair):
    ours, theirs, hf = pair
    with torch.no_grad():
        logits, their_cache = theirs.run_with_cache(TOKENS)
        mine, our_cache = ours.run_with_cache(TOKENS)
        hidden = hf(TOKENS).last_hidden_state
    torch.testing.assert_close(their_cache[LAST], hidden, rtol=0, atol=1e-4)  # (TransformerLens as BERT)
    torch.testing.assert_close(mine, hidden @ hf.embeddings.word_embeddings.weight.T, rtol=0, atol=1e-4)
    assert (mine - logits).abs().max() > 1  # another head: its logits are not blocklab's
    assert set(REFUSED) <= set(their_cache)
    missing = sorted(set(their_cache) - set(our_cache.keys()) - set(REFUSED))
    assert not missing, missing
    for name, want in their_cache.items():
        if name in REFUSED:
            with pytest.raises(KeyError, match=rf"'{name}' \(TransformerLens\) {REFUSED[name]}"):
                our_cache[name]
            continue
        torch.testing.assert_close(our_cache[name], want, rtol=0, atol=2e-4, msg=name)


def test_a_hook_on_a_head_edits_the_final_hidden_state_as_in_hooked_encoder(pair):
    ours, theirs, _ = pair

    def zero_head_1(v, hook):  # (B, T, heads, d_head) under TransformerLens' names
        v[:, :, 1] = 0.0
        return v

    hooks = [("blocks.0.attn.hook_v", zero_head_1)]
    with torch.no_grad(), theirs.hooks(fwd_hooks=hooks), ours.hooks(fwd_hooks=hooks):
        want = theirs.run_with_cache(TOKENS, names_filter=LAST)[1][LAST]
        got = ours.run_with_cache(TOKENS, names_filter=LAST)[1][LAST]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    assert (got - ours.run_with_cache(TOKENS, names_filter=LAST)[1][LAST]).abs().max() > 1e-2


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_the_mlm_heads_names_are_refused_by_hooks_and_filters(pair, name):
    ours, _, _ = pair
    with pytest.raises(ValueError, match=rf"'{name}' \(TransformerLens\) {REFUSED[name]}"):
        ours.run_with_cache(TOKENS, names_filter=name)
    with pytest.raises(ValueError, match=rf"'{name}' \(TransformerLens\) {REFUSED[name]}"):
        ours.run_with_hooks(TOKENS, fwd_hooks=[(name, lambda x, hook: x)])
