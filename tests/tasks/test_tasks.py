"""Tests for blocklab.tasks: tokenizer, the built-in toy tasks, exact_match."""

from __future__ import annotations

import json
import os
import string
from pathlib import Path

import pytest
import torch
from fuzzing import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from blocklab.tasks import (
    IGNORE_INDEX,
    TASKS,
    Task,
    TaskData,
    Tokenizer,
    exact_match,
    get_task,
    task_from_dict,
)

SMALL = {"copy": {"n_train": 500, "n_test": 100}, "reverse": {"n_train": 500, "n_test": 100},
         "sort": {"n_train": 500, "n_test": 100}}  # fmt: skip
# train part uses only a-m, held-out part only n-z: any leak shows up as a foreign character
TRAIN_CHARS, TEST_CHARS = "abcdefghijklm \n", "nopqrstuvwxyz"


@pytest.fixture(scope="module")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("text") / "corpus.txt"
    g = torch.Generator().manual_seed(123)
    train = "".join(TRAIN_CHARS[i] for i in torch.randint(len(TRAIN_CHARS), (1800,), generator=g))
    test = "".join(TEST_CHARS[i] for i in torch.randint(len(TEST_CHARS), (200,), generator=g))
    path.write_text(train + test, encoding="utf-8")
    return path


def make(name: str, text_file: Path, **options: object) -> Task:
    """Task `name` with small sizes, so the whole file stays fast."""
    extra = {"path": str(text_file), "seq_len": 16} if name == "text" else SMALL.get(name, {})
    return get_task(name, **{**extra, **options})


def rows(data: TaskData) -> set[tuple[int, ...]]:
    return set(map(tuple, data.inputs.tolist()))


def scored(targets: torch.Tensor) -> list[int]:
    return [int(i) for i in (targets != IGNORE_INDEX).nonzero().flatten()]


# ---------------------------------------------------------------- tokenizer

WORDS = ["<PAD>", "a", "b", "Max", "(", ")", ","]


@settings(max_examples=examples(50), deadline=None)
@given(st.lists(st.integers(0, len(WORDS) - 1), min_size=1, max_size=20))
def test_word_tokenizer_encode_inverts_decode(ids: list[int]) -> None:
    tok = Tokenizer(WORDS)
    assert tok.encode(tok.decode(ids)) == ids
    assert tok.tokens(ids) == [WORDS[i] for i in ids]


@settings(max_examples=examples(50), deadline=None)
@given(st.text(alphabet="ab \n\t", min_size=1, max_size=30))
def test_char_tokenizer_decode_inverts_encode(text: str) -> None:
    tok = Tokenizer(["<PAD>", "\t", "\n", " ", "a", "b"], level="char")
    assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode(text)) == len(text)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_task_tokenizer_round_trips_its_data_and_json(name: str, text_file: Path) -> None:
    task = make(name, text_file)
    tok = task.tokenizer
    for row in task.split("test").inputs.tolist():
        ids = [i for i in row if i != tok.pad_id]
        assert tok.encode(tok.decode(ids)) == ids
    assert Tokenizer.from_dict(json.loads(json.dumps(tok.to_dict()))) == tok
    assert tok.vocab[tok.pad_id] == "<PAD>" and tok.pad_id == 0
    assert all(tok.id_to_token[tok.token_to_id[t]] == t for t in tok.vocab)


def test_unknown_token_error_names_token_and_lists_vocabulary() -> None:
    tok = Tokenizer(WORDS)
    with pytest.raises(ValueError, match=r"unknown token 'Mux'.*<PAD> a b Max \( \) ,"):
        tok.encode("Mux ( a )")


def test_unknown_token_error_truncates_a_big_vocabulary() -> None:
    tok = Tokenizer(["<PAD>", *(f"w{i}" for i in range(500))])
    with pytest.raises(ValueError, match="unknown token 'zz'") as err:
        tok.encode("w1 zz")
    assert "and 461 more" in str(err.value) and "w499" not in str(err.value)


@pytest.mark.parametrize("level, text", [("word", ""), ("word", "  \n"), ("char", "")])
def test_empty_input_is_an_error(level: str, text: str) -> None:
    with pytest.raises(ValueError, match="empty input"):
        Tokenizer(["<PAD>", "a"], level=level).encode(text)


