"""What a run folder holds, and how it is written and read back, every file checked on reading::

    config.json                model config, train config, task: everything to rebuild the run
    metrics.jsonl              one strict-JSON object per logged step
    checkpoints/step-000400/   model.safetensors, optimizer.safetensors, state.json
    report.html

Every JSON file blocklab writes is strict JSON: a non-finite number (NaN, Infinity) is written as
null, and ``read_metrics`` reads null back as NaN. A checkpoint folder is written under a
temporary name and renamed into place once complete, so ``checkpoints/`` only ever shows whole
checkpoints; older ones are pruned after that. Which folders may be written at all is
``runfolder``'s business.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .checkpoint import atomic_write_bytes, fsync_dir
from .config import ModelConfig
from .config import from_saved_dict as model_config_from_dict
from .trainconfig import TrainConfig, train_config_from_dict
from .version import __version__

CONFIG = "config.json"
METRICS = "metrics.jsonl"
REPORT = "report.html"
RESULT = "result.json"  # an ablation grid's per-run outcome
SUMMARY = "summary.json"  # an ablation grid's summary
CHECKPOINTS = "checkpoints"
MODEL_FILE = "model.safetensors"
_STEP_DIR = re.compile(r"^step-(\d+)$")
_LEFTOVER = re.compile(r"^\.(tmp|old)-step-\d+-\d+$")  # a checkpoint being written or replaced


# ---- strict JSON ------------------------------------------------------------------------------------


def json_safe(value: Any) -> Any:
    """``value`` with every NaN/Infinity replaced by None, so it serialises as strict JSON (null)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def json_line(row: dict[str, Any]) -> str:
    """One metrics.jsonl line: strict JSON (non-finite numbers as null) and a newline."""
    return json.dumps(json_safe(row), allow_nan=False) + "\n"


def write_json(path: str | Path, data: dict[str, Any]) -> None:
    """Atomically write pretty, strict JSON (non-finite numbers as null)."""
    atomic_write_bytes(path, (json.dumps(json_safe(data), indent=2, allow_nan=False) + "\n").encode())


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def read_json(path: str | Path) -> Any:
    """Parse a strict-JSON file; ValueError naming the file when it is not valid (NaN included)."""
    try:
        return json.loads(Path(path).read_bytes().decode("utf-8"), parse_constant=_reject_constant)
    except (ValueError, RecursionError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"{path}: not valid JSON ({error})") from None


def read_json_object(path: str | Path, what: str) -> dict[str, Any]:
    """A JSON file that must hold an object; ValueError naming the file and ``what`` it should be."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object ({what}), found {type(data).__name__}")
    return data


def _nan_for_null(value: Any) -> Any:
    if value is None:
        return math.nan
    if isinstance(value, dict):
        return {k: _nan_for_null(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nan_for_null(v) for v in value]
    return value


# ---- metrics.jsonl ----------------------------------------------------------------------------------

# Keys the trainer writes as numbers; a reader may rely on their type.
METRIC_NUMBERS = ("loss", "lr", "grad_norm", "eval_loss", "eval_accuracy", "time", "tokens_per_s")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def metrics_row_problem(row: Any) -> str | None:
    """Why a parsed metrics line is not one the trainer writes (None: it is fine)."""
    if not isinstance(row, dict):
        return f"expected a JSON object, found {type(row).__name__}"
    step = row.get("step")
    if not (isinstance(step, int) and not isinstance(step, bool) and step >= 0):
        return f"step={step!r} must be an integer >= 0"
    for key, value in row.items():
        numeric = key in METRIC_NUMBERS or key.startswith("grad_norm/")
        if numeric and not (value is None or _is_number(value)):
            return f"{key}={value!r} must be a number"
    return None


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The metrics lines of a run (a folder or the metrics.jsonl file), null read back as NaN.

    A torn last line (a crash mid-write) is skipped; any other line that is not a metrics object
    is a ValueError naming the file and the line.
    """
    path = Path(path)
    path = path / METRICS if path.is_dir() else path
    if not path.exists():
        return []
    try:
        lines = path.read_bytes().decode("utf-8").splitlines()
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text ({error.reason})") from None
    rows = []
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line, parse_constant=_reject_constant)
        except (ValueError, RecursionError) as error:
            if number == len(lines):
                continue  # a crash mid-write leaves at most one partial line, the last
            raise ValueError(f"{path} line {number}: not valid JSON ({error})") from None
        problem = metrics_row_problem(row)
        if problem:
            raise ValueError(f"{path} line {number}: {problem}")
        rows.append(_nan_for_null(row))
    return rows


