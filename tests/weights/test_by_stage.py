"""Weights named by stage (blocklab/weights/by_stage.py): a file a learner writes lands in the parameters the
names say (checked against the modules' own tensors, named here by hand), and every entry that does not
fit is refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import blocklab as bl
from blocklab.cli import main
from blocklab.weights.by_stage import read_weights_file, set_weights_by_stage, weights_by_stage

SENTENCE = "<BOS> I like transformers <EOS>"


def tutorial_model() -> bl.Transformer:
    return bl.Transformer(bl.preset("tutorial"))


def hand_weights(seed: int = 1) -> dict[str, torch.Tensor]:
    """Every entry of the tutorial model by stage, drawn here; attention per head."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)
    w = {"embedding": r(6, 16), "W_vocab": r(6, 16), "blocks.0.attn.bo": r(16),
         "blocks.0.ffn.W1": r(64, 16), "blocks.0.ffn.b1": r(64), "blocks.0.ffn.W2": r(16, 64),
         "blocks.0.ffn.b2": r(16)}
    for m in "qkv":
        for h in range(2):
            w[f"blocks.0.attn.W{m}.h{h}"], w[f"blocks.0.attn.b{m}.h{h}"] = r(8, 16), r(8)
    for h in range(2):
        w[f"blocks.0.attn.Wo.h{h}"] = r(16, 8)
    for ln in ("ln1", "ln2"):
        w[f"blocks.0.{ln}.gamma"], w[f"blocks.0.{ln}.beta"] = r(16), r(16)
    return w


def test_a_json_file_named_by_stage_lands_in_the_parameters_it_names(tmp_path: Path) -> None:
    w = hand_weights()
    path = tmp_path / "w.json"
    path.write_text(json.dumps({k: v.tolist() for k, v in w.items()}))
    model = tutorial_model()
    set_weights_by_stage(model, read_weights_file(path))
    sd = {k: v.double() for k, v in model.state_dict().items()}
    f32 = lambda t: t.float().double()  # the model holds float32
    assert torch.equal(sd["embed.weight"], f32(w["embedding"]))
    assert torch.equal(sd["head.weight"], f32(w["W_vocab"]))
    for m in "qkv":  # head h is rows h*8 .. h*8+7 of the (16, 16) matrix
        assert torch.equal(sd[f"blocks.0.attn.{m}.weight"][8:], f32(w[f"blocks.0.attn.W{m}.h1"]))
        assert torch.equal(sd[f"blocks.0.attn.{m}.bias"][:8], f32(w[f"blocks.0.attn.b{m}.h0"]))
    assert torch.equal(sd["blocks.0.attn.o.weight"][:, 8:], f32(w["blocks.0.attn.Wo.h1"]))  # head 1's columns
    assert torch.equal(sd["blocks.0.ffn.w2.weight"], f32(w["blocks.0.ffn.W2"]))
    assert torch.equal(sd["blocks.0.ln2.bias"], f32(w["blocks.0.ln2.beta"]))
    assert torch.equal(sd["blocks.0.ln1.weight"], f32(w["blocks.0.ln1.gamma"]))


