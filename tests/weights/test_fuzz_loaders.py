"""Fuzzing what the library reads (hypothesis): random and almost-right config.json, metrics.jsonl,
state.json, checkpoint metadata, Hugging Face config.json / shard index and folder markers give a
result or a one-line ValueError (the CLI's exit 2), never another exception, and nothing outside the
sandbox is ever created, changed or removed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fuzzing import Sandbox, damaged, examples, file_texts, json_values, one_line_or_result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import save_file

import blocklab as bl
from blocklab.files.folders import inspect_folder
from blocklab.lab.ablate import ablate
from blocklab.tasks import get_task
from blocklab.training.checkpoint import load_checkpoint
from blocklab.training.loop import TrainConfig, train
from blocklab.training.runfiles import read_metrics, read_run_config, truncate_metrics
from blocklab.training.state import read_train_state
from blocklab.weights import read_pretrained, save_pretrained

FUZZ = settings(max_examples=examples(40), deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
TASK = get_task("tiny-lm")
CONFIG = bl.preset("tiny-lm", **TASK.config_overrides())
TRAIN = TrainConfig(steps=2, batch_size=4, eval_every=1, checkpoint_every=1, keep_checkpoints=2,
                    target_accuracy=None)
GRID_TRAIN = {"steps": 2, "batch_size": 4, "warmup": 1, "eval_every": 1}
GPT2_SHAPED = bl.ModelConfig(vocab_size=11, max_seq_len=8, d_model=8, n_heads=2, n_layers=1, d_ff=16,
                             norm_position="pre", pos_encoding="learned", causal=True, tie_embeddings=True,
                             activation="gelu_tanh", final_norm=True, embed_scale="none", embed_std=0.02)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Sandbox:
    """A trained run and a Hugging Face folder to damage copies of, inside the sandbox."""
    box = Sandbox(tmp_path_factory.mktemp("fuzz"))
    train(CONFIG, TRAIN, TASK, box.inside / "run", report=False)
    save_pretrained(bl.Transformer(GPT2_SHAPED), box.inside / "hf")
    ablate(TASK.to_dict(), {}, box.inside / "grid", train=GRID_TRAIN)
    tokens = ["a", "b", "c", "d", "e", "ab", "cd", "abc", "de", "bc", "<|endoftext|>"]
    (box.inside / "hf" / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}))
    (box.inside / "hf" / "merges.txt").write_text("#version: 0.2\na b\nc d\nab c\nd e\nb c\n")
    (box.inside / "hf" / "special_tokens_map.json").write_text('{"eos_token": "<|endoftext|>"}')
    (box.inside / "hf" / "tokenizer_config.json").write_text('{"model_max_length": 8}')
    return box


@pytest.fixture(autouse=True)
def _small_memory(monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox) -> None:
    """A fuzzed config may describe any size: the guard must refuse it, never the machine build it."""
    monkeypatch.setattr("blocklab.nn.memory.available_memory", lambda: (256 * 2**20, "a 256 MB fuzz limit"))
    monkeypatch.chdir(sandbox.inside)  # relative paths in fuzzed files resolve in the sandbox


def fresh(sandbox: Sandbox, name: str) -> Path:
    """A new copy of the sandbox's ``name`` folder to damage."""
    copy = sandbox.inside / f"{name}-copy"
    shutil.rmtree(copy, ignore_errors=True)
    return Path(shutil.copytree(sandbox.inside / name, copy))


@FUZZ
@given(text=file_texts(json.loads(json.dumps({"model": CONFIG.to_dict(), "train": TRAIN.to_dict(),
                                              "task": TASK.to_dict(), "world_size": 1,
                                              "versions": {"blocklab": "0.1.0", "torch": "2"}}))))
def test_config_json(sandbox: Sandbox, text: str) -> None:
    run = fresh(sandbox, "run")
    (run / "config.json").write_text(text)
    one_line_or_result(lambda: read_run_config(run))
    result = one_line_or_result(lambda: train(CONFIG, TRAIN, TASK, run, resume=True, report=False))
    assert result is None or result.step == 2
    assert sandbox.untouched()


