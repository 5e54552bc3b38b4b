"""What the commands use when nothing is named: where ``blocklab train`` writes without ``--out``, and the
model ``blocklab trace`` and ``blocklab explore`` open without ``--preset``, ``--model`` or a config flag:
the README's main run (``make train``) when it holds a checkpoint, else the character-level language model
blocklab ships (``SHIPPED_LM``), with a note saying what it is and how to train the README's model.
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
# The character-level language model blocklab ships (preset char-lm on the text task's Coriolanus, trained
# by scripts/ship_char_lm.py): what trace and explore open, trained, when the README's run does not exist
SHIPPED_LM = Path(__file__).resolve().parent.parent / "tasks" / "data" / "coriolanus-char-lm.safetensors"
MAIN_OR_PRESET = (f"with no --model, the trained {MAIN_RUN} when it exists, else the character-level "
                  "language model blocklab ships")
# What trace and explore say when they open the shipped model because the main run holds no checkpoint
NO_MAIN_RUN = ("this is the character-level language model blocklab ships (preset char-lm trained on the "
               "opening of Coriolanus by scripts/ship_char_lm.py): it predicts the next character. There "
               f"is no trained model in {MAIN_RUN}: `blocklab train` (what `make train` runs) trains the "
               "README's model there in seconds, and trace and explore open it when no --preset or --model "
               "is given")


def default_model() -> tuple[str, bool]:
    """(the model trace and explore open when nothing is named, whether it is the README's main run)."""
    run = main_run()
    return (run, True) if run is not None else (str(SHIPPED_LM), False)


def main_run() -> str | None:
    """The README's main run (``MAIN_RUN``, from the current folder) when it holds a checkpoint, else None."""
    from ..weights.load import locate

    try:
        locate(MAIN_RUN)
    except (ValueError, OSError):  # no folder, or a run with no checkpoint yet
        return None
    return str(MAIN_RUN)
