"""Run-folder ownership: blocklab writes only into folders it made, never over its own input, and
removes only what it wrote. One test per data-loss case of issue 12, then the ownership rule itself."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import blocklab as bl
from blocklab.cli import main
from blocklab.files.folders import RunLock, RunLockedError
from blocklab.tasks import get_task
from blocklab.training.loop import TrainConfig, train

TINY = {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32}
QUICK = ["--steps", "3", "--batch-size", "8", "--eval-every", "1000", "--checkpoint-every", "0",
         "--target-accuracy", "none", "--log-diagnostics", "0", "-q", "--no-report"]
GPT2_SHAPED = bl.ModelConfig(vocab_size=10, max_seq_len=8, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                             norm_position="pre", pos_encoding="learned", causal=True, tie_embeddings=True,
                             activation="gelu_tanh", final_norm=True, embed_scale="none", embed_std=0.02)
SMALL = ["--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--d-ff", "32"]


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every path under ``folder`` and its bytes (None for folders)."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(folder.rglob("*"))}


def foreign_folder(root: Path) -> Path:
    """Another tool's folder that uses the names a blocklab run writes: config.json, checkpoints/,
    metrics.jsonl, report.html."""
    folder = root / "theirs"
    (folder / "checkpoints" / "x").mkdir(parents=True)
    (folder / "checkpoints" / "x" / "w").write_text("their weights")
    (folder / "checkpoints" / "step-000001").mkdir()
    (folder / "checkpoints" / "step-000001" / "notes").write_text("not a blocklab checkpoint")
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    (folder / "metrics.jsonl").write_text('{"their": 1}\n')
    (folder / "report.html").write_text("<p>their report</p>")
    return folder


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        status = main(argv)
    except SystemExit as exit_:
        status = int(exit_.code)
    return status, capsys.readouterr().err


def tiny_train_config() -> TrainConfig:
    return TrainConfig(steps=3, batch_size=8, eval_every=1000, checkpoint_every=0, target_accuracy=None)


def tiny_model() -> tuple[bl.ModelConfig, object]:
    task = get_task("tiny-lm")
    return bl.preset("tiny-lm", **task.config_overrides()), task


# ---- issue 12, data loss 1: --overwrite deleted files that were not a blocklab run's ------------------


def test_overwrite_in_the_current_directory_of_another_tool_deletes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = foreign_folder(tmp_path)
    before = snapshot(folder)
    monkeypatch.chdir(folder)  # the reproduction: --out . --overwrite
    status, err = cli(["train", "--task", "tiny-lm", *QUICK, "--out", ".", "--overwrite"], capsys)
    assert status == 2 and err.startswith("blocklab: error: --out . is the current directory"), err
    assert snapshot(folder) == before


@pytest.mark.parametrize("flags", [[], ["--overwrite"]])
def test_a_non_empty_folder_without_the_marker_is_refused_saying_what_it_holds(
    tmp_path: Path, flags: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    folder = foreign_folder(tmp_path)
    before = snapshot(folder)
    status, err = cli(["train", "--task", "tiny-lm", *QUICK, "--out", str(folder), *flags], capsys)
    assert status == 2 and len(err.splitlines()) == 1, err
    assert f"--out {folder} is not empty and was not written by blocklab" in err
    assert "checkpoints/, config.json, metrics.jsonl, report.html" in err and "model_type='gpt2'" in err
    assert snapshot(folder) == before


@pytest.mark.parametrize(("resume", "overwrite"), [(False, False), (False, True), (True, False)])
def test_train_refuses_another_tools_folder_from_python(
    tmp_path: Path, resume: bool, overwrite: bool
) -> None:
    folder = foreign_folder(tmp_path)
    before = snapshot(folder)
    config, task = tiny_model()
    with pytest.raises(ValueError, match="not empty and was not written by blocklab.*model_type='gpt2'"):
        train(config, tiny_train_config(), task, folder, resume=resume, overwrite=overwrite, report=False)
    assert snapshot(folder) == before


def test_resume_on_a_hugging_face_folder_is_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = foreign_folder(tmp_path)
    before = snapshot(folder)
    status, err = cli(["train", "--resume", "--out", str(folder), "-q"], capsys)
    assert status == 2 and len(err.splitlines()) == 1 and err.endswith(
        "(its config.json has model_type='gpt2': a Hugging Face model folder?); blocklab writes only into a "
        "new or empty folder or one it made, so choose another --out\n"), err
    assert snapshot(folder) == before
    run = tmp_path / "run"  # a run of ours whose config.json was replaced by a Hugging Face one
    config, task = tiny_model()
    train(config, tiny_train_config(), task, run, report=False)
    (run / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    status, err = cli(["train", "--resume", "--out", str(run), "-q"], capsys)
    assert status == 2 and err == (
        f"blocklab: error: {run / 'config.json'} is a Hugging Face model's config (model_type='gpt2'), "
        "not a blocklab run's; --resume continues a run that blocklab train wrote\n")
    (run / "config.json").write_text(json.dumps({"train": {}, "task": {"name": "listops"}}))
    status, err = cli(["train", "--resume", "--out", str(run), "-q"], capsys)
    assert status == 2 and "'model' must be an object (the run's model settings); it is missing" in err


def test_python_callers_are_protected_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config, task = tiny_model()
    empty = tmp_path / "cwd"
    empty.mkdir()
    monkeypatch.chdir(empty)
    with pytest.raises(ValueError, match="--out . is the current directory"):
        train(config, tiny_train_config(), task, ".", overwrite=True, report=False)
    with pytest.raises(ValueError, match=r"--out \.\. is a folder holding the current directory"):
        train(config, tiny_train_config(), task, "..", overwrite=True, report=False)
    home = tmp_path / "home"
    (home / "checkpoints").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(ValueError, match="is your home folder"):
        train(config, tiny_train_config(), task, home, overwrite=True, report=False)
    with pytest.raises(ValueError, match="'~' is not expanded here"):
        train(config, tiny_train_config(), task, "~/runs/x", report=False)
    assert sorted(os.listdir(empty)) == [] and (home / "checkpoints").is_dir()


def test_a_filesystem_root_is_refused_before_anything_is_written() -> None:
    config, task = tiny_model()
    before = sorted(os.listdir("/"))
    with pytest.raises(ValueError, match="--out / is a filesystem root"):
        train(config, tiny_train_config(), task, "/", overwrite=True, report=False)
    assert sorted(os.listdir("/")) == before


# ---- issue 12, data loss 2: ablate --out <a training run> overwrote its report -----------------------


@pytest.fixture
def trained_run(tmp_path: Path) -> Path:
    out = tmp_path / "run"
    config, task = tiny_model()
    train(config, tiny_train_config(), task, out, report=True)
    return out


def test_ablate_into_a_training_run_is_refused_and_the_run_survives(
    trained_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot(trained_run)
    argv = ["ablate", "--task", "tiny-lm", *SMALL, "--steps", "2", "--out", str(trained_run)]
    status, err = cli(argv, capsys)
    assert status == 2 and f"--out {trained_run} is a training run, not an ablation grid" in err, err
    assert snapshot(trained_run) == before


def test_ablate_refuses_a_grid_a_live_process_holds(tmp_path: Path) -> None:
    from blocklab.lab.ablate import ablate

    grid = tmp_path / "grid"
    with RunLock(grid), pytest.raises(RunLockedError, match="in use by another blocklab run"):
        ablate({"name": "tiny-lm"}, {}, grid, model=TINY, train={"steps": 2, "batch_size": 8})
    assert sorted(os.listdir(grid)) == []  # nothing written, the holder's lock released with it


# ---- issue 12, data loss 3: import X --out X/model.safetensors replaced the source weights --------------


@pytest.fixture
def gpt2_folder(tmp_path: Path) -> Path:
    transformers = pytest.importorskip("transformers")
    folder = tmp_path / "gpt2"
    config = transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(config).save_pretrained(str(folder))
    return folder


@pytest.mark.parametrize("target", ["model.safetensors", "config.json", "copy.safetensors", "."])
def test_import_never_writes_over_or_into_its_input(
    gpt2_folder: Path, target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot(gpt2_folder)
    out = gpt2_folder / target
    status, err = cli(["import", str(gpt2_folder), "--out", str(out)], capsys)
    assert status == 2 and len(err.splitlines()) == 1, err
    assert snapshot(gpt2_folder) == before
    bl_model, _ = __import__("blocklab.weights", fromlist=["load_pretrained"]).load_pretrained(gpt2_folder)
    assert bl_model.config.d_model == 16  # the source still loads


# ---- the ownership rule: another tool's folder survives every writing command ---------------------------


def _writers(folder: Path, gpt2: Path) -> list[list[str]]:
    train_argv = ["train", "--task", "tiny-lm", *QUICK, "--out", str(folder)]
    return [
        train_argv,
        [*train_argv, "--overwrite"],
        [*train_argv, "--resume"],
        ["ablate", "--task", "tiny-lm", *SMALL, "--steps", "2", "--out", str(folder)],
        ["import", str(gpt2), "--out", str(folder)],
        ["trace", "--preset", "tiny-lm", "--input", "I like", "--json", str(folder), "-q"],
        ["trace", "--preset", "tiny-lm", "--input", "I like", "--html", str(folder), "-q"],
    ]


def test_another_tools_folder_survives_every_writing_command(
    tmp_path: Path, gpt2_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = foreign_folder(tmp_path)
    before = snapshot(folder)
    for argv in _writers(folder, gpt2_folder):
        status, err = cli(argv, capsys)
        assert status == 2 and len(err.splitlines()) == 1, (argv, err)
        assert snapshot(folder) == before, argv


def test_export_into_another_tools_folder_is_refused(tmp_path: Path, gpt2_folder: Path) -> None:
    from blocklab.weights import load_pretrained, save_pretrained

    folder = foreign_folder(tmp_path)
    before, source = snapshot(folder), snapshot(gpt2_folder)
    model, _ = load_pretrained(gpt2_folder)
    with pytest.raises(ValueError, match="not empty and was not written by blocklab"):
        save_pretrained(model, folder)
    with pytest.raises(ValueError, match="not empty and was not written by blocklab"):
        save_pretrained(model, gpt2_folder)  # over the folder it came from
    assert snapshot(folder) == before and snapshot(gpt2_folder) == source


def test_overwrite_removes_only_what_the_run_wrote(tmp_path: Path) -> None:
    config, task = tiny_model()
    out = tmp_path / "run"
    c = tiny_train_config().replace(checkpoint_every=1, keep_checkpoints=5)
    train(config, c, task, out, report=False)
    (out / "notes.txt").write_text("mine")
    (out / "checkpoints" / "best").mkdir()
    (out / "checkpoints" / "best" / "w").write_text("kept by hand")
    marker = json.loads((out / "blocklab-run.json").read_text())
    train(config, c.replace(steps=2), task, out, overwrite=True, report=False)
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "checkpoints" / "best" / "w").read_text() == "kept by hand"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "best", "step-000001", "step-000002"]
    again = json.loads((out / "blocklab-run.json").read_text())
    assert again["kind"] == "run" and again["id"] != marker["id"]  # a new run, a new id


def test_a_folder_is_adopted_only_by_its_own_marker(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 30, D4: a folder holding the user's report.html and a moved run (its marker removed) is not
    an "old-style" grid or run: ablate and train --resume refuse it and change nothing."""
    config, task = tiny_model()
    mine, moved = tmp_path / "mine", tmp_path / "mine" / "old" / "seed-0"
    train(config, tiny_train_config().replace(checkpoint_every=1), task, moved, report=False)
    (moved / "blocklab-run.json").unlink()
    (mine / "report.html").write_text("<p>my report</p>")
    before = snapshot(mine)
    status, err = cli(["ablate", "--task", "tiny-lm", "--steps", "2", "--jobs", "1", "--out", str(mine)],
                      capsys)
    assert status == 2 and len(err.splitlines()) == 1 and "was not written by blocklab" in err, err
    status, err = cli(["train", "--task", "tiny-lm", "--resume", "--out", str(moved), *QUICK], capsys)
    assert status == 2 and len(err.splitlines()) == 1 and "was not written by blocklab" in err, err
    assert snapshot(mine) == before


