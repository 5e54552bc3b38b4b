"""Mixtral and OLMoE (mixtures of experts) against TransformerLens' HookedTransformer with the same weights,
built by its own config reader (convert_hf_model_config on a local folder) and converters: logits and the
cache at every TransformerLens hook name (the router's choices as (B T, k), each expert's stages on its
tokens, OLMoE's QK-norm), hooks that reroute tokens or silence an expert, and the one name whose tensor
blocklab does not hold (hook_expert_weights, TransformerLens' softmax over all experts) refused by name."""

from __future__ import annotations

import pytest
import torch

import blocklab as bl

transformers = pytest.importorskip("transformers")
pytest.importorskip("transformer_lens")
from transformer_lens import HookedTransformer, HookedTransformerConfig  # noqa: E402
from transformer_lens.loading_from_pretrained import convert_hf_model_config  # noqa: E402
from transformer_lens.pretrained.weight_conversions import (  # noqa: E402
    convert_mixtral_weights,
    convert_olmoe_weights,
)

SHAPE = dict(vocab_size=100, hidden_size=32, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, num_experts_per_tok=2, pad_token_id=0)
FAMILIES = {  # name -> (transformers model, TransformerLens' converter)
    "mixtral": (lambda: transformers.MixtralForCausalLM(transformers.MixtralConfig(
        **SHAPE, num_local_experts=4)), convert_mixtral_weights),
    # OLMoE: softmax, top-k without renormalising (norm_topk_prob False), QK-norm over all heads
    "olmoe": (lambda: transformers.OlmoeForCausalLM(transformers.OlmoeConfig(**SHAPE, num_experts=4)),
              convert_olmoe_weights),
}
# TransformerLens' hook_expert_weights is softmax(router logits) over all E experts before top-k (B T, E);
# blocklab's expert_weights holds the k weights the chosen experts' outputs are multiplied by: refused.
# OLMoE's QK-norm hooks (before gamma, on rows reshaped by variant) are refused as on OLMo 2
# (test_transformerlens.py)
REFUSED = ("mlp.hook_expert_weights", "attn.q_norm.hook_scale", "attn.q_norm.hook_normalized",
           "attn.k_norm.hook_scale", "attn.k_norm.hook_normalized")


def _fused_experts(hf: torch.nn.Module) -> None:
    """TransformerLens 3.2's convert_olmoe_weights reads transformers 5's fused experts (gate_up_proj,
    down_proj); transformers 4's OLMoE keeps one module per expert: their weights stacked as it reads them."""
    for layer in hf.model.layers:
        experts = layer.mlp.experts
        if not hasattr(experts, "gate_up_proj"):
            experts.gate_up_proj = torch.stack([torch.cat([e.gate_proj.weight, e.up_proj.weight])
                                                for e in experts])  # (E, 2 d_ff, d)
            experts.down_proj = torch.stack([e.down_proj.weight for e in experts])  # (E, d, d_ff)


@pytest.fixture(scope="module", params=list(FAMILIES))
def pair(request, tmp_path_factory):
    """(blocklab's import of a random folder of the family, TransformerLens' model of the same weights,
    unprocessed, transformers' model)."""
    build, convert = FAMILIES[request.param]
    torch.manual_seed(0)
    hf = build().eval()
    with torch.no_grad():  # spread the weights, the norms' too
        for p in hf.parameters():
            p.normal_(0.0, 0.3) if p.dim() == 2 else p.add_(0.3 * torch.randn_like(p))
    folder = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(str(folder))
    cfg = HookedTransformerConfig.unwrap(convert_hf_model_config(str(folder)))
    cfg.dtype, cfg.tokenizer_name = torch.float32, None  # (its Mixtral is bfloat16; no tokenizer here)
    if request.param == "mixtral":
        # TransformerLens' reader leaves norm_topk_prob False for Mixtral, whose router renormalises its top
        # 2 weights (transformers' MixtralSparseMoeBlock, Mistral's reference): its logits are not
        # transformers' until set
        assert not cfg.norm_topk_prob
        cfg.norm_topk_prob = True
    else:
        _fused_experts(hf)
    theirs = HookedTransformer(cfg)
    theirs.load_and_process_state_dict(convert(hf, cfg), fold_ln=False, center_writing_weights=False,
                                       center_unembed=False, fold_value_biases=False)
    return bl.load(folder).model, theirs.eval(), hf