def truncate_metrics(path: str | Path, last_step: int) -> None:
    """Keep only the lines up to ``last_step`` (a resumed run rewrites what came after)."""
    path = Path(path)
    rows = [r for r in read_metrics(path) if r["step"] <= last_step]
    atomic_write_bytes(path, "".join(json_line(r) for r in rows).encode())


# ---- checkpoints -----------------------------------------------------------------------------------


def checkpoint_dirs(folder: str | Path) -> list[tuple[int, Path]]:
    """The complete checkpoints of a run, ``(step, path)``, oldest first."""
    root = Path(folder) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir()]
    return sorted(found)


def latest_checkpoint(folder: str | Path) -> Path | None:
    """The newest complete checkpoint folder of a run, or None."""
    dirs = checkpoint_dirs(folder)
    return dirs[-1][1] if dirs else None


def checkpoint_step(folder: str | Path) -> int:
    """The step a ``checkpoints/step-N`` folder's name says."""
    match = _STEP_DIR.match(Path(folder).name)
    if match is None:
        raise ValueError(f"{folder}: not a checkpoint folder (expected a name like step-000400)")
    return int(match.group(1))


def remove_leftovers(root: Path) -> None:
    for leftover in root.iterdir():
        if _LEFTOVER.match(leftover.name):  # from a killed or failed save
            shutil.rmtree(leftover, ignore_errors=True)


def publish_checkpoint(folder: str | Path, step: int, write: Callable[[Path], None], keep: int) -> Path:
    """Create ``checkpoints/step-N`` atomically: ``write(tmp_dir)`` fills a temporary folder, which
    is renamed into place; only then are checkpoints beyond the newest ``keep`` removed. A failed
    write (disk full, Ctrl-C) removes its temporary folder and leaves the previous checkpoints."""
    root = Path(folder) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-step-{step:06d}-{os.getpid()}"
    replaced = root / f".old-step-{step:06d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        write(tmp)
        fsync_dir(tmp)
        if final.exists():  # re-saving a step: move the old one aside, never leave no checkpoint
            os.rename(final, replaced)
        os.rename(tmp, final)
        fsync_dir(root)
    except BaseException:
        if replaced.exists() and not final.exists():
            os.rename(replaced, final)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(replaced, ignore_errors=True)
    for _, old in checkpoint_dirs(folder)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    remove_leftovers(root)
    return final


def run_config(model_config: Any, train_config: Any, task: Any, world_size: int = 1) -> dict[str, Any]:
    """config.json: everything needed to rebuild the run."""
    return {
        "model": model_config.to_dict(),
        "train": train_config.to_dict(),
        "task": task.to_dict(),
        "world_size": world_size,
        "versions": {"blocklab": __version__, "torch": torch.__version__},
    }


@dataclass(frozen=True)
class SavedRun:
    """A run's config.json, validated: the configs it names and the whole file."""

    model: ModelConfig
    train: TrainConfig
    task: dict[str, Any]  # {"name": ..., **options}
    data: dict[str, Any]


def read_run_config(folder: str | Path) -> SavedRun:
    """A run's config.json, checked to be one blocklab wrote: ``model``, ``train`` and ``task``
    objects that make valid configs. ValueError naming the file and what is wrong."""
    path = Path(folder) / CONFIG
    if not path.is_file():
        raise ValueError(f"{Path(folder)} holds no {CONFIG}: not a blocklab run folder")
    data = read_json_object(path, "a blocklab run's configuration")
    if "model_type" in data and "model" not in data:
        raise ValueError(f"{path} is a Hugging Face model's config (model_type={data['model_type']!r}), "
                         "not a blocklab run's; --resume continues a run that blocklab train wrote")
    for part in ("model", "train", "task"):
        if not isinstance(data.get(part), dict):
            found = "missing" if part not in data else f"a {type(data[part]).__name__}"
            raise ValueError(f"{path}: {part!r} must be an object (the run's {part} settings); it is {found}")
    if not isinstance(data["task"].get("name"), str):
        raise ValueError(f"{path}: task.name={data['task'].get('name')!r} must be a task name")
    world_size = data.get("world_size", 1)
    if not (isinstance(world_size, int) and not isinstance(world_size, bool) and world_size >= 1):
        raise ValueError(f"{path}: world_size={world_size!r} must be an integer >= 1")
    try:
        model, train = model_config_from_dict(data["model"]), train_config_from_dict(data["train"])
    except (ValueError, TypeError) as error:
        raise ValueError(f"{path}: {error}") from None
    return SavedRun(model, train, data["task"], data)
