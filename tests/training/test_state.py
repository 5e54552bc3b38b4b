"""The training state a checkpoint adds (optimizer.safetensors, state.json): every field checked on
reading, the three files of a checkpoint tied together by digests the model file records."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors import safe_open
from safetensors.torch import save_file

import blocklab as bl
from blocklab.tasks import get_task
from blocklab.training.checkpoint import load_checkpoint
from blocklab.training.loop import TrainConfig, make_optimizer, train
from blocklab.training.state import OPTIMIZER_DIGEST, load_optimizer_state, read_train_state

C = TrainConfig(steps=4, batch_size=8, log_every=1, eval_every=1000, checkpoint_every=2, keep_checkpoints=2,
                target_accuracy=None)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    task = get_task("tiny-lm")
    out = tmp_path_factory.mktemp("state") / "run"
    train(bl.preset("tiny-lm", **task.config_overrides()), C, task, out, report=False)
    return out


@pytest.fixture
def step4(run: Path, tmp_path: Path) -> Path:
    """A private copy of the run's step-4 checkpoint folder to damage."""
    return Path(shutil.copytree(run / "checkpoints" / "step-000004", tmp_path / "step-000004"))


def meta_of(folder: Path) -> dict:
    return load_checkpoint(folder / "model.safetensors").meta


def test_a_saved_state_reads_back_and_the_model_file_records_both_digests(step4: Path) -> None:
    meta = meta_of(step4)
    assert {"state_sha256", "optimizer_sha256"} <= set(meta)
    state = read_train_state(step4, meta, world_size=1)
    assert state["step"] == 4 and state["done"] is True and state["stopped"] == "steps"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("step", 3, "step=3 must be 4, the step in the folder's name"),
        ("step", "4", "step='4' must be 4"),
        ("step", True, "step=True must be 4"),
        ("done", "yes", "done='yes' must be true or false"),
        ("stopped", "tired", "stopped='tired' must be one of: steps, target"),
        ("seconds", -1, "seconds=-1 must be a number >= 0"),
        ("tokens", 1.5, "tokens=1.5 must be an integer >= 0"),
        ("loss", "low", "loss='low' must be a number or null"),
        ("eval", {"accuracy": "high"}, "must be an object of numbers"),
        ("eval", [], "eval=\\[\\] must be an object of numbers"),
        ("rng", ["AAAA"], r"rng\[0\] is not a saved RNG state \(3 bytes"),
        ("rng", ["!!"], r"rng\[0\] is not a saved RNG state \(not base64"),
        ("rng", [], "rng=\\[\\] must be a list of 1 RNG states"),
        ("world_size", 2, "world_size=2 must be 1, the number of processes resuming it"),
    ],
)
def test_every_field_of_state_json_is_checked(step4: Path, field: str, value: object, message: str) -> None:
    state = json.loads((step4 / "state.json").read_text())
    (step4 / "state.json").write_text(json.dumps({**state, field: value}))
    meta = {k: v for k, v in meta_of(step4).items() if k != "state_sha256"}  # as if written before digests
    with pytest.raises(ValueError, match=message) as error:
        read_train_state(step4, meta, world_size=1)
    assert str(error.value).startswith(str(step4 / "state.json")) and "\n" not in str(error.value)


def test_a_state_json_that_is_not_an_object_or_not_json_is_refused(step4: Path) -> None:
    meta = {k: v for k, v in meta_of(step4).items() if k != "state_sha256"}
    for text, message in [("[1, 2]", "expected a JSON object"), ('{"step": NaN}', "not valid JSON"),
                          ("{", "not valid JSON")]:
        (step4 / "state.json").write_text(text)
        with pytest.raises(ValueError, match=message):
            read_train_state(step4, meta, world_size=1)


def test_a_state_json_disagreeing_with_the_model_file_is_refused(step4: Path) -> None:
    meta = meta_of(step4)
    with pytest.raises(ValueError, match="the model file says step 2, the folder 4"):
        read_train_state(step4, {**{k: v for k, v in meta.items() if k != "state_sha256"}, "step": 2}, 1)
    (step4 / "state.json").write_text((step4 / "state.json").read_text().replace('"tokens": ', '"tokens":  '))
    with pytest.raises(ValueError, match="does not match the digest the checkpoint's model file records"):
        read_train_state(step4, meta, world_size=1)  # one space more is an edit


def test_an_optimizer_file_without_its_digest_is_refused_like_a_model_file(step4: Path) -> None:
    path = step4 / "optimizer.safetensors"
    with safe_open(str(path), framework="pt") as f:
        metadata = {k: v for k, v in f.metadata().items() if k != "sha256"}
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # not a dict
    save_file(tensors, str(path), metadata=metadata)
    model = load_checkpoint(step4 / "model.safetensors").model
    with pytest.raises(ValueError, match="optimizer.safetensors: has no sha256 digest"):
        load_optimizer_state(path, model, make_optimizer(model, C))


def test_an_optimizer_file_from_another_checkpoint_is_refused(run: Path, step4: Path) -> None:
    other = run / "checkpoints" / "step-000002" / "optimizer.safetensors"
    shutil.copy(other, step4 / "optimizer.safetensors")
    model = load_checkpoint(step4 / "model.safetensors").model
    with pytest.raises(ValueError, match="is not the optimizer state saved with this checkpoint's model"):
        load_optimizer_state(step4 / "optimizer.safetensors", model, make_optimizer(model, C),
                             meta_of(step4)[OPTIMIZER_DIGEST])
