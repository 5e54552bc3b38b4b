"""Hugging Face tokenizers as blocklab reads them: every field checked before use, and nothing the
``tokenizers`` library raises (a Rust panic included) escaping as a traceback.

The hazards are shown on the library itself first (a real ``tokenizers`` pipeline panics), then
blocklab's answer: one line naming the file or the input, exit 2.
"""

from __future__ import annotations

import json

import pytest

from blocklab import ModelConfig, Transformer
from blocklab.cli import main
from blocklab.training.checkpoint import save_checkpoint
from blocklab.weights.hf_tokenizer import KIND, HFTokenizer
from blocklab.weights.tokenizer_regex import risky_repeat

tokenizers = pytest.importorskip("tokenizers")

BLOWUP = "a" * 28 + "c"  # (a+)+b against it: exponential backtracking, the engine's retry limit


def split_tokenizer(regex: str) -> tokenizers.Tokenizer:
    """A word-level tokenizer whose pre-tokenizer splits on ``regex`` (the shape of F1's tokenizer.json)."""
    from tokenizers import Regex, models, pre_tokenizers

    vocab = {"[UNK]": 0, "a": 1, "b": 2, "c": 3, "<|endoftext|>": 4}
    tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(regex), "isolated")
    return tok


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("blocklab: error: "), err
    assert "Traceback" not in err and "panicked" not in err
    return lines[0]


def test_the_nested_repeat_regex_panics_in_the_tokenizers_library_itself():
    """The hazard is real: the library raises a BaseException that is not an Exception."""
    with pytest.raises(BaseException) as raised:
        split_tokenizer("(a+)+b").encode(BLOWUP)
    assert not isinstance(raised.value, Exception)
    assert "retry-limit" in str(raised.value) or "Onig" in str(raised.value)