def test_tokenizer_rejects_bad_vocabularies_and_ids() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        Tokenizer(["<PAD>", "a", "a"])
    with pytest.raises(ValueError, match="pad_token"):
        Tokenizer(["a", "b"])
    with pytest.raises(ValueError, match="single character"):
        Tokenizer(["<PAD>", "ab"], level="char")
    with pytest.raises(ValueError, match="level"):
        Tokenizer(["<PAD>"], level="byte")
    with pytest.raises(ValueError, match="out of range"):
        Tokenizer(["<PAD>", "a"]).decode([0, 2])


# ---------------------------------------------------------------- every task


@pytest.mark.parametrize("name", sorted(TASKS))
def test_same_seed_gives_identical_splits(name: str, text_file: Path) -> None:
    a, b = make(name, text_file, seed=3), make(name, text_file, seed=3)
    for split in ("train", "test"):
        assert torch.equal(a.split(split).inputs, b.split(split).inputs)
        assert torch.equal(a.split(split).targets, b.split(split).targets)


@pytest.mark.parametrize("name", sorted(set(TASKS) - {"tiny-lm"}))
def test_different_seed_gives_a_different_train_split(name: str, text_file: Path) -> None:
    a, b = make(name, text_file, seed=0), make(name, text_file, seed=1)
    assert not torch.equal(a.split("train").inputs, b.split("train").inputs)


@pytest.mark.parametrize("name", sorted(set(TASKS) - {"tiny-lm", "text"}))
def test_held_out_inputs_never_appear_in_train(name: str, text_file: Path) -> None:
    task = make(name, text_file)
    assert not rows(task.split("train")) & rows(task.split("test"))


@pytest.mark.parametrize("name", sorted(TASKS))
def test_split_shapes_dtypes_and_unknown_split(name: str, text_file: Path) -> None:
    task = make(name, text_file)
    for split in ("train", "test"):
        data = task.split(split)
        assert data.inputs.dtype == data.targets.dtype == torch.long
        assert data.inputs.shape == data.targets.shape and data.inputs.shape[1] == task.seq_len
        assert data.inputs.max() < task.tokenizer.vocab_size and data.inputs.min() >= 0
        assert ((data.targets == IGNORE_INDEX) | (data.targets >= 0)).all()
    with pytest.raises(ValueError, match="unknown split 'valid'"):
        task.split("valid")


@pytest.mark.parametrize("name", sorted(TASKS))
def test_example_texts_encode_to_the_held_out_rows(name: str, text_file: Path) -> None:
    task = make(name, text_file)
    test = task.split("test")
    examples = task.example_texts(3)
    assert len(examples) == 3
    for i, text in enumerate(examples):
        ids, positions = task.encode_query(text)
        if task.causal:  # a prompt: the answer is the next token after the last one
            assert positions == [len(ids) - 1]
        else:  # a task that pads encodes a query unpadded: its mask would hide the pads anyway
            row = test.inputs[i].tolist()
            real = row if test.attention_mask is None else row[: int(test.attention_mask[i].sum())]
            assert ids == real and positions == scored(test.targets[i])


@pytest.mark.parametrize("name", sorted(TASKS))
def test_to_dict_survives_json_and_rebuilds_the_same_task(name: str, text_file: Path) -> None:
    task = make(name, text_file, seed=5)
    again = task_from_dict(json.loads(json.dumps(task.to_dict())))
    assert type(again) is type(task) and again.to_dict() == task.to_dict()
    assert torch.equal(again.split("test").inputs, task.split("test").inputs)


@pytest.mark.parametrize(
    "name, vocab_size, max_seq_len, causal",
    [("listops", 18, 8, False), ("tiny-lm", 6, 4, True), ("copy", 11, 8, False),
     ("reverse", 11, 8, False), ("sort", 11, 8, False), ("listops-padded", 18, 10, False)],
)  # fmt: skip
def test_config_overrides(name: str, vocab_size: int, max_seq_len: int, causal: bool) -> None:
    want = {"vocab_size": vocab_size, "max_seq_len": max_seq_len, "causal": causal}
    assert get_task(name).config_overrides() == want


def test_text_config_overrides_count_distinct_characters(text_file: Path) -> None:
    want = {"vocab_size": 1 + len(set(TRAIN_CHARS + TEST_CHARS)), "max_seq_len": 16, "causal": True}
    assert make("text", text_file).config_overrides() == want


