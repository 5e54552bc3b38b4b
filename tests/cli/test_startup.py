"""The command answers --version and --help before the library loads (issue 28: start-up); the
seconds are benchmarks/startup.py's business, never a test's. Checked here: the light path prints
exactly what the full parser prints, and loads neither torch nor a command module."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from blocklab.cli.main import build_parser
from blocklab.cli.parser import COMMAND_SUMMARIES

PROBE = """
import sys
from blocklab.cli.main import main
try:
    main([{flag!r}])
except SystemExit as stop:
    assert stop.code in (0, None), stop.code
heavy = sorted(m for m in sys.modules if m == "torch" or m.startswith("blocklab.cli.") and
               m not in ("blocklab.cli.main", "blocklab.cli.parser"))
print("LOADED:", ",".join(heavy))
"""


@pytest.mark.parametrize("flag", ["--version", "-V", "--help", "-h"])
def test_version_and_help_load_neither_torch_nor_a_command(flag: str) -> None:
    done = subprocess.run([sys.executable, "-c", PROBE.format(flag=flag)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "100"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "LOADED:"  # nothing heavy was imported


def test_the_light_help_is_the_full_parsers_help() -> None:
    light, full = build_parser(commands=False), build_parser()
    assert light.format_help() == full.format_help()
    assert full.commands() == list(COMMAND_SUMMARIES)  # every command has its line, in the help's order
