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
and one a live run holds (the lock). A folder is adopted only by its own marker: nothing else makes a
folder blocklab's. Inside a folder it owns, every name blocklab writes (``OWNED``, the marker, the lock,
the checkpoint folders) must be a regular file or a real folder, never a symbolic link, a pipe or a
device (``check_owned_names``, before anything is written; the writer, ``atomic``, refuses links
again as it writes). ``training.runfiles.clear_run`` removes only the names a run writes (``OWNED``),
never the folder or anything else in it. A single output file (``check_output_file``) is never one of
the command's inputs, inside a folder the command reads or will own, or inside a blocklab folder, and
its folder must be one a file can be created in.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket
import stat
import tempfile
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..version import __version__
from .atomic import atomic_write_bytes, kind_of, link_refusal, open_regular
from .jsonfiles import read_json, read_json_object, write_json
from .reading import read_regular_bytes

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
        fd = open_regular(self.path, os.O_RDWR | os.O_CREAT)  # never through a link, never a pipe
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
        holder = json.loads(read_regular_bytes(Path(folder) / LOCK, "a run's lock file", 4096))
    except (OSError, ValueError, RecursionError):
        return None
    return holder if isinstance(holder, dict) else None


def check_owned_names(folder: Path, kind: str) -> None:
    """ValueError naming the first of the names blocklab writes in a ``kind`` folder (``OWNED``, the
    marker, the lock) that is a symbolic link, or not the regular file (or, for ``checkpoints``, the
    folder) blocklab would write there: found before anything is written."""
    for name in (*OWNED[kind], MARKER, LOCK):
        check_owned(folder / name, folder_expected=name == CHECKPOINTS)


def check_owned(path: Path, folder_expected: bool = False) -> None:
    """ValueError when ``path``, a name blocklab writes, is there as a symbolic link or as something
    other than a regular file (``folder_expected``: a real folder); nothing there is fine."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode):
        raise link_refusal(path)
    ok = stat.S_ISDIR(mode) if folder_expected else stat.S_ISREG(mode)
    if not ok:
        want = "a folder" if folder_expected else "a regular file"
        raise ValueError(f"{path} is {kind_of(mode)}, but blocklab writes {want} there; remove it or choose "
                         "another folder")


# ---- ownership -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Marker:
    """What ``blocklab-run.json`` says: the folder's kind, its id, who made it and when."""

    kind: str
    id: str
    blocklab: str
    created: str

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
    if not path.exists() and not path.is_symlink():
        return None
    check_owned(path)  # blocklab writes its marker as a regular file: a link or a pipe is not one
    data = read_json_object(path, "blocklab's folder marker", limit=64 * 1024)
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
    """The absolute path; ValueError for an empty one, one starting with an unexpanded ``~``, or one
    holding a control character (a newline would make every message naming it lie)."""
    text = str(path)
    if not text.strip():
        raise ValueError(f"{flag} is empty: name a {what}")
    if not text.isprintable():  # C0 and C1 controls (U+009B), line and paragraph separators (U+2028), ...
        raise ValueError(f"{flag} {text!r} holds a control character (a newline, a tab, U+2028, ...); name "
                         f"the {what} with printable characters")
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
    """Check that ``kind`` may be written into ``folder`` (module docstring); return its marker, or None
    for a new or empty folder."""
    if kind not in KINDS:
        raise ValueError(f"unknown folder kind {kind!r}; kinds are: {', '.join(KINDS)}")
    path = Path(folder)
    resolved = refuse_dangerous(path, flag)
    above = _marked_ancestor(resolved)
    if above is not None and (kind not in NESTS[above[1].kind] or resolved.relative_to(above[0]).parts[0]
                              in (*OWNED[above[1].kind], MARKER, LOCK)):
        raise ValueError(f"{flag} {path} is inside {above[0]}, {KINDS[above[1].kind]} ({MARKER}); "
                         f"choose a folder outside it")
    if not path.exists() and not path.is_symlink():
        return None
    if not path.is_dir():
        raise ValueError(f"{flag} {path} is a file, not a folder")
    marker = read_marker(path)
    if marker is not None and marker.kind != kind:
        raise ValueError(f"{flag} {path} is {KINDS[marker.kind]}, not {KINDS[kind]}; "
                         "choose another folder")
    if marker is None and _entries(path):
        raise ValueError(
            f"{flag} {path} is not empty and was not written by blocklab (no {MARKER}): it holds "
            f"{_describe(path, _entries(path))}; blocklab writes only into a new or empty folder or one "
            f"it made, so choose another {flag}"
        )
    check_owned_names(path, kind)
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


