"""The decode step's packed weights (nn/packed.py): the values of each packed matmul, when packing applies,
that no packed copy is ever stale, and what the copies cost.

Oracles: ``F.linear`` over the concatenated weights in float64 for each packed matmul; ``transformers``'
GPT-2 with the same edits for the tokens after a weight changed; the weight shapes for the bytes.
"""

from __future__ import annotations

import copy
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may come from a hub

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from blocklab.nn.generate import GenerationConfig, generate
from blocklab.nn.packed import packed_bytes, packed_decoding, packed_linear, packing, release_packed
from blocklab.weights import load_pretrained

transformers = pytest.importorskip("transformers")

VOCAB, EOS, D, D_FF, LAYERS = 61, 60, 32, 128, 2


SHAPES = [((96,), 32), ((32, 8, 8), 32), ((64, 64), 32), ((16,), 64), ((8, 8), 48)]  # (outputs, input)


@pytest.mark.parametrize("outs, d_in", SHAPES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_packed_matmul_equals_f_linear_over_the_concatenated_weights(outs, d_in, bias, dtype):
    """Wider outputs than inputs are transposed, narrower kept: either way x @ cat(W).T + cat(b)."""
    g = torch.Generator().manual_seed(len(outs) + d_in)
    weights = [torch.randn(n, d_in, generator=g, dtype=dtype) for n in outs]
    biases = [torch.randn(n, generator=g, dtype=dtype) for n in outs] if bias else []
    x = torch.randn(1, 1, d_in, generator=g, dtype=dtype)
    owner = nn.Module()
    with torch.no_grad():
        ours = packed_linear(owner, "w", x, weights, biases)
    expected = F.linear(x.double(), torch.cat(weights).double(), torch.cat(biases).double() if bias else None)
    assert ours.shape == (1, 1, sum(outs)) and ours.dtype == dtype
    atol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(ours.double(), expected, rtol=0, atol=atol)


def test_biases_are_one_per_weight_or_none():
    with pytest.raises(ValueError, match="1 biases for 2 weights"):
        packed_linear(nn.Module(), "w", torch.ones(1, 4), [torch.ones(4, 4)] * 2, [torch.ones(4), None])


def test_packing_applies_to_one_row_without_autograd_inside_the_context_and_without_torch_hooks():
    one, two, linear = torch.ones(1, 1, 8), torch.ones(2, 1, 8), nn.Linear(8, 8)
    assert not packing(one)  # outside packed_decoding
    with packed_decoding():
        assert not packing(one)  # autograd records here
        with torch.no_grad():
            assert packing(one, linear) and not packing(two, linear)
            handle = linear.register_forward_hook(lambda *args: None)
            assert not packing(one, linear)  # the packed matmul would not call the hook
            handle.remove()
            with packed_decoding(False):
                assert not packing(one)
            assert packing(one)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=40, n_embd=D, n_layer=LAYERS, n_head=4,
                                     n_inner=D_FF, bos_token_id=EOS, eos_token_id=EOS)
    hf = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.25) if p.dim() == 2 else p.add_(0.1 * torch.randn_like(p))
    folder = tmp_path_factory.mktemp("gpt2")
    hf.save_pretrained(str(folder))
    return hf, load_pretrained(folder)[0]


def hf_generate(hf, prompt, new):
    with torch.no_grad():
        return hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, eos_token_id=None,
                           pad_token_id=EOS, max_new_tokens=new)


def _in_place(model, hf, g):  # Wq: the parameter's version counter moves
    dq = 0.5 * torch.randn(D, D, generator=g)
    model.blocks[0].attn.q.weight += dq
    hf.transformer.h[0].attn.c_attn.weight[:, :D] += dq.T  # Conv1D: (in, out), q's columns first


