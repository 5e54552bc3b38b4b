"""The resume rules: EXTENSIBLE fields extend a run, any other difference is another run, and each of the
three checks (flags, the session's config, a checkpoint's recorded settings) refuses the same field."""

from __future__ import annotations

from pathlib import Path

import pytest

import blocklab as bl
from blocklab.training.resume import (
    EXTENSIBLE,
    check_recorded_train,
    check_same_run,
    extension,
    flag_difference,
    split,
)
from blocklab.training.runfiles import SavedRun
from blocklab.training.train_config import TRAIN_FIELDS, TrainConfig


def saved_run(**train: object) -> tuple[SavedRun, dict]:
    model, tc = bl.preset("tiny-lm"), TrainConfig(steps=100, **train)
    config = {"model": model.to_dict(), "train": tc.to_dict(), "task": {"name": "tiny-lm"}}
    return SavedRun(model, tc, config["task"], config), config


def test_the_extensible_fields_are_train_config_fields_and_split_separates_them() -> None:
    assert set(EXTENSIBLE) <= set(TRAIN_FIELDS)
    fixed, extensible = split(TrainConfig().to_dict())
    assert set(extensible) == set(EXTENSIBLE) and set(fixed) == set(TRAIN_FIELDS) - set(EXTENSIBLE)


def test_more_steps_extend_the_run_and_are_recorded(tmp_path: Path) -> None:
    saved, config = saved_run()
    longer = {**config, "train": {**config["train"], "steps": 300}}
    check_same_run(tmp_path, saved, longer)
    recorded = extension(tmp_path, saved, longer, at_step=100)
    assert recorded["extended"] == [{"at_step": 100, "steps_before": 100, "steps": 300}]
    assert extension(tmp_path, saved, config, at_step=100) is None
    with pytest.raises(ValueError, match="is at step 100; steps=50 would undo training"):
        extension(tmp_path, saved, {**config, "train": {**config["train"], "steps": 50}}, at_step=100)


def test_every_check_refuses_a_fixed_field_that_differs(tmp_path: Path) -> None:
    saved, config = saved_run(lr=1e-3)
    other = {**config, "train": {**config["train"], "lr": 1e-2}}
    with pytest.raises(ValueError, match=r"configured differently \(train: "):
        check_same_run(tmp_path, saved, other)
    with pytest.raises(ValueError, match="was trained with lr=0.001 but the run now says lr=0.01"):
        check_recorded_train(tmp_path, config["train"], other["train"])
    check_recorded_train(tmp_path, config["train"], {**config["train"], "steps": 300})
    assert flag_difference({"lr": 1e-3}, {"lr": 0.01}) == "--lr 0.01 (the run has 0.001)"
    assert flag_difference({"lr": 1e-3}, {"lr": 1e-3}) is None