def test_get_task_errors_name_what_is_allowed() -> None:
    with pytest.raises(ValueError, match="unknown task 'lisptops'; known tasks: listops, tiny-lm"):
        get_task("lisptops")
    with pytest.raises(ValueError, match="no option 'lenght'.*length, n_train, n_test, seed"):
        get_task("copy", lenght=4)
    with pytest.raises(ValueError, match=r"listops option test_fraction=1.5 must be .* 0 and 1"):
        get_task("listops", test_fraction=1.5)
    with pytest.raises(ValueError, match=r"copy option length=0 must be an integer in \[1, 256\]"):
        get_task("copy", length=0)
    with pytest.raises(ValueError, match=r"sort option n_test=1000 must be an integer in \[1, 50"):
        get_task("sort", length=2)
    with pytest.raises(ValueError, match="seed=-1"):
        get_task("tiny-lm", seed=-1)
    assert get_task().name == "listops"


# ---------------------------------------------------------------- listops


def test_listops_targets_are_the_right_answers_and_cover_all_4000() -> None:
    task = get_task("listops")
    train, test = task.split("train"), task.split("test")
    assert len(test) == 400 and len(train) == 3600 and len(rows(train) | rows(test)) == 4000
    ops = {"Max": max, "Min": min, "First": lambda xs: xs[0], "Last": lambda xs: xs[-1]}
    for data in (train, test):
        for row, target in zip(data.inputs.tolist(), data.targets.tolist(), strict=True):
            op, lp, a, c1, b, c2, c, rp = task.tokenizer.decode(row).split(" ")
            assert (lp, c1, c2, rp) == ("(", ",", ",", ")")
            answer = ops[op]([int(a), int(b), int(c)])
            assert target[:7] == [IGNORE_INDEX] * 7
            assert task.tokenizer.id_to_token[target[7]] == str(answer)


def test_listops_test_fraction_sets_the_held_out_size() -> None:
    assert len(get_task("listops", test_fraction=0.25).split("test")) == 1000


@pytest.mark.parametrize(
    "text", ["Max(1,6,2)", "Max ( 1 , 6 )", "Sum ( 1 , 6 , 2 )", "Max ( 1 , 6 , 12 )",
             "Max ) 1 , 6 , 2 (", "( Max 1 , 6 , 2 )", "Max ( 1 , 6 , <PAD> )"],
)  # fmt: skip
def test_listops_rejects_malformed_queries(text: str) -> None:
    with pytest.raises(ValueError, match='"OP \\( a , b , c \\)"'):
        get_task("listops").encode_query(text)


def test_listops_query_scores_the_closing_bracket() -> None:
    task = get_task("listops")
    ids, positions = task.encode_query("Min ( 7 , 3 , 9 )")
    assert task.tokenizer.tokens(ids) == ["Min", "(", "7", ",", "3", ",", "9", ")"]
    assert positions == [7] and task.decode_answer([task.tokenizer.token_to_id["3"]]) == "3"


# ---------------------------------------------------------------- tiny-lm


def test_tiny_lm_is_the_shifted_sentence_and_test_is_the_same_sentence() -> None:
    task = get_task("tiny-lm")
    assert task.tokenizer.vocab == ["<PAD>", "<BOS>", "<EOS>", "I", "like", "transformers"]
    train = task.split("train")
    assert task.tokenizer.decode(train.inputs[0]) == "<BOS> I like transformers"
    assert task.tokenizer.decode(train.targets[0]) == "I like transformers <EOS>"
    assert torch.equal(task.split("test").inputs, train.inputs)
    assert task.encode_query("<BOS> I") == ([1, 3], [1])


@pytest.mark.parametrize("text", ["I like", "<BOS> <PAD>", "<BOS> I like transformers <EOS>"])
def test_tiny_lm_rejects_bad_prefixes(text: str) -> None:
    with pytest.raises(ValueError, match="starts with <BOS>"):
        get_task("tiny-lm").encode_query(text)


# ---------------------------------------------------------------- copy / reverse / sort

EXPECTED = {"copy": lambda d: d, "reverse": lambda d: d[::-1], "sort": sorted}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_digit_targets_are_the_transformed_inputs(name: str) -> None:
    task = get_task(name, length=6, n_train=300, n_test=50)
    for data in (task.split("train"), task.split("test")):
        for row, target in zip(data.inputs.tolist(), data.targets.tolist(), strict=True):
            digits = [int(t) for t in task.tokenizer.tokens(row)]
            assert [int(t) for t in task.tokenizer.tokens(target)] == list(EXPECTED[name](digits))
    ids, positions = task.encode_query("314159")
    assert task.tokenizer.decode(ids) == "3 1 4 1 5 9" and positions == list(range(6))


