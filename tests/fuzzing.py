"""Shared pieces of the fuzz tests (hypothesis): JSON-like values, damaged versions of a valid object,
and the outcome rule (a result, or a one-line ValueError; nothing else, nothing outside the sandbox).

Imported by ``test_fuzz_loaders.py``; the CLI fuzz test can reuse ``json_values``, ``damaged`` and
``Sandbox`` for the command line (an argument list instead of a file, exit 0 or 2 instead of a
ValueError). The planted attacks (issue 30's classes: a symbolic link where a command writes, a named
pipe where it reads, deep, wrong-typed or oversized JSON, a sparse file declaring a huge tensor) and
``checksums``, which shows that nothing outside a command's own files changed, serve both.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st


def examples(n: int) -> int:
    """A property test's ``n`` examples, times the loaded profile's multiple of hypothesis' default 100:
    ``pytest --hypothesis-profile=thorough`` (tests/conftest.py) draws 20 times as many, a check of the
    contracts run by hand, not in CI."""
    return n * max(1, settings.default.max_examples // 100)


SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(["", "x", "-1", "1e999", "../outside/canary", "/", ".", "~", "nan", "true", "false"])
)

json_values = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path inside nested dicts (the places a damage can land)."""
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, inner in value.items():
            found += _paths(inner, (*prefix, key))
    return found


@st.composite
def damaged(draw: Callable, valid: dict[str, Any]) -> dict[str, Any]:
    """``valid`` with a few of its fields (at any depth) replaced by random values, removed, or joined
    by unknown ones: mostly almost-right objects, which reach the deep checks."""
    data = json.loads(json.dumps(valid))
    paths = _paths(data)
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        path = draw(st.sampled_from(paths))
        parent = data
        for key in path[:-1]:
            parent = parent.get(key) if isinstance(parent, dict) else None
        if not isinstance(parent, dict):
            continue
        action = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(json_values)
        elif action == "delete":
            parent.pop(path[-1], None)
        else:
            parent[draw(st.text(max_size=8))] = draw(json_values)
    return data


def file_texts(valid: dict[str, Any]) -> st.SearchStrategy[str]:
    """The text of a JSON file: mostly a damaged ``valid``, sometimes any JSON, sometimes not JSON."""
    return st.one_of(
        damaged(valid).map(json.dumps),
        damaged(valid).map(lambda d: json.dumps(d).replace("null", "NaN", 1)),
        json_values.map(json.dumps),
        st.text(max_size=40),
    )


def one_line_or_result(action: Callable[[], Any]) -> Any:
    """Run ``action``: its result, or None when it raised a one-line ValueError. Any other exception
    (KeyError, TypeError, ...) propagates, failing the test."""
    try:
        return action()
    except ValueError as error:
        message = str(error)
        assert message.strip() and "\n" not in message, repr(message)
        return None


WARNING = "blocklab: warning: "


def assert_cli_outcome(status: int, err: str, context: object = None) -> None:
    """The command line's contract, for every case a fuzzer can draw: exit 0, 2 (a mistake) or 1 (a run
    that diverged, its own report); never a traceback or an internal error. A failure's stderr is
    blocklab's own lines only: any number of one-line warnings (a warmup longer than the run, ...), then
    exactly one error line, the last (``training stopped at step ...`` for status 1)."""
    shown = (context, status, err)
    assert "Traceback" not in err and "internal error" not in err, shown
    assert status in (0, 1, 2), shown
    lines = err.splitlines()
    errors = [line for line in lines if line.startswith("blocklab: error: ")]
    if status == 0:
        assert errors == [], shown
        return
    assert len(errors) == 1 and lines[-1] == errors[0], shown
    assert all(line.startswith(WARNING) for line in lines[:-1]), shown
    if status == 1:
        assert errors[0].startswith("blocklab: error: training stopped at step"), shown


class Sandbox:
    """A folder the code under test may write (``inside``) next to one it must never touch
    (``outside``, with canary files); ``untouched()`` says whether everything outside is as it was."""

    def __init__(self, root: Path) -> None:
        self.root, self.inside, self.outside = root, root / "sandbox", root / "outside"
        self.inside.mkdir(parents=True, exist_ok=True)
        (self.outside / "checkpoints").mkdir(parents=True, exist_ok=True)
        for name in ("canary", "config.json", "metrics.jsonl", "checkpoints/step-000001"):
            (self.outside / name).write_text(f"not yours: {name}")
        self.before = self._state()

    def _state(self) -> dict[str, tuple[bytes, int]]:
        found = {str(p.relative_to(self.root)): (p.read_bytes(), p.stat().st_mtime_ns)
                 for p in sorted(self.root.rglob("*")) if p.is_file() and self.inside not in p.parents}
        found["<entries>"] = (json.dumps(sorted(p.name for p in self.root.iterdir())).encode(), 0)
        return found

    def untouched(self) -> bool:
        """Whether nothing outside ``inside`` was created, changed or removed."""
        return self._state() == self.before


# ---- planted attacks: the classes of issue 30 ------------------------------------------------------------


def checksums(root: Path) -> dict[str, str]:
    """What every entry under ``root`` is, links not followed: a file's sha256 (a planted file of gigabytes:
    its size, inode and modification time), a link's target, a pipe, a folder. Two equal results mean
    nothing there was created, changed or removed."""
    import hashlib
    import stat

    found = {}
    for path in sorted(root.rglob("*")):
        mode = path.lstat().st_mode
        key = str(path.relative_to(root))
        if stat.S_ISLNK(mode):
            found[key] = f"link -> {os.readlink(path)}"
        elif stat.S_ISREG(mode) and path.stat().st_size > 64 * 2**20:  # a planted sparse file: never read
            info = path.stat()
            found[key] = f"large file {info.st_size} bytes, inode {info.st_ino}, mtime {info.st_mtime_ns}"
        elif stat.S_ISREG(mode):
            found[key] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            found[key] = "folder" if stat.S_ISDIR(mode) else "fifo" if stat.S_ISFIFO(mode) else "other"
    return found


def _clear(path: Path) -> None:
    if path.is_symlink() or path.is_file() or path.exists() and not path.is_dir():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def plant_link(path: Path, target: Path) -> None:
    """Replace ``path`` (file or folder) by a symbolic link to ``target``."""
    _clear(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)


def plant_fifo(path: Path) -> None:
    """Replace ``path`` by a named pipe that nothing writes to: a blocking read would wait forever."""
    _clear(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)


DEEP_JSON = "[" * 100_000 + "]" * 100_000  # RecursionError in any recursive parser or walker
WRONG_TYPED_JSON = "[1]"  # every JSON file blocklab reads holds an object


def plant_oversized(path: Path, size: int) -> None:
    """Replace ``path`` by a sparse file of ``size`` bytes (no disk used): only a size check is quick."""
    _clear(path)
    with open(path, "wb") as f:
        f.truncate(size)


def sparse_safetensors(path: Path, shapes: dict[str, tuple[int, ...]], metadata: dict[str, str]) -> None:
    """A safetensors file whose header declares F32 tensors of ``shapes`` (gigabytes, say), their data a
    hole: the file is as large as its header says and holds almost nothing on disk."""
    header, offset = {"__metadata__": metadata}, 0
    for name, shape in shapes.items():
        nbytes = 4
        for n in shape:
            nbytes *= n
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    data = json.dumps(header).encode()
    data += b" " * (-len(data) % 8)
    _clear(path)
    with open(path, "wb") as f:
        f.write(len(data).to_bytes(8, "little") + data)
        f.truncate(8 + len(data) + offset)