def test_a_folder_of_another_kind_is_refused(tmp_path: Path) -> None:
    from blocklab.weights import save_pretrained

    config, task = tiny_model()
    grid = tmp_path / "grid"
    grid.mkdir()
    (grid / "blocklab-run.json").write_text(json.dumps(
        {"format": "blocklab-folder", "kind": "ablation", "id": "x", "blocklab": "0", "created": "now"}))
    with pytest.raises(ValueError, match="is an ablation grid, not a training run"):
        train(config, tiny_train_config(), task, grid, overwrite=True, report=False)
    run = tmp_path / "run"
    train(config, tiny_train_config().replace(checkpoint_every=1), task, run, report=False)
    with pytest.raises(ValueError, match="is inside .*run, a training run"):  # pruned with the checkpoints
        train(config, tiny_train_config(), task, run / "checkpoints" / "step-000003" / "x", report=False)
    with pytest.raises(ValueError, match="is inside .*grid, an ablation grid"):
        save_pretrained(bl.Transformer(GPT2_SHAPED), grid / "hf")
    assert train(config, tiny_train_config(), task, run / "finetune", report=False).step == 3


def test_bench_trace_and_claims_outputs_are_never_inputs_or_inside_blocklab_folders(tmp_path: Path) -> None:
    from blocklab.files.folders import check_output_file

    run = tmp_path / "run"
    run.mkdir()
    (run / "blocklab-run.json").write_text(json.dumps(
        {"format": "blocklab-folder", "kind": "run", "id": "x", "blocklab": "0", "created": "now"}))
    model = tmp_path / "model.safetensors"
    model.write_bytes(b"x")
    with pytest.raises(ValueError, match="--json .* is this command's input"):
        check_output_file(model, inputs=[model], flag="--json")
    with pytest.raises(ValueError, match="--html .* is inside .*run, a training run"):
        check_output_file(run / "trace.html", flag="--html")
    with pytest.raises(ValueError, match="is a folder"):
        check_output_file(tmp_path, flag="--plot")
    assert check_output_file(tmp_path / "out.json") == (tmp_path / "out.json").resolve()


