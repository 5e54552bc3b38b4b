"""What the commands use when nothing is named: where ``blocklab train`` writes without ``--out``, and the
model ``blocklab trace`` and ``blocklab explore`` open without ``--preset``, ``--model`` or a config flag:
the README's main run (``make train``) when it holds a checkpoint, else the preset ``DEFAULT_PRESET``,
with a note saying its weights are random and how to train.
"""

from __future__ import annotations

from pathlib import Path

from ..tasks import DEFAULT_TASK


def default_out(task: str) -> Path:
    """The run folder ``blocklab train --task TASK`` writes without ``--out``: runs/TASK."""
    return Path("runs") / task


# The README's main job (`make train`: `blocklab train`), which trace and explore open when no model is named
MAIN_RUN = default_out(DEFAULT_TASK)
DEFAULT_PRESET = "listops-seed"
MAIN_OR_PRESET = f"with no --model, the trained {MAIN_RUN} when it exists, else {DEFAULT_PRESET}"
# What trace and explore say, with the random preset, when the main run holds no checkpoint
NO_MAIN_RUN = (f"there is no trained model in {MAIN_RUN}: `blocklab train` (what `make train` runs) trains "
               "the README's model there in seconds, and trace and explore open it when no --preset or "
               "--model is given")


def main_run() -> str | None:
    """The README's main run (``MAIN_RUN``, from the current folder) when it holds a checkpoint, else None."""
    from ..weights.load import locate

    try:
        locate(MAIN_RUN)
    except (ValueError, OSError):  # no folder, or a run with no checkpoint yet
        return None
    return str(MAIN_RUN)
