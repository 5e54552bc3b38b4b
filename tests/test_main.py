"""The ``blocklab`` console script (blocklab/__main__.py): Ctrl-C while it starts is one line."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points

import pytest

# The console script as pip wrote it, run in a process where Ctrl-C arrives while a module is imported:
# an import hook sends SIGINT to the process the moment the import of that module begins.
STARTUP = """
import importlib, os, signal, sys

class CtrlCAt:
    def find_spec(self, name, path=None, target=None):
        if name == {module!r}:
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, CtrlCAt())
sys.argv = ["blocklab", "params"]
module, _, function = {entry!r}.partition(":")
sys.exit(getattr(importlib.import_module(module), function)())
"""


@pytest.mark.parametrize("module", [
    "torch",  # issue 30, E8: Ctrl-C in the first second printed a 40-line traceback
    "blocklab.errors",  # issue 35, E8: the console script's own imports, before run() began, likewise
])
@pytest.mark.usefixtures("ctrl_c")  # the child must start with Python's own SIGINT handler
def test_ctrl_c_while_the_command_starts_is_one_line_and_status_130(module: str) -> None:
    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "blocklab"]
    child = subprocess.run([sys.executable, "-c", STARTUP.format(entry=script.value, module=module)],
                           capture_output=True, text=True, timeout=120, check=False)
    assert child.returncode == 130, child.stderr[-2000:]
    assert child.stderr == "blocklab: interrupted while starting\n"


def test_dash_capital_v_prints_the_version(capsys: pytest.CaptureFixture[str]) -> None:
    from blocklab import __version__
    from blocklab.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["-V"])
    assert exit_.value.code == 0 and capsys.readouterr().out == f"blocklab {__version__}\n"