def check_output_file(path: str | Path, inputs: Iterable[str | Path] = (), flag: str = "--out",
                      owned: Iterable[str | Path] = ()) -> Path:
    """Refuse (ValueError) an output file that is a folder, a symbolic link (but to a device or a pipe:
    ``/dev/stdout``), one of the command's ``inputs`` (files or folders), inside an input folder, inside
    a folder the command will own (``owned``: its ``--out``), inside a blocklab folder, or in a place no
    file can be created (its folder is a file, or a file system such as /proc that makes none); return
    it resolved."""
    resolved = _resolved(path, flag, "file")
    if resolved.is_dir():
        raise ValueError(f"{flag} {path} is a folder; name a file to write")
    stream = _is_stream(path)
    if Path(path).is_symlink() and not stream:
        raise link_refusal(path)
    for given in inputs:
        source = Path(given).resolve()
        same = resolved.exists() and source.exists() and os.path.samefile(resolved, source)
        if resolved == source or same:
            raise ValueError(f"{flag} {path} is this command's input; write the output elsewhere")
        if source.is_dir() and source in resolved.parents:
            raise ValueError(f"{flag} {path} is inside {given}, which this command reads; write the output "
                             "elsewhere")
    for folder in owned:
        mine = Path(folder).resolve()
        if resolved == mine or mine in resolved.parents:
            raise ValueError(f"{flag} {path} is inside {folder}, the folder this command writes; write the "
                             "output elsewhere")
        if resolved in mine.parents:  # the command makes it a folder: the file would fail after the work
            raise ValueError(f"{flag} {path} is a folder above {folder}, the folder this command writes; "
                             "write the output elsewhere")
    above = _marked_ancestor(resolved)
    if above is not None:
        raise ValueError(f"{flag} {path} is inside {above[0]}, {KINDS[above[1].kind]} ({MARKER}); "
                         "write the output elsewhere")
    if not stream:
        _check_creatable(resolved, path, flag)
    return resolved


def _is_stream(path: str | Path) -> bool:
    """Whether ``path`` is (or a link names) a device or a pipe, which an output is written into."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


def _check_creatable(resolved: Path, given: str | Path, flag: str) -> None:
    """ValueError when no file can be created at ``resolved``: the nearest existing folder above it
    is a file, or it refuses a new file (tried with a temporary file, removed at once)."""
    parent = resolved.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{flag} {given}: {parent} is a file, not a folder; name a file in a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=".blocklab-probe-", dir=parent)
    except OSError as error:
        raise ValueError(f"{flag} {given}: no file can be created in {parent} ({error.strerror}); "
                         "write the output elsewhere") from None
    os.close(fd)
    os.unlink(probe)


def check_output_files(outputs: dict[str, str | Path | None], inputs: Iterable[str | Path] = (),
                       owned: Iterable[str | Path] = ()) -> None:
    """``check_output_file`` for each ``{flag: path}`` given (None: not asked for), and no two the same;
    run it before the command does its work (once the folders it will own are known), so a bad path
    costs nothing."""
    inputs, owned, seen = list(inputs), list(owned), {}
    for flag, path in outputs.items():
        if path is None:
            continue
        resolved = check_output_file(path, inputs, flag, owned)
        if resolved in seen:
            raise ValueError(f"{flag} {path} is also the {seen[resolved]} file; give each output a name")
        for other, other_flag in seen.items():
            if other in resolved.parents or resolved in other.parents:
                inner, outer = (flag, other_flag) if other in resolved.parents else (other_flag, flag)
                raise ValueError(f"{inner} {outputs[inner]} would be inside the {outer} file "
                                 f"{outputs[outer]}; give each output a place of its own")
        seen[resolved] = flag


def write_output_file(path: str | Path, data: bytes, inputs: Iterable[str | Path] = (),
                      flag: str = "--out") -> Path:
    """``check_output_file``, then write ``data`` atomically at ``path`` (never through a link; into a
    device or a pipe as it is)."""
    resolved = check_output_file(path, inputs, flag)
    atomic_write_bytes(path, data, stream=True)
    return resolved
