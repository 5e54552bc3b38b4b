"""What a run folder holds, read back checked: strict JSON, metrics.jsonl lines, config.json, and
checkpoints published whole or not at all."""

from __future__ import annotations

import errno
import json
import math
from pathlib import Path

import pytest

import blocklab as bl
from blocklab.files.jsonfiles import json_line, read_json, write_json
from blocklab.tasks import get_task
from blocklab.training.loop import TrainConfig
from blocklab.training.runfiles import (
    publish_checkpoint,
    read_metrics,
    read_run_config,
    run_config,
    truncate_metrics,
)


def test_non_finite_numbers_are_written_as_null_and_read_back_as_nan(tmp_path: Path) -> None:
    row = {"step": 3, "loss": math.inf, "lr": 1e-3, "diag": {"grad_resid": [1.0, -math.inf, math.nan]}}
    line = json_line(row)
    assert line == '{"step": 3, "loss": null, "lr": 0.001, "diag": {"grad_resid": [1.0, null, null]}}\n'
    (tmp_path / "metrics.jsonl").write_text(line)
    back = read_metrics(tmp_path)[0]
    assert math.isnan(back["loss"]) and math.isnan(back["diag"]["grad_resid"][2]) and back["lr"] == 1e-3
    write_json(tmp_path / "x.json", {"a": math.nan})
    assert (tmp_path / "x.json").read_text() == '{\n  "a": null\n}\n'


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"step": "x"}', "line 1: step='x' must be an integer >= 0"),
        ('{"step": -1}', "step=-1 must be an integer >= 0"),
        ('{"step": true}', "step=True must be an integer >= 0"),
        ('{"loss": 1}', "step=None must be an integer >= 0"),
        ('[1, 2]', "expected a JSON object, found list"),
        ('{"step": 1, "loss": "low"}', "loss='low' must be a number"),
        ('{"step": 1, "grad_norm/blocks.0": [1]}', r"grad_norm/blocks.0=\[1\] must be a number"),
        ('{"step": 1, "loss": NaN}', "line 1: not valid JSON"),
        ("not json", "line 1: not valid JSON"),
    ],
)
def test_a_bad_metrics_line_is_a_one_line_error_naming_file_and_line(
    tmp_path: Path, line: str, message: str
) -> None:
    (tmp_path / "metrics.jsonl").write_text(line + '\n{"step": 2}\n')
    with pytest.raises(ValueError, match=message) as error:
        read_metrics(tmp_path)
    assert str(error.value).startswith(str(tmp_path / "metrics.jsonl")) and "\n" not in str(error.value)
    with pytest.raises(ValueError, match=message):
        truncate_metrics(tmp_path / "metrics.jsonl", 1)


def test_only_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, "lo')
    assert read_metrics(tmp_path) == [{"step": 1}]
    (tmp_path / "metrics.jsonl").write_bytes(b'{"step": 1}\n\xff\xfe\n')
    with pytest.raises(ValueError, match="not UTF-8"):
        read_metrics(tmp_path)


def _config_json(folder: Path, **changes: object) -> None:
    task = get_task("tiny-lm")
    data = run_config(bl.preset("tiny-lm", **task.config_overrides()), TrainConfig(), task)
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**data, **changes}))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model": None}, "'model' must be an object .the run's model settings.; it is a NoneType"),
        ({"train": [1]}, "'train' must be an object .the run's train settings.; it is a list"),
        ({"task": {"seq_len": 4}}, "task.name=None must be a task name"),
        ({"world_size": 0}, "world_size=0 must be an integer >= 1"),
        ({"model": {"d_model": "16"}}, "ModelConfig.d_model='16' must be an integer >= 1"),
        ({"model": {"width": 3}}, "ModelConfig has no field width"),
        ({"train": {"steps": 1.5}}, "TrainConfig.steps=1.5 must be an integer >= 1"),
    ],
)
def test_a_damaged_config_json_is_a_one_line_error_naming_the_file(
    tmp_path: Path, changes: dict, message: str
) -> None:
    _config_json(tmp_path, **changes)
    with pytest.raises(ValueError, match=message) as error:
        read_run_config(tmp_path)
    assert str(error.value).startswith(str(tmp_path / "config.json")) and "\n" not in str(error.value)


def test_config_json_without_model_or_from_hugging_face_is_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"train": {}, "task": {"name": "listops"}}))
    with pytest.raises(ValueError, match="'model' must be an object .* it is missing"):
        read_run_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 768}))
    with pytest.raises(ValueError, match="a Hugging Face model's config .model_type='gpt2'., not a blocklab"):
        read_run_config(tmp_path)
    (tmp_path / "config.json").write_text("[]")
    with pytest.raises(ValueError, match="expected a JSON object"):
        read_run_config(tmp_path)
    _config_json(tmp_path)
    saved = read_run_config(tmp_path)
    assert saved.model == bl.preset("tiny-lm", **get_task("tiny-lm").config_overrides())
    assert saved.train == TrainConfig() and saved.task["name"] == "tiny-lm"


def test_a_failed_checkpoint_write_leaves_the_previous_ones_and_no_temporary_folder(tmp_path: Path) -> None:
    def good(folder: Path) -> None:
        (folder / "w").write_text("ok")

    def full_disk(folder: Path) -> None:
        (folder / "w").write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")

    def interrupted(folder: Path) -> None:
        raise KeyboardInterrupt

    publish_checkpoint(tmp_path, 1, good, keep=2)
    publish_checkpoint(tmp_path, 2, good, keep=2)
    for fail in (full_disk, interrupted):
        for step in (2, 3):  # a new step and a re-save of an existing one
            with pytest.raises((OSError, KeyboardInterrupt)):
                publish_checkpoint(tmp_path, step, fail, keep=2)
            left = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
            assert left == ["step-000001", "step-000002"]
            assert (tmp_path / "checkpoints" / "step-000002" / "w").read_text() == "ok"


def test_read_json_refuses_nan_and_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text('{"x": Infinity}')
    with pytest.raises(ValueError, match=r"a\.json: not valid JSON .Infinity is not valid JSON"):
        read_json(tmp_path / "a.json")
