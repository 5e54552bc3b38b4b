"""Child processes: the process tree, read from /proc (Linux), for what a test checks is left running
after a command ends; and what a failed command said, for an assertion's message."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
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


# ---- Ctrl-C to a command's whole process group (what a terminal sends) at a chosen moment ----------


def workers_of(pid: int) -> list[int]:
    """The spawned worker processes below ``pid`` (multiprocessing's resource tracker excluded)."""
    found = []
    for child in descendants(pid):
        try:
            if b"spawn_main" in (Path("/proc") / str(child) / "cmdline").read_bytes():
                found.append(child)
        except OSError:
            pass
    return found


MOMENTS = {  # name -> whether the moment has come, from the parent's pid and its --out folder
    "workers importing torch": lambda pid, out: len(workers_of(pid)) >= 2,
    "a run finished": lambda pid, out: any(out.rglob("result.json")),
}


def ctrl_c_at(command: list[str], out: Path, moment: str) -> subprocess.CompletedProcess:
    """Run ``blocklab COMMAND --out OUT`` in its own process group and send SIGINT to the group when
    ``moment`` comes; what it said and its status. Its workers are gone when it has ended."""
    proc = subprocess.Popen([sys.executable, "-m", "blocklab", *command, "--out", str(out)],
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    workers: list[int] = []
    try:
        deadline = time.time() + 300  # a guard against a hang, not a measurement
        while not MOMENTS[moment](proc.pid, out):
            assert proc.poll() is None and time.time() < deadline, f"ended before {moment}: {proc.stderr}"
            time.sleep(0.02)
        workers = workers_of(proc.pid)
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
        deadline = time.time() + 30
        while any(alive(w) for w in workers) and time.time() < deadline:
            time.sleep(0.05)
        assert not [w for w in workers if alive(w)], "a worker outlived the command"
    finally:
        for pid in [proc.pid, *workers] if proc.poll() is None else workers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def assert_interrupted_cleanly(done: subprocess.CompletedProcess) -> None:
    """Status 130 and the interrupted line alone: no worker's KeyboardInterrupt traceback, no
    'terminate called without an active exception' (SIGABRT, status 134)."""
    assert done.returncode == 130, done.stderr[-3000:]
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("blocklab: interrupted; "), done.stderr[-3000:]
    assert "run the same command again" in lines[0]