def test_import_refuses_a_split_regex_with_nested_repeats_in_one_line(tiny_gpt2_folder, tmp_path, capsys):
    folder, _ = tiny_gpt2_folder
    (folder / "tokenizer.json").write_text(split_tokenizer("(a+)+b").to_str())
    assert main(["import", str(folder), "--out", str(tmp_path / "m.safetensors")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "tokenizer.json" in line and "(a+)+b" in line and "exponential" in line
    assert not (tmp_path / "m.safetensors").exists()


@pytest.mark.parametrize("regex, nested", [
    ("(a+)+b", "(a+)+"), ("(?:x*y?)*", "(?:x*y?)*"), (r"(\w{2,})+$", r"(\w{2,})+"),
    ("((ab)+c){3}", "((ab)+c){3}"), ("(a|aa)+b", "(a|aa)+"), ("x(?:a|a)*", "(?:a|a)*"),
])
def test_repeated_groups_holding_repeats_or_alternatives_are_found(regex, nested):
    assert risky_repeat(regex) == nested


@pytest.mark.parametrize("regex", [
    # GPT-2's, Llama 3's and Qwen2's pre-tokenizer regexes: linear, and loaded
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+",
    r"(?:ab)+", r"(a)+", r"(a+)?", r"(a{1})+", r"[(a+)]+", r"\(a+\)+",
])
def test_regexes_without_nested_repeats_pass(regex):
    assert risky_repeat(regex) is None


@pytest.mark.parametrize("regex", ["(a+)+b", "(a|a)+b"])
def test_the_load_check_refuses_every_regex_seen_to_panic(regex):
    with pytest.raises(BaseException) as raised:  # each panics in the library itself
        split_tokenizer(regex).encode(BLOWUP)
    assert type(raised.value).__name__ == "PanicException"
    with pytest.raises(ValueError, match="exponentially"):
        HFTokenizer(split_tokenizer(regex).to_str())


def test_a_panic_inside_the_tokenizers_library_is_a_value_error_naming_the_input():
    """The second guard, for a shape the load check does not know: a panic while encoding (here from a
    pipeline put in place after the load check) is a ValueError naming the input, never a BaseException."""
    ours = HFTokenizer(split_tokenizer(r"\s+").to_str())
    ours._tok = split_tokenizer("(a|a)+b")
    with pytest.raises(ValueError, match=f"the tokenizer failed on the input '{BLOWUP}' .*PanicException"):
        ours.encode(BLOWUP)
    with pytest.raises(ValueError, match="the tokenizer failed on the inputs"):
        ours.encode_batch([BLOWUP])


@pytest.mark.parametrize("value", [5, ["<|endoftext|>"], {"content": "<|endoftext|>"}])
def test_a_checkpoint_whose_special_token_is_not_text_is_refused_naming_it(tmp_path, capsys, value):
    tok = split_tokenizer(r"\s+")
    spec = {"kind": KIND, "json": tok.to_str(), "special_tokens": {"eos_token": value}}
    path = tmp_path / "m.safetensors"
    save_checkpoint(path, Transformer(ModelConfig(vocab_size=5, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                                                  max_seq_len=8)), tokenizer=spec)
    assert main(["generate", "--checkpoint", str(path), "--input", "a b", "--max-new-tokens", "1"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "eos_token" in line and repr(value)[:10] in line and "string" in line


def test_special_tokens_with_an_unknown_name_are_refused():
    with pytest.raises(ValueError, match="'eos' is not one of: pad_token, eos_token"):
        HFTokenizer(split_tokenizer(r"\s+").to_str(), {"eos": "c"})


def test_a_gpt2_vocab_json_with_two_tokens_sharing_an_id_is_refused(tiny_gpt2_folder, tmp_path, capsys):
    folder, bpe = tiny_gpt2_folder
    (folder / "tokenizer.json").unlink()
    bpe.save_model(str(folder))
    vocab = json.loads((folder / "vocab.json").read_text())
    vocab["Ġzzz"] = vocab["a"]
    (folder / "vocab.json").write_text(json.dumps(vocab))
    assert main(["import", str(folder), "--out", str(tmp_path / "m.safetensors")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "vocab.json" in line and "'a' and 'Ġzzz' share the id" in line



def test_ids_beyond_the_tokenizer_decode_as_transformers_does_and_json_keeps_them(tmp_path, capsys):
    """Issue 35, F5: a config.json vocabulary (320) larger than the tokenizer's (as Pythia and Qwen ship
    theirs); a model whose every step predicts id 300, which has no token. transformers' generate and
    decode are the oracle: the ids kept, their text empty."""
    import torch
    from tokenizers import ByteLevelBPETokenizer

    transformers = pytest.importorskip("transformers")
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(["The cat sat on the mat."] * 10, vocab_size=280, min_frequency=1,
                            special_tokens=["<|endoftext|>"])
    assert bpe.get_vocab_size() < 300
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "tokenizer.json").write_text(bpe._tokenizer.to_str())
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=320, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                                     tie_word_embeddings=False)
    hf = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # the final norm outputs e_0 everywhere; only row 300 of the head reads it
        hf.transformer.ln_f.weight.zero_()
        hf.transformer.ln_f.bias.zero_()
        hf.transformer.ln_f.bias[0] = 1.0
        hf.lm_head.weight.zero_()
        hf.lm_head.weight[300, 0] = 1.0
    hf.save_pretrained(folder)
    prompt = bpe.encode("The cat").ids
    expected = hf.generate(torch.tensor([prompt]), max_new_tokens=3, do_sample=False,
                           pad_token_id=0)[0].tolist()
    assert expected[len(prompt):] == [300, 300, 300]
    oracle = transformers.PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    assert main(["generate", "--model", str(folder), "--input", "The cat", "--max-new-tokens", "3",
                 "--json", "-"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["prompt_ids"] + row["new_ids"] == expected
    assert row["text"] == oracle.decode(expected) == "The cat"
    assert main(["generate", "--model", str(folder), "--input", "The cat", "--max-new-tokens", "3"]) == 0
    assert capsys.readouterr().out == oracle.decode(expected) + "\n"
