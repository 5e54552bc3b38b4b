"""The folders blocklab writes, and the rule that it writes only into its own.

A training run's folder (what its files hold: ``blocklab.training.runfiles``)::

    runs/NAME/
      blocklab-run.json          the marker: kind "run", run id, blocklab version, creation time
      .lock                      held (flock) by the live run; holds its PID
      config.json, metrics.jsonl, checkpoints/step-N/, report.html

Ownership (``claim_folder``): a command writes a folder only when it is new, empty (but for a
stale ``.lock``), or carries a marker of the same kind (``KINDS``). Refused outright: ``/`` and any
mount point, the home folder, the current directory and their parents, a path starting with ``~``
(not expanded here), a folder inside a blocklab folder that may not hold it (``NESTS``), a
non-empty folder without the marker (the message lists what is there), a folder of another kind,
and one a live run holds (the lock). Folders written by blocklab before the marker existed are
recognised by their contents (``legacy_kind``: a training run's config.json has blocklab's keys and
``versions.blocklab``; an ablation grid's summary.json its keys, or only such run folders below
it) and are adopted: the marker is written when the command proceeds. ``clear_run`` removes only
the names a run writes (``OWNED``), never the folder or anything else in it. A single output
file (``check_output_file``) is never one of the command's inputs, inside a folder the command
reads, or inside a blocklab folder.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import re
import socket
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..version import __version__
from .atomic import atomic_write_bytes
from .jsonfiles import read_json, read_json_object, write_json

# The names a run or grid folder holds (what each holds: training/runfiles.py)
CONFIG = "config.json"
METRICS = "metrics.jsonl"
REPORT = "report.html"
RESULT = "result.json"  # an ablation grid's per-run outcome
SUMMARY = "summary.json"  # an ablation grid's summary
CHECKPOINTS = "checkpoints"
MODEL_FILE = "model.safetensors"
MARKER = "blocklab-run.json"
LOCK = ".lock"

# The kinds of folder blocklab writes, and what each holds besides the marker and the lock.
KINDS: dict[str, str] = {
    "run": "a training run",
    "ablation": "an ablation grid",
    "export": "a Hugging Face export",
    "claims": "a claims run (its finished training runs)",
}
OWNED: dict[str, tuple[str, ...]] = {
    "run": (CONFIG, METRICS, CHECKPOINTS, REPORT, RESULT),
    "ablation": (SUMMARY, REPORT),  # and one folder per cell, each holding seed-K run folders
    "export": (MODEL_FILE, CONFIG, "tokenizer.json", "special_tokens_map.json"),
    "claims": (),  # one folder per claim, each holding <setup>/<run>/result.json
}
# Which kinds of folder may sit inside which (never inside one of the names the outer one owns, such
# as a run's checkpoints/, which it prunes): a run may hold other folders, a grid holds runs.
NESTS: dict[str, tuple[str, ...]] = {"run": tuple(KINDS), "ablation": ("run",), "export": (), "claims": ()}


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
        holder = json.loads((Path(folder) / LOCK).read_text())
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None


# ---- ownership -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Marker:
    """What ``blocklab-run.json`` says: the folder's kind, its id, who made it and when."""

    kind: str
    id: str
    blocklab: str
    created: str
    legacy: bool = False  # recognised by its contents (written before markers existed), not yet marked

    def to_dict(self) -> dict[str, Any]:
        """The marker file's content."""
        return {"format": "blocklab-folder", "kind": self.kind, "id": self.id, "blocklab": self.blocklab,
                "created": self.created}


def new_marker(kind: str) -> Marker:
    """A fresh marker of ``kind``: a new id, this blocklab version, now (UTC)."""
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return Marker(kind, uuid.uuid4().hex, __version__, now)


def read_marker(folder: str | Path) -> Marker | None:
    """The folder's marker, or None when it has none; ValueError when the marker is damaged."""
    path = Path(folder) / MARKER
    if not path.is_file():
        if path.exists() or path.is_symlink():
            raise ValueError(f"{path} is not a file; blocklab's marker is a JSON file")
        return None
    data = read_json_object(path, "blocklab's folder marker")
    fields = {name: data.get(name) for name in ("kind", "id", "blocklab", "created")}
    if data.get("format") != "blocklab-folder" or not all(isinstance(v, str) for v in fields.values()):
        raise ValueError(f"{path}: a damaged blocklab marker (expected format, kind, id, blocklab, created)")
    if fields["kind"] not in KINDS:
        raise ValueError(f"{path}: kind={fields['kind']!r} is not one of: {', '.join(KINDS)}")
    return Marker(**fields)


