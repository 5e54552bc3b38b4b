"""Child processes: the process tree, read from /proc (Linux), for what a test checks is left running
after a command ends; and what a failed command said, for an assertion's message."""

from __future__ import annotations

import re
from pathlib import Path

ERROR_LINE = re.compile(r"error|exception|traceback|terminate|abort|fatal", re.IGNORECASE)


def failure_text(stderr: str, lines: int = 30, tail: int = 2000) -> str:
    """A failed command's stderr for an assertion message: ``lines`` lines from the first one naming an
    error, then the last ``tail`` characters. Under torchrun the failing child's own message comes
    first and the launcher's summary (its traceback, the ranks' exit codes) pushes it out of the tail."""
    all_lines = stderr.splitlines()
    first = next((i for i, line in enumerate(all_lines) if ERROR_LINE.search(line)), len(all_lines))
    head = "\n".join(all_lines[first : first + lines])
    end = stderr[-tail:]
    return end if head in end else f"{head}\n[...]\n{end}"


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (from /proc), zombies excluded."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