ROW = {"step": 3, "loss": 1.5, "lr": 0.001, "grad_norm": 0.5, "eval_loss": 1.0, "eval_accuracy": 0.5,
       "time": 1.0, "tokens_per_s": 100.0, "grad_norm/blocks.0": 0.1, "diag": {"grad_resid": [1.0]}}


@FUZZ
@given(lines=st.lists(st.one_of(damaged(ROW).map(json.dumps), json_values.map(json.dumps),
                                st.text(max_size=30)), max_size=6))
def test_metrics_jsonl(sandbox: Sandbox, lines: list[str]) -> None:
    run = fresh(sandbox, "run")
    (run / "metrics.jsonl").write_text("".join(line.replace("\n", " ") + "\n" for line in lines))
    rows = one_line_or_result(lambda: read_metrics(run))
    assert rows is None or all(isinstance(r["step"], int) for r in rows)
    one_line_or_result(lambda: truncate_metrics(run / "metrics.jsonl", 1))
    one_line_or_result(lambda: train(CONFIG, TRAIN, TASK, run, resume=True, report=False))
    assert sandbox.untouched()


def _state(sandbox: Sandbox) -> dict:
    return json.loads((sandbox.inside / "run" / "checkpoints" / "step-000002" / "state.json").read_text())


@FUZZ
@given(data=st.data(), digest=st.booleans())
def test_state_json(sandbox: Sandbox, data: st.DataObject, digest: bool) -> None:
    run = fresh(sandbox, "run")
    ckpt = run / "checkpoints" / "step-000002"
    (ckpt / "state.json").write_text(data.draw(file_texts(_state(sandbox))))
    meta = load_checkpoint(ckpt / "model.safetensors").meta
    meta = meta if digest else {k: v for k, v in meta.items() if k != "state_sha256"}
    one_line_or_result(lambda: read_train_state(ckpt, meta, world_size=1))
    one_line_or_result(lambda: train(CONFIG, TRAIN.replace(steps=3), TASK, run, resume=True, report=False))
    assert sandbox.untouched()


def _metadata(path: Path) -> dict[str, str]:
    with safe_open(str(path), "pt") as f:
        return dict(f.metadata())