def write_marker(folder: str | Path, marker: Marker) -> None:
    """Write (atomically) the folder's marker."""
    write_json(Path(folder) / MARKER, marker.to_dict())


def _entries(folder: Path) -> list[str]:
    """What a folder holds, but blocklab's marker and lock."""
    return sorted(p.name for p in folder.iterdir() if p.name not in (MARKER, LOCK))


def is_run_config(data: Any) -> bool:
    """Whether a parsed config.json is one blocklab train wrote (its keys, ``versions.blocklab``)."""
    return (
        isinstance(data, dict)
        and all(isinstance(data.get(part), dict) for part in ("model", "train", "task", "versions"))
        and isinstance(data["versions"].get("blocklab"), str)
    )


def _legacy_run(folder: Path) -> bool:
    try:
        return is_run_config(read_json(folder / CONFIG))
    except (OSError, ValueError):
        return False


def legacy_kind(folder: Path) -> str | None:
    """The kind of a folder blocklab wrote before markers existed, from its contents (else None).

    A training run: its config.json has blocklab's keys and ``versions.blocklab``. An ablation grid:
    its summary.json has the grid's keys, or it holds only cell folders of ``seed-K`` runs.
    """
    if (folder / CONFIG).is_file():
        return "run" if _legacy_run(folder) else None
    try:
        summary = read_json(folder / SUMMARY) if (folder / SUMMARY).is_file() else None
    except (OSError, ValueError):
        return None
    if isinstance(summary, dict) and {"task", "vary", "seeds", "cells"} <= set(summary):
        return "ablation"
    cells = [folder / name for name in _entries(folder) if name != REPORT]
    runs = [run for cell in cells if cell.is_dir() for run in cell.iterdir()]
    if cells and all(cell.is_dir() for cell in cells) and runs and all(
        re.fullmatch(r"seed-\d+", run.name) and run.is_dir() and (_marked(run, "run") or _legacy_run(run))
        for run in runs
    ):
        return "ablation"
    return None


def _marked(folder: Path, kind: str) -> bool:
    try:
        marker = read_marker(folder)
    except (OSError, ValueError):
        return False
    return marker is not None and marker.kind == kind


def _describe(folder: Path, names: list[str], limit: int = 6) -> str:
    shown = [f"{n}/" if (folder / n).is_dir() else n for n in names[:limit]]
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    hint = ""
    if CONFIG in names:
        try:
            config = read_json(folder / CONFIG)
        except (OSError, ValueError):
            config = None
        if isinstance(config, dict) and "model_type" in config:
            hint = f" (its config.json has model_type={config['model_type']!r}: a Hugging Face model folder?)"
    return f"{', '.join(shown)}{more}{hint}"


def _home() -> Path | None:
    try:
        return Path.home().resolve()
    except (RuntimeError, KeyError):
        return None


def _resolved(path: str | Path, flag: str, what: str) -> Path:
    """The absolute path; ValueError for an empty one or one starting with an unexpanded ``~``."""
    text = str(path)
    if not text.strip():
        raise ValueError(f"{flag} is empty: name a {what}")
    if text.startswith("~"):
        raise ValueError(f"{flag} {text}: '~' is not expanded here; give the full path")
    return Path(path).resolve()


def refuse_dangerous(path: str | Path, flag: str = "--out") -> Path:
    """The resolved path; ValueError when it is a filesystem root or mount point, the home folder,
    the current directory or a folder holding one of them, or starts with an unexpanded ``~``."""
    text = str(path)
    resolved = _resolved(path, flag, "folder")
    why = None
    if resolved.parent == resolved or os.path.ismount(resolved):
        why = "a filesystem root"
    elif resolved == _home():
        why = "your home folder"
    elif (home := _home()) is not None and resolved in home.parents:
        why = f"a folder holding your home folder {home}"
    elif resolved == Path.cwd().resolve():
        why = "the current directory"
    elif resolved in Path.cwd().resolve().parents:
        why = "a folder holding the current directory"
    if why:
        raise ValueError(f"{flag} {text} is {why}; blocklab writes its runs into a folder of their own "
                         f"(for example {flag} runs/NAME)")
    return resolved


