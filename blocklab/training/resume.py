"""The resume rules, in one place: what a resumed run may change, and how each caller checks it.

A resumed run is the same run: its model, task and train settings are the ones in its config.json,
except the fields in ``EXTENSIBLE`` (when to stop, and where it computes), which extend it. Three
callers check that rule, each against what it holds:

    the command line   the flags given with --resume vs config.json      (``flag_difference``, ``split``)
    the session        the config it was given vs config.json           (``check_same_run``, ``extension``)
    a checkpoint       the train settings it recorded vs the run's now   (``check_recorded_train``)

An extension is recorded in config.json's ``extended`` list (``extension``); the learning rate of every
later step is ``lr_at(step)`` over the new total.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .runfiles import SavedRun

# TrainConfig fields a resumed run may change: when to stop, and where it computes (a run moves from
# one machine to another; on another device it continues, but not bit for bit). Any other difference
# (dtype among them) is another run.
EXTENSIBLE = ("steps", "target_accuracy", "device")


def split(train: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Train settings -> (the fixed ones, the ones an extension may change)."""
    return ({k: v for k, v in train.items() if k not in EXTENSIBLE},
            {k: v for k, v in train.items() if k in EXTENSIBLE})


def flag_difference(saved: dict[str, Any], asked: dict[str, Any]) -> str | None:
    """The first flag given with --resume that disagrees with the run's ``saved`` settings, as the
    message names it (``--lr 0.01 (the run has 0.001)``); None when all agree."""
    return next(
        (
            f"--{k.replace('_', '-')} {asked[k]!r} (the run has {saved.get(k)!r})"
            for k in asked
            if asked[k] != saved.get(k)
        ),
        None,
    )


def check_same_run(folder: Path, saved: SavedRun, config: dict[str, Any]) -> None:
    """--resume: the model, task and training settings must be the run's, but the fields an
    extension may change (EXTENSIBLE)."""
    pairs = [
        ("model", saved.model.to_dict(), config["model"]),
        ("task", saved.task, config["task"]),
        ("train", split(saved.train.to_dict())[0], split(config["train"])[0]),
    ]
    diffs = [f"{part}: {old} != {new}" for part, old, new in pairs if old != new]
    if diffs:
        raise ValueError(
            f"--resume: the run in {folder} was configured differently ({diffs[0]}); "
            "resume with its config.json or start a new run"
        )


def extension(folder: Path, saved: SavedRun, config: dict[str, Any], at_step: int) -> dict[str, Any] | None:
    """--resume with other ``steps`` / ``target_accuracy`` (``config``, at checkpoint ``at_step``): check
    it, and return the config.json that records it (None: nothing changed), for the caller to write
    once the checkpoint has loaded (a failed resume changes nothing).

    The schedule rule: the learning rate of every later step is ``lr_at(step)`` over the new
    total, the rate a run configured with that many steps from the start has there (the
    cosine is recomputed, so it steps up when a finished run is extended)."""
    before = saved.train.to_dict()
    changed = {k: before[k] for k in EXTENSIBLE if before[k] != config["train"][k]}
    if not changed:
        return None
    steps = config["train"]["steps"]
    if steps < at_step:
        raise ValueError(
            f"--resume: the run in {folder} is at step {at_step}; steps={steps} would "
            f"undo training, so it must be >= {at_step}"
        )
    record = {
        "at_step": at_step,
        **{f"{k}_before": v for k, v in changed.items()},
        **{k: config["train"][k] for k in changed},
    }
    history = saved.data.get("extended") if isinstance(saved.data.get("extended"), list) else []
    return {**config, "extended": [*history, record]}


def check_recorded_train(ckpt: Path, recorded: dict[str, Any], now: dict[str, Any]) -> None:
    """A checkpoint's recorded train settings vs the run's now: only EXTENSIBLE fields may differ
    (anything else means config.json was edited between the sessions)."""
    edited = [k for k in now if k not in EXTENSIBLE and recorded[k] != now[k]]
    if edited:
        k = edited[0]
        raise ValueError(
            f"{ckpt}: was trained with {k}={recorded[k]!r} but the run now says {k}={now[k]!r} "
            f"(config.json edited?); only {' and '.join(EXTENSIBLE)} may change when resuming"
        )
