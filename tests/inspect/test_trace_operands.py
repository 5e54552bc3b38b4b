"""Tests for blocklab.inspect.trace.operands: each hover formula's operands against plain torch over the
model's own weights (LayerNorm, x @ W.T + b, silu written out here), never the tracer's code run twice."""

from __future__ import annotations

import json

import jsonschema
import torch

import blocklab as bl
from blocklab.inspect.trace import SCHEMA_PATH, collect_trace, trace_to_dict
from blocklab.inspect.trace.operands import TERMS
from blocklab.tasks import get_task

TOKENIZER = get_task("listops").tokenizer
IDS = TOKENIZER.encode("Max ( 1 , 6 , 2 )")
VALIDATOR = jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))


def model(**fields: object) -> bl.Transformer:
    torch.manual_seed(0)
    return bl.Transformer(bl.preset("listops-seed", **fields)).eval()


def layer_norm(x: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
    """LayerNorm written out in float64 with the module's gamma, beta and eps."""
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + norm.eps) * norm.weight.double() + norm.bias.double()


def check_dot(operands: object, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
              values: torch.Tensor) -> None:
    """Every number of a dot stage: its shown terms are x_i W[j, i] at the largest |x_i W[j, i]| (from
    ``x`` (P, n) and ``weight`` (F, n), computed here), and terms + rest + bias give ``values`` (P, F)."""
    columns = operands.columns or list(range(weight.shape[0]))
    terms = x[:, None, :] * weight[columns][None]  # (P, C, n)
    top = terms.abs().topk(TERMS, dim=-1).indices
    assert torch.equal(operands.index, top)
    torch.testing.assert_close(operands.x, x[:, None, :].expand_as(terms).gather(-1, top), rtol=0, atol=1e-6)
    torch.testing.assert_close(operands.w, weight[columns][None].expand_as(terms).gather(-1, top),
                               rtol=0, atol=0)
    b = bias[columns] if bias is not None else torch.zeros(len(columns), dtype=torch.float64)
    total = (operands.x * operands.w).sum(-1) + operands.rest + b
    torch.testing.assert_close(total, values[:, columns], rtol=0, atol=1e-5)  # the float32 forward's error
    torch.testing.assert_close(total, (x @ weight.T + (bias if bias is not None else 0))[:, columns],
                               rtol=0, atol=1e-5)
    assert operands.n == x.shape[1]


def test_q_k_v_are_the_normed_input_times_their_weights_plus_bias() -> None:
    m = model(norm_position="pre")
    trace = collect_trace(m, IDS)
    with torch.no_grad():
        _, cache = m.run_with_cache(torch.tensor([IDS]), names="blocks.0.resid_pre")
    attn = m.blocks[0].attn
    x = layer_norm(cache["blocks.0.resid_pre"][0].double(), m.blocks[0].ln1)  # the attention's input
    for letter in "qkv":
        stage = trace.stage(f"blocks.0.attn.{letter}")
        o = stage.operands
        assert (o.kind, o.reads, o.weight, o.bias) == ("dot", ["blocks.0.ln1"], f"W{letter}", f"b{letter}")
        linear = getattr(attn, letter)
        check_dot(o, x, linear.weight.detach().double(), linear.bias.detach().double(), stage.rows)
    record = trace_to_dict(trace)
    VALIDATOR.validate(record)
    q = next(s for s in record["stages"] if s["name"] == "blocks.0.attn.q")["operands"]
    assert q["columns"] is None and len(q["index"][7][5]) == TERMS and len(q["bias_values"]) == 64