def _marked_ancestor(resolved: Path) -> tuple[Path, Marker] | None:
    for parent in resolved.parents:
        try:
            marker = read_marker(parent)
        except (OSError, ValueError):
            continue  # a damaged marker above is not ours to judge here
        if marker is not None:
            return parent, marker
    return None


def inspect_folder(folder: str | Path, kind: str, flag: str = "--out") -> Marker | None:
    """Check that ``kind`` may be written into ``folder`` (module docstring); return its marker
    (a legacy folder gets one with ``legacy=True``), or None for a new or empty folder."""
    if kind not in KINDS:
        raise ValueError(f"unknown folder kind {kind!r}; kinds are: {', '.join(KINDS)}")
    path = Path(folder)
    resolved = refuse_dangerous(path, flag)
    above = _marked_ancestor(resolved)
    if above is not None and (kind not in NESTS[above[1].kind]
                              or resolved.relative_to(above[0]).parts[0] in OWNED[above[1].kind]):
        raise ValueError(f"{flag} {path} is inside {above[0]}, {KINDS[above[1].kind]} ({MARKER}); "
                         f"choose a folder outside it")
    if not path.exists() and not path.is_symlink():
        return None
    if not path.is_dir():
        raise ValueError(f"{flag} {path} is a file, not a folder")
    marker = read_marker(path)
    if marker is None:
        found = legacy_kind(path)
        if found is not None:
            marker = Marker(found, "", "", "", legacy=True)
    if marker is not None and marker.kind != kind:
        raise ValueError(f"{flag} {path} is {KINDS[marker.kind]}, not {KINDS[kind]}; "
                         "choose another folder")
    if marker is None and _entries(path):
        raise ValueError(
            f"{flag} {path} is not empty and was not written by blocklab (no {MARKER}): it holds "
            f"{_describe(path, _entries(path))}; blocklab writes only into a new or empty folder or one "
            f"it made, so choose another {flag}"
        )
    return marker


def claim_folder(folder: str | Path, kind: str, flag: str = "--out") -> tuple[RunLock, Marker | None]:
    """Check ``folder`` (``inspect_folder``), create it, lock it (RunLockedError while a live
    process holds it) and check again under the lock. Returns the held lock and the marker found;
    the caller writes its marker (``write_marker``) once it decides to proceed."""
    inspect_folder(folder, kind, flag)
    lock = RunLock(folder).acquire()
    try:
        return lock, inspect_folder(folder, kind, flag)  # another process may have written meanwhile
    except BaseException:
        lock.release()
        raise


def check_output_file(path: str | Path, inputs: Iterable[str | Path] = (), flag: str = "--out") -> Path:
    """Refuse (ValueError) an output file that is a folder, one of the command's ``inputs`` (files or
    folders), inside an input folder, or inside a blocklab folder; return it resolved."""
    resolved = _resolved(path, flag, "file")
    if resolved.is_dir():
        raise ValueError(f"{flag} {path} is a folder; name a file to write")
    for given in inputs:
        source = Path(given).resolve()
        same = resolved.exists() and source.exists() and os.path.samefile(resolved, source)
        if resolved == source or same:
            raise ValueError(f"{flag} {path} is this command's input; write the output elsewhere")
        if source.is_dir() and source in resolved.parents:
            raise ValueError(f"{flag} {path} is inside {given}, which this command reads; write the output "
                             "elsewhere")
    above = _marked_ancestor(resolved)
    if above is not None:
        raise ValueError(f"{flag} {path} is inside {above[0]}, {KINDS[above[1].kind]} ({MARKER}); "
                         "write the output elsewhere")
    return resolved


def check_output_files(outputs: dict[str, str | Path | None], inputs: Iterable[str | Path] = ()) -> None:
    """``check_output_file`` for each ``{flag: path}`` given (None: not asked for), and no two the same;
    run it before the command does its work, so a bad path costs nothing."""
    inputs, seen = list(inputs), {}
    for flag, path in outputs.items():
        if path is None:
            continue
        resolved = check_output_file(path, inputs, flag)
        if resolved in seen:
            raise ValueError(f"{flag} {path} is also the {seen[resolved]} file; give each output a name")
        seen[resolved] = flag


def write_output_file(path: str | Path, data: bytes, inputs: Iterable[str | Path] = (),
                      flag: str = "--out") -> Path:
    """``check_output_file``, then write ``data`` atomically."""
    resolved = check_output_file(path, inputs, flag)
    atomic_write_bytes(resolved, data)
    return resolved