TOKENS = torch.randint(1, 100, (2, 9), generator=torch.Generator().manual_seed(1))


def test_mixtures_logits_and_every_transformerlens_hook_equal_hooked_transformers(pair):
    ours, theirs, hf = pair
    with torch.no_grad():
        logits, their_cache = theirs.run_with_cache(TOKENS)
        mine, our_cache = ours.run_with_cache(TOKENS)
        torch.testing.assert_close(mine, hf(TOKENS).logits, rtol=0, atol=1e-4)
    torch.testing.assert_close(mine, logits, rtol=0, atol=1e-4)
    refused = {name for name in their_cache if name.split(".", 2)[-1] in REFUSED}
    assert {n for n in refused if "expert_weights" in n} == {f"blocks.{i}.mlp.hook_expert_weights"
                                                             for i in range(2)}  # (the refusal matters)
    missing = sorted(set(their_cache) - set(our_cache.keys()) - refused)
    assert not missing, missing
    routes = their_cache["blocks.1.mlp.hook_expert_indices"]  # (B T, k)
    assert routes.shape == (18, 2) and len(set(routes[:, 0].tolist())) > 1  # tokens go different ways
    assert {their_cache[f"blocks.1.mlp.experts.{e}.hook_post"].shape[0] for e in range(4)} != {9}
    for name, want in their_cache.items():
        if name in refused:
            with pytest.raises(KeyError, match=rf"'{name}' \(TransformerLens\) has no blocklab stage"):
                our_cache[name]
            continue
        # an expert's rows: its tokens, those that chose it first then second, as TransformerLens' (and
        # transformers') loop gives them
        torch.testing.assert_close(our_cache[name], want, rtol=0, atol=2e-4, msg=name)


def test_hooks_rerouting_tokens_or_silencing_an_expert_edit_what_transformerlens_edits(pair):
    """A hook under TransformerLens' names changes both models alike: each token sent to the next expert
    (received and returned as (B T, k)), or one expert's activation zeroed on its tokens."""
    ours, theirs, _ = pair

    def next_expert(indices, hook):  # (B T, k)
        return (indices + 1) % 4

    names = []

    def silence(post, hook):  # (N_e, d_ff)
        names.append(hook.name)
        return torch.zeros_like(post)

    with torch.no_grad():
        busiest = theirs.run_with_cache(TOKENS)[1]["blocks.1.mlp.hook_expert_indices"].flatten().mode().values
    for name, fn in (("blocks.0.mlp.hook_expert_indices", next_expert),
                     (f"blocks.1.mlp.experts.{busiest}.hook_post", silence)):
        with torch.no_grad():
            got = ours.run_with_hooks(TOKENS, fwd_hooks=[(name, fn)])
            want = theirs.run_with_hooks(TOKENS, fwd_hooks=[(name, fn)])
            assert (want - theirs(TOKENS)).abs().max() > 1e-2, name  # (the edit changes the logits)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-4, msg=name)
    assert names == [f"blocks.1.mlp.experts.{busiest}.hook_post"] * 2  # hook.name as TransformerLens gives it


def test_transformerlens_softmax_over_all_experts_is_refused_by_name_wherever_it_is_written(pair):
    ours, _, _ = pair
    refusal = r"'blocks.0.mlp.hook_expert_weights' \(TransformerLens\) has no blocklab stage: .*softmax"
    with pytest.raises(ValueError, match=refusal):
        ours.run_with_cache(TOKENS, names_filter="blocks.0.mlp.hook_expert_weights")
    with pytest.raises(ValueError, match=refusal):
        ours.run_with_hooks(TOKENS, fwd_hooks=[("blocks.0.mlp.hook_expert_weights", lambda x, hook: x)])
    with pytest.raises(KeyError, match=refusal):
        ours.hook_dict["blocks.0.mlp.hook_expert_weights"]