def test_whole_matrices_and_safetensors_are_read_alike(tmp_path: Path) -> None:
    w = hand_weights()
    whole = {k: v for k, v in w.items() if ".h" not in k}
    for m in "qkv":
        whole[f"blocks.0.attn.W{m}"] = torch.cat([w[f"blocks.0.attn.W{m}.h0"], w[f"blocks.0.attn.W{m}.h1"]])
        whole[f"blocks.0.attn.b{m}"] = torch.cat([w[f"blocks.0.attn.b{m}.h0"], w[f"blocks.0.attn.b{m}.h1"]])
    whole["blocks.0.attn.Wo"] = torch.cat([w["blocks.0.attn.Wo.h0"], w["blocks.0.attn.Wo.h1"]], dim=1)
    save_file({k: v.contiguous() for k, v in whole.items()}, tmp_path / "w.safetensors")
    a, b = tutorial_model(), tutorial_model()
    set_weights_by_stage(a, read_weights_file(tmp_path / "w.safetensors"))
    set_weights_by_stage(b, w)
    for (k, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(x, y), k


def test_written_weights_are_the_models_parameters_one_head_per_entry(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    assert main(["trace", "--preset", "tutorial", "--seed", "3", "--input", SENTENCE,
                 "--write-weights", str(out), "--quiet"]) == 0
    written = json.loads(out.read_text())
    torch.manual_seed(3)
    sd = bl.Transformer(bl.preset("tutorial")).state_dict()
    assert written["blocks.0.attn.Wk.h1"] == sd["blocks.0.attn.k.weight"][8:].double().tolist()
    assert written["blocks.0.attn.Wo.h0"] == sd["blocks.0.attn.o.weight"][:, :8].double().tolist()
    assert written["blocks.0.ffn.b1"] == sd["blocks.0.ffn.w1.bias"].double().tolist()
    assert written["blocks.0.ln2.gamma"] == sd["blocks.0.ln2.weight"].double().tolist()
    assert len(written) == 25  # 6 per-head q/k/v entries x 2 heads, 2 Wo heads, bo, 4 FFN, 4 norm, E, W_vocab
    assert "positions" not in written  # sinusoidal: no weights


@pytest.mark.parametrize(("change", "message"), [
    (lambda w: w.pop("blocks.0.ffn.b1"), "missing blocks.0.ffn.b1"),
    (lambda w: w.pop("blocks.0.attn.Wq.h1"), "missing blocks.0.attn.Wq.h1"),
    (lambda w: w.__setitem__("blocks.0.ffn.W1", w["blocks.0.ffn.W1"].T),
     "blocks.0.ffn.W1 is (16, 64), expected (64, 16) (that is the transpose: matrices are (out, in)"),
    (lambda w: w.__setitem__("blocks.0.ln1.gamma", torch.ones(1, 16)),
     "blocks.0.ln1.gamma is (1, 16), expected (16,)"),
    (lambda w: w.__setitem__("blocks.0.attn.Wk.h0", torch.ones(8, 4)),
     "blocks.0.attn.Wk.h0 is (8, 4), expected (8, 16)"),
    (lambda w: w.__setitem__("positions", torch.ones(5, 16)),
     "unknown entry positions (the positions are the fixed sinusoidal code, no weights)"),
    (lambda w: w.__setitem__("blocks.0.attn.Wv.h2", torch.ones(8, 16)),
     "blocks.0.attn.Wv.h2 is no head: the model has heads h0..h1"),
    (lambda w: w.__setitem__("blocks.0.attn.Wq", torch.ones(16, 16)),
     "blocks.0.attn.Wq is given both whole and per head"),
    (lambda w: w.__setitem__("blocks.1.ffn.W1", torch.ones(64, 16)), "unknown entry blocks.1.ffn.W1"),
    (lambda w: w.__setitem__("blocks.0.ffn.b2", torch.full((16,), float("nan"))),
     "blocks.0.ffn.b2 holds a value that is not finite"),
])
def test_an_entry_that_does_not_fit_is_refused_by_name(change, message: str) -> None:
    w = hand_weights()
    change(w)
    model = tutorial_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="do not fit the model") as e:
        set_weights_by_stage(model, w)
    assert message in str(e.value)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # nothing copied


@pytest.mark.parametrize(("text", "message"), [
    ('{"embedding": [[1, 2], [3]]}', "entry embedding is not a number or a rectangular array of numbers"),
    ('{"embedding": "ones"}', "entry embedding is not a number or a rectangular array of numbers"),
    ("[1, 2]", "a weights file holds one JSON object"),
    ("{", "not valid JSON"),
    ('{"embedding": ' + "[" * 100_000 + "]" * 100_000 + "}", "JSON nested deeper than"),  # not a crash
    ('{"embedding": [NaN]}', "not valid JSON"),  # strict JSON: no NaN or Infinity
])
def test_a_malformed_json_file_is_refused_naming_the_entry(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "w.json"
    path.write_text(text)
    with pytest.raises(ValueError, match="w.json") as e:
        read_weights_file(path)
    assert message in str(e.value)


def test_the_cli_refuses_a_bad_file_in_one_line(tmp_path: Path, capsys) -> None:
    w = {k: v.tolist() for k, v in hand_weights().items()}
    del w["W_vocab"]
    (tmp_path / "w.json").write_text(json.dumps(w))
    assert main(["trace", "--preset", "tutorial", "--input", SENTENCE, "--weights",
                 str(tmp_path / "w.json")]) == 2
    err = capsys.readouterr().err
    assert "missing W_vocab" in err and err.count("\n") == 1


def test_weights_from_a_file_replace_the_random_note(tmp_path: Path, capsys) -> None:
    path = tmp_path / "w.json"
    path.write_text(json.dumps({k: v.tolist() for k, v in hand_weights().items()}))
    assert main(["trace", "--preset", "tutorial", "--input", SENTENCE, "--weights", str(path),
                 "--stages", "logits"]) == 0
    out = capsys.readouterr().out
    assert f"weights from {path}" in out and "random" not in out


def test_per_head_names_follow_grouped_query_heads() -> None:
    model = bl.Transformer(bl.preset("llama-seed"))  # 4 query heads, 2 key/value heads of d_k 16
    names = weights_by_stage(model)
    assert {k for k in names if k.startswith("blocks.0.attn.Wk")} == {"blocks.0.attn.Wk.h0",
                                                                      "blocks.0.attn.Wk.h1"}
    assert names["blocks.0.attn.Wq.h3"].shape == (16, 64) and "blocks.0.ffn.W3" in names
    assert torch.equal(names["blocks.0.attn.Wv.h1"], model.blocks[0].attn.v.weight[16:].double())
