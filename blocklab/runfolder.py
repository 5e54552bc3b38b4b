"""A training run's folder: lock, ``config.json``, ``metrics.jsonl``, checkpoints, ``report.html``.

    runs/NAME/
      .lock                      held (flock) by the live run; holds its PID
      config.json                model config, train config, task: everything to rebuild the run
      metrics.jsonl              one JSON object per logged step
      checkpoints/step-000400/   model.safetensors, optimizer.safetensors, state.json
      report.html

A checkpoint folder is written under a temporary name and renamed into place once complete,
so ``checkpoints/`` only ever shows whole checkpoints; older ones are pruned after that.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import socket
from pathlib import Path
from typing import Any

import torch

from .checkpoint import atomic_write_bytes, fsync_dir
from .version import __version__

CONFIG = "config.json"
METRICS = "metrics.jsonl"
REPORT = "report.html"
LOCK = ".lock"
CHECKPOINTS = "checkpoints"
MODEL_FILE = "model.safetensors"
_STEP_DIR = re.compile(r"^step-(\d+)$")


class RunLockedError(ValueError):
    """Another live process holds the run folder."""


class RunLock:
    """An exclusive lock on a run folder: ``flock`` on ``.lock``, which records the holder's PID.

    The kernel drops a flock when its process dies, so the lock of a killed run (a stale
    ``.lock`` naming a dead PID) is simply taken over by the next run.
    """

    def __init__(self, folder: str | Path) -> None:
        self.path = Path(folder) / LOCK
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        """Take the lock or raise RunLockedError naming the holder's PID."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = lock_holder(self.path.parent)
            who = f"pid {holder.get('pid')} on {holder.get('host')}" if holder else "another process"
            raise RunLockedError(
                f"{self.path.parent} is in use by another blocklab run ({who}); "
                "wait for it to finish or choose another --out"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode())
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        """Drop the lock and remove the file (idempotent)."""
        if self._fd is None:
            return
        self.path.unlink(missing_ok=True)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_holder(folder: str | Path) -> dict[str, Any] | None:
    """The ``{"pid", "host"}`` recorded in a run folder's lock file, if any."""
    try:
        return json.loads((Path(folder) / LOCK).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def write_json(path: str | Path, data: dict[str, Any]) -> None:
    """Atomically write pretty JSON."""
    atomic_write_bytes(path, (json.dumps(data, indent=2) + "\n").encode())


def read_json(path: str | Path) -> dict[str, Any]:
    """Read a JSON object; ValueError naming the file when it is not valid JSON."""
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from None


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The metrics lines of a run (a folder or the metrics.jsonl file); a torn last line is skipped."""
    path = Path(path)
    path = path / METRICS if path.is_dir() else path
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a crash mid-write leaves at most one partial line
    return rows


def truncate_metrics(path: str | Path, last_step: int) -> None:
    """Keep only the lines up to ``last_step`` (a resumed run rewrites what came after)."""
    path = Path(path)
    rows = [r for r in read_metrics(path) if r.get("step", 0) <= last_step]
    atomic_write_bytes(path, "".join(json.dumps(r) + "\n" for r in rows).encode())


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


def publish_checkpoint(folder: str | Path, step: int, write: Any, keep: int) -> Path:
    """Create ``checkpoints/step-N`` atomically: ``write(tmp_dir)`` fills a temporary folder, which
    is renamed into place; only then are checkpoints beyond the newest ``keep`` removed."""
    root = Path(folder) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-step-{step:06d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    write(tmp)
    fsync_dir(tmp)
    replaced = root / f".old-step-{step:06d}-{os.getpid()}"
    if final.exists():  # re-saving a step: move the old one aside, never leave no checkpoint
        os.rename(final, replaced)
    os.rename(tmp, final)
    fsync_dir(root)
    shutil.rmtree(replaced, ignore_errors=True)
    for _, old in checkpoint_dirs(folder)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for leftover in [*root.glob(".tmp-step-*"), *root.glob(".old-step-*")]:  # from a killed run
        shutil.rmtree(leftover, ignore_errors=True)
    return final


def resolve_checkpoint(path: str | Path) -> Path:
    """A model file from a file, a checkpoint folder or a run folder (its newest checkpoint)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(2, "no such checkpoint", str(path))
    if path.is_file():
        return path
    if (path / MODEL_FILE).is_file():
        return path / MODEL_FILE
    latest = latest_checkpoint(path)
    if latest is None:
        raise ValueError(f"{path} holds no checkpoint (expected {MODEL_FILE} or {CHECKPOINTS}/step-N/)")
    return latest / MODEL_FILE


def run_config(model_config: Any, train_config: Any, task: Any, world_size: int = 1) -> dict[str, Any]:
    """config.json: everything needed to rebuild the run."""
    return {
        "model": model_config.to_dict(),
        "train": train_config.to_dict(),
        "task": task.to_dict(),
        "world_size": world_size,
        "versions": {"blocklab": __version__, "torch": torch.__version__},
    }


def run_files(folder: Path) -> list[str]:
    """The files of a run already in ``folder`` (config.json, metrics.jsonl, checkpoints, report.html)."""
    return [name for name in (CONFIG, METRICS, CHECKPOINTS, REPORT) if (folder / name).exists()]


def clear_run(folder: Path) -> None:
    """Remove a previous run's files from ``folder`` (nothing else in it)."""
    for name in run_files(folder):
        shutil.rmtree(folder / name) if (folder / name).is_dir() else (folder / name).unlink()