def test_a_killed_run_folder_is_resumed_not_refused(tmp_path: Path) -> None:
    """A stale lock (its holder dead) is blocklab's own file: an empty folder holding only it is free."""
    code = f"from blocklab.files.folders import RunLock; RunLock({str(tmp_path)!r}).acquire()"
    holder = subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert holder.returncode == 0 and (tmp_path / ".lock").exists()
    config, task = tiny_model()
    assert train(config, tiny_train_config(), task, tmp_path, report=False).step == 3


def test_trace_bench_and_claims_check_their_outputs_before_working(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad output path costs nothing: refused before the bench measures or the claims train."""
    run = tmp_path / "run"
    config, task = tiny_model()
    train(config, tiny_train_config(), task, run, report=False)
    model_file = next(run.glob("checkpoints/*/model.safetensors"))
    before = snapshot(run)

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the command ran before checking its outputs")

    monkeypatch.setattr("blocklab.bench.runner.run_bench", never)
    monkeypatch.setattr("blocklab.lab.claims.run_claims", never)
    cases = [
        (["trace", "--checkpoint", str(model_file), "--input", "I like", "--json", str(model_file), "-q"],
         "--json .* is this command's input"),
        (["trace", "--preset", "tiny-lm", "--input", "I like", "--html", str(run / "t.html"), "-q"],
         "--html .* is inside .*run, a training run"),
        (["bench", "--quick", "--json", str(run / "bench.json")], "--json .* is inside .*run, a training"),
        (["bench", "--quick", "--json", str(tmp_path / "b.png"), "--plot", str(tmp_path / "b.png")],
         "--plot .* is also the --json file"),
        (["claims", "--quick", "--html", str(run / "report.html")], "--html .* is inside .*run, a train"),
        (["claims", "--quick", "--json", str(tmp_path)], "--json .* is a folder"),
    ]
    for argv, message in cases:
        status, err = cli(argv, capsys)
        assert status == 2 and len(err.splitlines()) == 1 and re.search(message, err), (argv, err)
    assert snapshot(run) == before
    page = tmp_path / "t.html"
    status, _ = cli(["trace", "--preset", "tiny-lm", "--input", "I like", "--html", str(page), "-q"], capsys)
    assert status == 0
    assert page.read_text().startswith("<!doctype html>")