def test_post_norm_q_reads_the_residual_stream_and_logits_read_the_final_norm() -> None:
    m = model()  # post-norm: attention reads resid_pre; no final norm (ln_f passes the stream through)
    trace = collect_trace(m, IDS)
    with torch.no_grad():
        _, cache = m.run_with_cache(torch.tensor([IDS]), names=["blocks.1.resid_pre", "ln_f"])
    q = trace.stage("blocks.1.attn.q")
    assert q.operands.reads == ["blocks.1.resid_pre"]
    attn = m.blocks[1].attn
    check_dot(q.operands, cache["blocks.1.resid_pre"][0].double(), attn.q.weight.detach().double(),
              attn.q.bias.detach().double(), q.rows)
    logits = trace.stage("logits")
    assert (logits.operands.reads, logits.operands.weight, logits.operands.bias) == (["ln_f"], "W_vocab", "")
    assert logits.operands.bias_values is None
    check_dot(logits.operands, cache["ln_f"][0].double(), m.head.weight.detach().double(), None, logits.rows)


def test_a_vocabulary_wider_than_a_page_has_operands_for_the_columns_shown() -> None:
    torch.manual_seed(0)
    m = bl.Transformer(bl.ModelConfig(vocab_size=700, max_seq_len=8, d_model=16, n_heads=2, n_layers=1,
                                      d_ff=24, norm_position="pre")).eval()
    trace = collect_trace(m, [5, 6, 7], names="logits")
    logits = trace.stage("logits")
    o = logits.operands
    assert o.columns == logits.rows[-1].topk(512).indices.tolist()  # the page's 512 largest, in order
    with torch.no_grad():
        _, cache = m.run_with_cache(torch.tensor([[5, 6, 7]]), names="ln_f")
    check_dot(o, cache["ln_f"][0].double(), m.head.weight.detach().double(), None, logits.rows)
    VALIDATOR.validate(trace_to_dict(trace))


def test_a_gated_activation_is_silu_of_the_hidden_stage_times_the_linear_branch() -> None:
    m = model(norm_position="pre", activation="swiglu")
    trace = collect_trace(m, IDS, names="blocks.0.ffn.act")  # hidden and linear not shown: still read
    act = trace.stage("blocks.0.ffn.act")
    o = act.operands
    assert (o.kind, o.reads, o.function) == ("gated", ["blocks.0.ffn.hidden", "blocks.0.ffn.linear"], "silu")
    with torch.no_grad():
        _, cache = m.run_with_cache(torch.tensor([IDS]), names="blocks.0.ln2")
    ffn = m.blocks[0].ffn
    x = cache["blocks.0.ln2"][0].double()
    h1 = x @ ffn.w1.weight.double().T + ffn.w1.bias.double()
    h3 = x @ ffn.w3.weight.double().T + ffn.w3.bias.double()
    gate = h1 * torch.sigmoid(h1)  # silu written out
    torch.testing.assert_close(o.gate, gate, rtol=0, atol=1e-5)
    torch.testing.assert_close(o.gate * h3, act.rows, rtol=0, atol=1e-5)
    VALIDATOR.validate(trace_to_dict(trace))


def test_sums_name_the_layouts_operands_and_other_formulas_their_stages() -> None:
    parallel = collect_trace(model(norm_position="parallel"), IDS)
    assert parallel.stage("blocks.0.resid_post").operands.reads == [
        "blocks.0.resid_pre", "blocks.0.attn.out", "blocks.0.ffn.out"]  # x + MHA(LN1(x)) + FFN(LN2(x))
    post = collect_trace(model(), IDS)
    assert post.stage("blocks.0.resid_post").operands.reads == ["blocks.0.ln1", "blocks.0.ffn.out"]
    act = post.stage("blocks.0.ffn.act").operands
    assert (act.kind, act.reads, act.function) == ("act", ["blocks.0.ffn.hidden"], "relu")
    weights = post.stage("blocks.0.attn.weights").operands
    assert (weights.kind, weights.reads) == ("softmax", ["blocks.0.attn.scores"])
    rezero = collect_trace(model(residual="rezero", norm="none"), IDS)  # x + a F(x): no plain sum to show
    assert rezero.stage("blocks.0.resid_mid").operands is None
    assert post.stage("blocks.0.ln1").operands is None  # a norm's numbers are its own (Stage.norm)