def test_digit_held_out_is_distinct_and_disjoint_even_in_a_tiny_space() -> None:
    task = get_task("copy", length=3, n_train=3000, n_test=500)  # 1000 strings in all
    train, test = task.split("train"), task.split("test")
    assert len(rows(test)) == 500 and len(train) == 3000
    assert not rows(train) & rows(test) and len(rows(train)) > 450


@pytest.mark.parametrize("text", ["3 1 4", "3 1 4 1 5 9 2 6 5", "3 1 4 a 5 9 2 6", "31415x26"])
def test_digit_rejects_wrong_length_or_format(text: str) -> None:
    with pytest.raises(ValueError, match="8 digits 0-9"):
        get_task("reverse").encode_query(text)


# ---------------------------------------------------------------- text


def test_text_train_and_held_out_come_from_disjoint_parts(text_file: Path) -> None:
    task = make("text", text_file)
    tok = task.tokenizer
    train_ids = {tok.token_to_id[c] for c in TRAIN_CHARS}
    test_ids = {tok.token_to_id[c] for c in TEST_CHARS} | {tok.pad_id, IGNORE_INDEX}
    train, test = task.split("train"), task.split("test")
    assert set(train.inputs.flatten().tolist()) | set(train.targets.flatten().tolist()) <= train_ids
    assert set(test.inputs.flatten().tolist()) | set(test.targets.flatten().tolist()) <= test_ids
    # held-out windows tile the last 10% with stride seq_len: first input + all targets
    held_out = text_file.read_text()[-200:]
    ids = [test.inputs[0, 0].item()] + [i for i in test.targets.flatten().tolist() if i >= 0]
    assert tok.decode(ids) == held_out


def test_text_targets_are_the_next_character(text_file: Path) -> None:
    task = make("text", text_file)
    for data in task.split("train"), task.split("test"):
        real = data.inputs != task.tokenizer.pad_id  # (N, T)
        assert torch.equal(real, data.targets != IGNORE_INDEX)  # scored iff a real input
        follows = real[:, 1:]  # target j is input j + 1 wherever that input is real
        assert torch.equal(data.inputs[:, 1:][follows], data.targets[:, :-1][follows])


def test_text_vocabulary_is_pad_then_sorted_characters(text_file: Path) -> None:
    vocab = make("text", text_file).tokenizer.vocab
    assert vocab == ["<PAD>", *sorted(set(TRAIN_CHARS + TEST_CHARS))]


def test_text_without_a_path_models_the_shipped_corpus() -> None:
    import blocklab

    corpus = Path(blocklab.__file__).parent / "tasks" / "data" / "coriolanus.txt"
    text = corpus.read_text(encoding="utf-8")
    assert 40_000 < corpus.stat().st_size < 100_000 and text.startswith("First Citizen:\n")
    task = get_task("text")
    assert task.to_dict()["path"] is None and task.text == text
    assert task.tokenizer.vocab_size == 1 + len(set(text))  # <PAD> and one id per character
    train, test = task.split("train"), task.split("test")
    assert train.inputs.shape[1] == test.inputs.shape[1] == 64


def test_text_file_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="path is empty"):
        get_task("text", path="")
    with pytest.raises(ValueError, match="no such file"):
        get_task("text", path=str(tmp_path / "missing.txt"))
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError, match="empty"):
        get_task("text", path=str(tmp_path / "empty.txt"))
    with pytest.raises(ValueError, match="is a folder, not a regular file"):
        get_task("text", path=str(tmp_path))
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00abc")
    with pytest.raises(ValueError, match="not UTF-8"):
        get_task("text", path=str(tmp_path / "bin.txt"))
    (tmp_path / "short.txt").write_text(string.ascii_lowercase)
    with pytest.raises(ValueError, match="has 26 characters; seq_len=64 .* needs at least 72"):
        get_task("text", path=str(tmp_path / "short.txt"))
    assert len(get_task("text", path=str(tmp_path / "short.txt"), seq_len=8).split("test")) == 1


def test_text_query_is_a_prompt_of_at_most_seq_len_characters(text_file: Path) -> None:
    task = make("text", text_file)
    assert task.encode_query("abc") == (task.tokenizer.encode("abc"), [2])
    with pytest.raises(ValueError, match="at most seq_len=16"):
        task.encode_query("a" * 17)
    with pytest.raises(ValueError, match="unknown token 'Q'"):
        task.encode_query("aQ")


# ---------------------------------------------------------------- exact_match


