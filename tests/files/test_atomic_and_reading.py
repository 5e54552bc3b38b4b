"""The one writer and the one reader (blocklab/files: atomic.py, reading.py, jsonfiles.py): a symbolic
link is never written through, a pipe never blocks a read, a file is never read past its cap or parsed
past its depth, and every refusal is one line naming the path."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest

from blocklab.files.atomic import atomic_write_bytes, open_regular, refuse_links_below
from blocklab.files.jsonfiles import MAX_JSON_DEPTH, parse_json, read_json, write_json
from blocklab.files.reading import read_regular_bytes


def _one_line(error: pytest.ExceptionInfo[BaseException], *fragments: str) -> None:
    message = str(error.value)
    assert "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, message


# ---- writing -------------------------------------------------------------------------------------------


def test_a_file_is_replaced_whole_and_gets_the_usual_mode(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "out.json"
    atomic_write_bytes(path, b"old")
    atomic_write_bytes(path, b"new")
    assert path.read_bytes() == b"new"
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask
    assert sorted(p.name for p in path.parent.iterdir()) == ["out.json"]  # no temporary file left


@pytest.mark.parametrize("dangling", [False, True])
def test_a_link_at_the_file_is_refused_naming_it_and_its_target_is_untouched(tmp_path: Path,
                                                                            dangling: bool) -> None:
    target = tmp_path / "victim.txt"
    if not dangling:
        target.write_text("precious")
    link = tmp_path / "report.html"
    link.symlink_to(target)
    for write in (lambda: atomic_write_bytes(link, b"new"), lambda: write_json(link, {"a": 1}),
                  lambda: atomic_write_bytes(link, b"new", stream=True)):
        with pytest.raises(ValueError) as info:
            write()
        _one_line(info, str(link), "symbolic link", str(target))
    assert link.is_symlink()
    assert target.read_text() == "precious" if not dangling else not target.exists()


def test_a_link_between_the_owned_folder_and_the_file_is_refused(tmp_path: Path) -> None:
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run.mkdir()
    elsewhere.mkdir()
    (run / "checkpoints").symlink_to(elsewhere)
    with pytest.raises(ValueError) as info:
        atomic_write_bytes(run / "checkpoints" / "step-000001" / "state.json", b"{}", root=run)
    _one_line(info, str(run / "checkpoints"), "symbolic link")
    with pytest.raises(ValueError, match="symbolic link"):
        refuse_links_below(run, run / "checkpoints" / "step-000001")
    assert list(elsewhere.iterdir()) == []
    atomic_write_bytes(tmp_path / "link-free" / "a" / "b.json", b"{}", root=tmp_path / "link-free")
    assert (tmp_path / "link-free" / "a" / "b.json").read_bytes() == b"{}"


def test_a_folder_or_pipe_where_a_file_goes_is_refused_unless_the_user_named_a_stream(tmp_path: Path) -> None:
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    with pytest.raises(ValueError) as info:
        atomic_write_bytes(fifo, b"{}")  # no reader: a write into it would block; refused at once
    _one_line(info, str(fifo), "a named pipe, not a regular file")
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(ValueError, match="a folder, not a regular file"):
        atomic_write_bytes(tmp_path / "dir.json", b"{}")
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    atomic_write_bytes(fifo, b'{"a": 1}\n', stream=True)  # --json out.json naming a pipe: written into
    reader.join(timeout=60)
    assert received == [b'{"a": 1}\n'] and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    atomic_write_bytes(os.devnull, b"x", stream=True)
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


def test_a_file_opened_in_place_is_never_a_link_or_a_pipe(tmp_path: Path) -> None:
    target = tmp_path / "v.txt"
    target.write_text("precious")
    (tmp_path / ".lock").symlink_to(target)
    with pytest.raises(ValueError) as info:
        open_regular(tmp_path / ".lock", os.O_RDWR | os.O_CREAT)
    _one_line(info, str(tmp_path / ".lock"), "symbolic link")
    os.mkfifo(tmp_path / "metrics.jsonl")
    with pytest.raises(ValueError, match="a named pipe, not a regular file"):
        open_regular(tmp_path / "metrics.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    assert target.read_text() == "precious"
    os.close(open_regular(tmp_path / "fresh.log", os.O_WRONLY | os.O_CREAT))
    assert (tmp_path / "fresh.log").is_file()


# ---- reading -------------------------------------------------------------------------------------------


def test_a_pipe_a_device_or_a_folder_is_refused_without_reading(tmp_path: Path) -> None:
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)  # no writer: a blocking open would wait forever
    for path, found in ((fifo, "a named pipe"), (Path("/dev/zero"), "a device"), (tmp_path, "a folder")):
        with pytest.raises(ValueError) as info:
            read_json(path, "a run's config.json")
        _one_line(info, str(path), found, "a run's config.json")


def test_a_file_larger_than_its_cap_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    with open(path, "wb") as f:
        f.truncate(10**12)  # a sparse terabyte
    with pytest.raises(ValueError) as info:
        read_regular_bytes(path, "a marker", limit=1000)
    _one_line(info, str(path), "1,000,000,000,000 bytes", "more than the 1,000")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[" * 100_000, f"nested deeper than {MAX_JSON_DEPTH}"),
        ("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1), f"nested deeper than {MAX_JSON_DEPTH}"),
        ('{"a": NaN}', "not valid JSON (NaN is not valid JSON"),
        ("\xff", "not valid JSON"),
        ("[1,", "not valid JSON"),
    ],
)
def test_deep_non_strict_or_broken_json_is_one_line(text: str, fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_json(text.encode("latin-1"), "x.json")
    _one_line(info, "x.json: ", fragment)


def test_json_at_the_depth_cap_parses_and_the_schema_runs_before_the_caller_sees_it(tmp_path: Path) -> None:
    deep = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert parse_json(deep, "x") == json.loads(deep)
    path = tmp_path / "result.json"
    path.write_text("[]")
    with pytest.raises(ValueError) as info:
        read_json(path, "a result", check=lambda v: None if isinstance(v, dict) else "expected an object")
    _one_line(info, f"{path}: expected an object")