def _replaced(model, hf, g):  # W1: a new tensor behind the parameter
    dw = 0.5 * torch.randn(D_FF, D, generator=g)
    model.blocks[1].ffn.w1.weight.data = model.blocks[1].ffn.w1.weight.data + dw
    hf.transformer.h[1].mlp.c_fc.weight += dw.T


def _loaded(model, hf, g):  # every weight through load_state_dict, from transformers' edited model
    for p in hf.parameters():
        p.add_(0.2 * torch.randn(p.shape, generator=g))
    model.load_state_dict(load_state(hf))


def _tied_embedding(model, hf, g):  # the head's packed copy follows the embedding it is tied to
    de = 0.5 * torch.randn(VOCAB, D, generator=g)
    model.embed.weight += de
    hf.transformer.wte.weight += de


def _bias(model, hf, g):  # bv: packed in cat(bq, bk, bv), a copy
    db = torch.randn(D, generator=g)
    model.blocks[1].attn.v.bias += db
    hf.transformer.h[1].attn.c_attn.bias[2 * D:] += db


def load_state(hf):
    """blocklab's state dict of transformers' model, through a folder as a user would."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        hf.save_pretrained(folder)
        return load_pretrained(folder)[0].state_dict()


@pytest.mark.parametrize("edit", [_in_place, _replaced, _loaded, _tied_embedding, _bias],
                         ids=lambda f: f.__name__.strip("_"))
def test_a_weight_changed_after_a_packed_generation_is_what_the_next_one_uses(gpt2, edit):
    """However a weight changes after a first batch-1 generation (which packs), the next one gives
    transformers' tokens under the same change, and other tokens than before."""
    hf, model = copy.deepcopy(gpt2[0]), copy.deepcopy(gpt2[1])
    prompt = torch.randint(0, EOS, (1, 5), generator=torch.Generator().manual_seed(3))
    before = generate(model, prompt, max_new_tokens=12)
    assert torch.equal(before, hf_generate(hf, prompt, 12)) and packed_bytes(model) > 0
    with torch.no_grad():
        edit(model, hf, torch.Generator().manual_seed(4))
    after = generate(model, prompt, max_new_tokens=12)
    assert torch.equal(after, hf_generate(hf, prompt, 12))
    assert not torch.equal(after, before)


def test_the_copies_cost_the_widening_matrices_and_the_head_and_are_released(gpt2):
    """Packed: q|k|v (3d x d), Wo (d x d), W1 (d_ff x d) per layer and the head (V x d); W2 (d x d_ff,
    narrower out than in) is read as it is, no copy."""
    model = copy.deepcopy(gpt2[1])
    prompt = torch.randint(0, EOS, (1, 5), generator=torch.Generator().manual_seed(5))
    generate(model, prompt, max_new_tokens=3, pack_weights=False)
    assert packed_bytes(model) == 0
    generate(model, prompt, max_new_tokens=3)
    expected = 4 * (LAYERS * (3 * D * D + D * D + D_FF * D) + VOCAB * D)  # float32
    assert packed_bytes(model) == expected
    generate(model, prompt, max_new_tokens=3)
    assert packed_bytes(model) == expected  # kept, not packed again beside the first copies
    assert release_packed(model) == expected and packed_bytes(model) == 0


def test_a_torch_hook_on_a_projection_still_runs_at_every_step(gpt2):
    hf, model = gpt2[0], copy.deepcopy(gpt2[1])
    calls = []
    model.blocks[0].attn.q.register_forward_hook(lambda module, args, out: calls.append(out.shape))
    prompt = torch.randint(0, EOS, (1, 5), generator=torch.Generator().manual_seed(6))
    assert torch.equal(generate(model, prompt, max_new_tokens=6), hf_generate(hf, prompt, 6))
    assert calls == [(1, 5, D)] + [(1, 1, D)] * 5  # the prompt, then each one-token step


def test_pack_weights_must_be_true_or_false():
    with pytest.raises(ValueError, match=r"pack_weights='no' must be true or false"):
        GenerationConfig(pack_weights="no")