def test_exact_match_ignores_unscored_positions_only() -> None:
    targets = torch.tensor([[IGNORE_INDEX, 2, 1], [IGNORE_INDEX, 2, 1], [IGNORE_INDEX] * 3])
    pred = torch.tensor([[0, 2, 1], [2, 2, 0], [1, 1, 1]])  # row 1 wrong at a scored position
    logits = torch.nn.functional.one_hot(pred, 3).float() * 5 - 1  # (3, 3, 3), argmax = pred
    assert exact_match(logits, targets).tolist() == [True, False, True]
    with pytest.raises(ValueError, match=r"\(N, T, V\)"):
        exact_match(logits[0], targets)


# ---------------------------------------------------------------- memory guard and text size cap

MEASURE = """
import json, sys
from blocklab.tasks import get_task

def status(field):
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(field))

task = get_task(sys.argv[1], **json.loads(sys.argv[2]))
open("/proc/self/clear_refs", "w").write("5")  # reset the peak (VmHWM) to the current size
before = status("VmRSS:")
task.split("train")
print(json.dumps({"measured": status("VmHWM:") - before, "estimated": task.data_bytes()}))
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc peak-RSS reset")
@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("sort", {"n_train": 60000, "length": 32}),
        ("listops-padded", {"n_train": 60000}),
        ("text", {"seq_len": 64, "n_train": 30000}),
    ],
)
def test_data_estimate_bounds_the_measured_peak_of_building_the_splits(
    name: str, options: dict, tmp_path: Path
) -> None:
    """The guard's estimate against the peak resident memory a fresh process adds while making the splits:
    never below it, and not so far above it that a task that fits would be refused."""
    import subprocess
    import sys

    if name == "text":
        g = torch.Generator().manual_seed(0)
        words = ["the", "cat", "sat", "on", "a", "mat", "größe", "日本語"]
        text = " ".join(words[i] for i in torch.randint(len(words), (200000,), generator=g))
        (tmp_path / "corpus.txt").write_text(text, encoding="utf-8")
        options = {**options, "path": str(tmp_path / "corpus.txt")}
    done = subprocess.run([sys.executable, "-c", MEASURE, name, json.dumps(options)], capture_output=True,
                          text=True, timeout=300, check=True)
    got = json.loads(done.stdout)
    assert got["measured"] <= got["estimated"] <= 2.5 * got["measured"], got


def test_every_task_estimates_its_data(text_file: Path) -> None:
    for name in TASKS:
        assert make(name, text_file).data_bytes() > 0, name


def test_task_data_that_cannot_fit_is_refused_before_it_is_generated(monkeypatch: pytest.MonkeyPatch) -> None:
    from blocklab.nn.memory import InsufficientMemoryError

    monkeypatch.setattr("blocklab.nn.memory.available_memory", lambda: (6 * 1024**3, "a 6 GB test limit"))
    task = get_task("copy", n_train=100_000_000)
    generated = []
    monkeypatch.setattr(type(task), "make_splits", lambda self: generated.append(1))
    with pytest.raises(InsufficientMemoryError, match=r"not enough memory: task copy \(length=8, "
                                                      r"n_train=100000000, n_test=1000, seed=0\) needs about "
                                                      r"54\.\d GB to build its data but 6\.0 GB"):
        task.split("train")
    assert generated == []


def test_text_files_beyond_the_size_cap_or_not_regular_are_refused_unread(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="path='/dev/zero': /dev/zero is a device, not a regular file"):
        get_task("text", path="/dev/zero")
    with pytest.raises(ValueError, match="is a folder, not a regular file"):
        get_task("text", path=str(tmp_path))
    os.mkfifo(tmp_path / "pipe")  # nothing writes to it: a blocking open would wait forever
    with pytest.raises(ValueError, match="pipe is a named pipe, not a regular file"):
        get_task("text", path=str(tmp_path / "pipe"))
    big = tmp_path / "big.txt"
    with open(big, "wb") as f:
        f.truncate(2 * 1024 * 1024 + 1)  # sparse: 2 MB + 1 byte of zeros, nothing written
    with pytest.raises(ValueError, match=r"more than the 2,097,152 .* max_mb=2 MB, --task-option max_mb=N"):
        get_task("text", path=str(big), max_mb=2)
    small = tmp_path / "small.txt"
    small.write_text("abcdefghij" * 400)
    raised = get_task("text", path=str(small), max_mb=64, seq_len=8)
    assert raised.to_dict()["max_mb"] == 64 and "max_mb" not in get_task("text", path=str(small)).to_dict()
    assert task_from_dict(raised.to_dict()).max_mb == 64
    with pytest.raises(ValueError, match="text option max_mb=0 must be an integer >= 1"):
        get_task("text", path=str(small), max_mb=0)