@FUZZ
@given(data=st.data(), key=st.sampled_from(["config", "tokenizer", "meta"]))
def test_checkpoint_metadata(sandbox: Sandbox, data: st.DataObject, key: str) -> None:
    run = fresh(sandbox, "run")
    path = run / "checkpoints" / "step-000002" / "model.safetensors"
    metadata = _metadata(path)
    valid = json.loads(metadata[key]) if isinstance(json.loads(metadata[key]), dict) else {"kind": "vocab"}
    with safe_open(str(path), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # not a dict
    save_file(tensors, str(path), {**metadata, key: data.draw(file_texts(valid))})
    one_line_or_result(lambda: load_checkpoint(path))
    assert sandbox.untouched()


@FUZZ
@given(data=st.data())
def test_hugging_face_config_json(sandbox: Sandbox, data: st.DataObject) -> None:
    folder = fresh(sandbox, "hf")
    valid = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(data.draw(file_texts(valid)))
    loaded = one_line_or_result(lambda: read_pretrained(folder))
    assert loaded is None or loaded.model.config.vocab_size >= 1
    assert sandbox.untouched()


@FUZZ
@given(weight_map=st.one_of(json_values, st.dictionaries(st.text(max_size=8), st.sampled_from(
    ["../outside/canary", "/etc/hostname", "model.safetensors", "", "a/../../x", "hf-copy"]), max_size=3)))
def test_hugging_face_shard_index(sandbox: Sandbox, weight_map: object) -> None:
    folder = fresh(sandbox, "hf")
    (folder / "model.safetensors").rename(folder / "shard.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    one_line_or_result(lambda: read_pretrained(folder))
    assert sandbox.untouched()


@FUZZ
@given(text=file_texts({"format": "blocklab-folder", "kind": "run", "id": "x", "blocklab": "0.1.0",
                        "created": "now"}), overwrite=st.booleans())
def test_folder_marker(sandbox: Sandbox, text: str, overwrite: bool) -> None:
    run = fresh(sandbox, "run")
    (run / "blocklab-run.json").write_text(text)
    (run / "keep.txt").write_text("not blocklab's")
    one_line_or_result(lambda: inspect_folder(run, "run"))
    one_line_or_result(lambda: train(CONFIG, TRAIN, TASK, run, overwrite=overwrite, report=False))
    assert (run / "keep.txt").read_text() == "not blocklab's"
    assert sandbox.untouched()


def _result(sandbox: Sandbox) -> dict:
    return json.loads((sandbox.inside / "grid" / "base" / "seed-0" / "result.json").read_text())


@FUZZ
@given(data=st.data())
def test_result_json(sandbox: Sandbox, data: st.DataObject) -> None:
    """A grid's result.json (issue 30, E7: [], {}, null or {"accuracy": "x"} were KeyErrors and TypeErrors
    in a rerun): the summary, or a one-line refusal naming the file."""
    grid = fresh(sandbox, "grid")
    (grid / "base" / "seed-0" / "result.json").write_text(data.draw(file_texts(_result(sandbox))))
    summary = one_line_or_result(lambda: ablate(TASK.to_dict(), {}, grid, train=GRID_TRAIN))
    assert summary is None or summary["cells"][0]["seeds"] == 1
    assert sandbox.untouched()


VOCAB_FILES = {  # a tokenizer file of the Hugging Face folder and a valid content to damage
    "vocab.json": {t: i for i, t in enumerate(["a", "b", "c", "ab", "<|endoftext|>"])},
    "special_tokens_map.json": {"eos_token": {"content": "<|endoftext|>", "lstrip": False}},
    "tokenizer_config.json": {"do_lower_case": True, "eos_token": "<|endoftext|>", "model_max_length": 8},
}


@FUZZ
@given(data=st.data(), name=st.sampled_from(sorted(VOCAB_FILES)))
def test_hugging_face_tokenizer_files(sandbox: Sandbox, data: st.DataObject, name: str) -> None:
    """Issue 30, E1: list-valued or deep tokenizer files were TypeErrors and RecursionErrors."""
    folder = fresh(sandbox, "hf")
    (folder / name).write_text(data.draw(file_texts(VOCAB_FILES[name])))
    loaded = one_line_or_result(lambda: read_pretrained(folder))
    assert loaded is None or loaded.tokenizer is not None
    assert sandbox.untouched()


@FUZZ
@given(lines=st.lists(st.one_of(st.text(max_size=12), st.sampled_from(["a b", "#version: 0.2", "a  b", ""])),
                      max_size=6),
       vocab_txt=st.booleans())
def test_vocabulary_text_files(sandbox: Sandbox, lines: list[str], vocab_txt: bool) -> None:
    """merges.txt (GPT-2) and vocab.txt (BERT) of any text: a tokenizer, or one line (an empty or bad
    vocab.txt was a TypeError from the tokenizers library)."""
    folder = fresh(sandbox, "hf")
    if vocab_txt:
        for name in ("vocab.json", "merges.txt"):
            (folder / name).unlink()
        (folder / "vocab.txt").write_text("\n".join(lines))
    else:
        (folder / "merges.txt").write_text("\n".join(lines))
    one_line_or_result(lambda: read_pretrained(folder))
    assert sandbox.untouched()


@FUZZ
@given(header=json_values, length=st.sampled_from([None, 0, 7, 2**40]))
def test_safetensors_header(sandbox: Sandbox, header: object, length: int | None) -> None:
    """Any JSON as a safetensors header (and lengths that lie): a one-line refusal, never an allocation."""
    from blocklab.training.checkpoint import load_checkpoint

    path = sandbox.inside / "header.safetensors"
    text = json.dumps(header).encode()
    path.write_bytes((len(text) if length is None else length).to_bytes(8, "little") + text)
    one_line_or_result(lambda: load_checkpoint(path))
    assert sandbox.untouched()
