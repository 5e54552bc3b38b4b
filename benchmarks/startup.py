"""How long the ``blocklab`` command takes to answer before it does any work: ``--version`` and
``--help`` (which answer before the library and torch load) against ``python -c pass`` (the
interpreter alone, the floor) and ``python -c "import torch"`` (what every real command pays), each a
fresh process, interleaved in rounds so that a drift of the machine hits every command alike.
Issue 28 asks for ``--version`` and ``--help`` under 0.3 s; a command's own ``--help`` (``train
--help``) loads its flags' tables and torch with them, and is shown for comparison.

    .venv/bin/python benchmarks/startup.py [--rounds 10]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

GOAL_SECONDS = 0.3  # issue 28: --version and --help


def commands() -> dict[str, list[str]]:
    """Each measured command, by its label; ``blocklab`` is the console script beside this Python."""
    script = Path(sys.executable).with_name("blocklab")
    blocklab = [str(script)] if script.exists() else [shutil.which("blocklab") or "blocklab"]
    return {
        "python -c pass": [sys.executable, "-c", "pass"],
        "python -c 'import torch'": [sys.executable, "-c", "import torch"],
        "blocklab --version": [*blocklab, "--version"],
        "blocklab --help": [*blocklab, "--help"],
        "blocklab train --help": [*blocklab, "train", "--help"],
    }


def wall_seconds(argv: list[str]) -> float:
    """One fresh process, start to exit; it must succeed."""
    start = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "COLUMNS": "100"})
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds (default 10)")
    args = parser.parse_args()
    measured = commands()
    times: dict[str, list[float]] = {label: [] for label in measured}
    for argv in measured.values():  # one unmeasured run each: the files in the page cache
        wall_seconds(argv)
    for _ in range(max(1, args.rounds)):
        for label, argv in measured.items():
            times[label].append(wall_seconds(argv))
    floor = statistics.median(times["python -c pass"])
    load = os.getloadavg()[0]
    print(f"start-up, a fresh process each (median of {args.rounds} interleaved rounds; load average "
          f"{load:.2f}); goal for --version and --help: under {GOAL_SECONDS} s")
    print(f"{'command':30s} {'median':>8s} {'min':>8s} {'over python':>12s}")
    for label, values in times.items():
        median = statistics.median(values)
        verdict = ""
        if label in ("blocklab --version", "blocklab --help"):
            verdict = "  under the goal" if median < GOAL_SECONDS else "  OVER the goal"
        print(f"{label:30s} {median:7.3f}s {min(values):7.3f}s {median - floor:+11.3f}s{verdict}")


if __name__ == "__main__":
    main()
