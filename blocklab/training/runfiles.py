"""What a run folder holds, and how it is written and read back, every file checked on reading::

    config.json                model config, train config, task: everything to rebuild the run
    metrics.jsonl              one strict-JSON object per logged step
    checkpoints/step-000400/   model.safetensors, optimizer.safetensors, state.json
    report.html

Every JSON file blocklab writes is strict JSON: a non-finite number (NaN, Infinity) is written as
null, and ``read_metrics`` reads null back as NaN. A checkpoint folder is written under a
temporary name and renamed into place once complete, so ``checkpoints/`` only ever shows whole
checkpoints; older ones are pruned after that. Which folders may be written at all is
``blocklab.files.folders``' business.
"""

from __future__ import annotations

import math
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..files.atomic import atomic_write_bytes, fsync_dir, open_folder, refuse_links_below
from ..files.folders import CHECKPOINTS, CONFIG, METRICS, OWNED, REPORT, check_owned, check_owned_names
from ..files.jsonfiles import json_line, parse_json, read_json_object
from ..files.reading import MB, read_text
from ..nn.config import ModelConfig
from ..nn.config import from_saved_dict as model_config_from_dict
from ..version import __version__
from .train_config import TrainConfig, train_config_from_dict

STEP_DIR = re.compile(r"^step-(\d+)$")
LEFTOVER = re.compile(r"^\.(tmp|old)-step-\d+-\d+$")  # a checkpoint being written or replaced




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
METRIC_NUMBERS = ("loss", "lr", "grad_norm", "eval_loss", "eval_accuracy", "eval_exact_match",
                  "eval_token_accuracy", "eval_perplexity", "eval_bits_per_char", "time", "tokens_per_s")


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


METRICS_LIMIT = 1024 * MB  # a long run logs a few hundred bytes a step


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The metrics lines of a run (a folder or the metrics.jsonl file), null read back as NaN.

    A torn last line (a crash mid-write) is skipped; any other line that is not a metrics object
    is a ValueError naming the file and the line, as is a metrics.jsonl that is not a regular file.
    """
    path = Path(path)
    path = path / METRICS if path.is_dir() else path
    if not path.exists() and not path.is_symlink():
        return []
    lines = read_text(path, "a run's metrics.jsonl", METRICS_LIMIT).splitlines()
    rows = []
    for number, line in enumerate(lines, 1):
        try:
            row = parse_json(line, f"{path} line {number}", metrics_row_problem)
        except ValueError:
            if number == len(lines) and not _complete_json(line):
                continue  # a crash mid-write leaves at most one partial line, the last
            raise
        rows.append(_nan_for_null(row))
    return rows


def _complete_json(line: str) -> bool:
    try:
        parse_json(line, "")
    except ValueError:
        return False
    return True


def truncate_metrics(path: str | Path, last_step: int) -> None:
    """Keep only the lines up to ``last_step`` (a resumed run rewrites what came after)."""
    path = Path(path)
    rows = [r for r in read_metrics(path) if r["step"] <= last_step]
    atomic_write_bytes(path, "".join(json_line(r) for r in rows).encode())


# ---- checkpoints -----------------------------------------------------------------------------------


def checkpoint_dirs(folder: str | Path) -> list[tuple[int, Path]]:
    """The complete checkpoints of a run, ``(step, path)``, oldest first."""
    root = Path(folder) / CHECKPOINTS
    if not root.is_dir() or root.is_symlink():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir()
             if (m := STEP_DIR.match(p.name)) and p.is_dir() and not p.is_symlink()]
    return sorted(found)


def latest_checkpoint(folder: str | Path) -> Path | None:
    """The newest complete checkpoint folder of a run, or None."""
    dirs = checkpoint_dirs(folder)
    return dirs[-1][1] if dirs else None


def checkpoint_step(folder: str | Path) -> int:
    """The step a ``checkpoints/step-N`` folder's name says."""
    match = STEP_DIR.match(Path(folder).name)
    if match is None:
        raise ValueError(f"{folder}: not a checkpoint folder (expected a name like step-000400)")
    return int(match.group(1))


def remove_leftovers(root: Path) -> None:
    for leftover in root.iterdir():
        if LEFTOVER.match(leftover.name):  # from a killed or failed save
            shutil.rmtree(leftover, ignore_errors=True)


def publish_checkpoint(folder: str | Path, step: int, write: Callable[[Path], None], keep: int) -> Path:
    """Create ``checkpoints/step-N`` atomically: ``write(tmp_dir)`` fills a temporary folder, which
    is renamed into place; only then are checkpoints beyond the newest ``keep`` removed. A failed
    write (disk full, Ctrl-C) removes its temporary folder and leaves the previous checkpoints."""
    folder = Path(folder)
    root = folder / CHECKPOINTS
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-step-{step:06d}-{os.getpid()}"
    replaced = root / f".old-step-{step:06d}-{os.getpid()}"
    for path in (final, tmp, replaced):  # a link planted among them is refused, never followed
        refuse_links_below(folder, path)
    os.close(open_folder(root, folder))  # checkpoints/, made without following a link
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


def run_files(folder: Path) -> list[str]:
    """The files of a run already in ``folder`` (config.json, metrics.jsonl, checkpoints, report.html)."""
    return [name for name in (CONFIG, METRICS, CHECKPOINTS, REPORT) if (folder / name).exists()]


def check_run_names(folder: Path) -> None:
    """``check_owned_names`` for a run folder, and its ``checkpoints/step-N`` and unfinished saves, which
    must be real folders (never links): checked before a run writes or prunes anything."""
    check_owned_names(folder, "run")
    root = folder / CHECKPOINTS
    if root.is_dir() and not root.is_symlink():
        for entry in root.iterdir():
            if STEP_DIR.match(entry.name) or LEFTOVER.match(entry.name):
                check_owned(entry, folder_expected=True)


def clear_run(folder: Path) -> None:
    """Remove a previous run's files from ``folder``: only the names a run writes (``OWNED``), and in
    ``checkpoints/`` only ``step-N`` folders and unfinished saves. Anything else stays. Nothing is
    removed unless every one of them is blocklab's kind of file (``check_run_names``)."""
    check_run_names(folder)
    for name in OWNED["run"]:
        path = folder / name
        if name == CHECKPOINTS and path.is_dir():
            for _, step_dir in checkpoint_dirs(folder):
                shutil.rmtree(step_dir)
            remove_leftovers(path)
            if not any(path.iterdir()):
                path.rmdir()
        elif path.is_file():
            path.unlink()
