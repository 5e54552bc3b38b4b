"""Every flag builder and argument parser of the ``blocklab`` command, in one place.

Library modules take typed values; turning the command line's text into them happens here:
booleans, numbers-or-text, ``--vary FIELD=V1,V2``, token ids, the ModelConfig / TrainConfig flags
(generated from the dataclass fields, so a new field is a new flag), the task flags.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from ..config import FIELDS, PRESETS, ModelConfig, preset
from ..device import DEVICE_CHOICES, DTYPE_CHOICES
from ..tasks import DEFAULT_TASK, TASKS, Task, get_task
from ..trainconfig import TRAIN_FIELDS, TrainConfig

# ---- value parsers -------------------------------------------------------------------------------


def parse_bool(text: str) -> bool:
    """'true'/'false' (also yes/no, 1/0, on/off) -> bool."""
    value = text.strip().lower()
    if value in ("true", "yes", "1", "on"):
        return True
    if value in ("false", "no", "0", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not true or false")


def parse_optional_bool(text: str) -> bool | None:
    """'auto' -> None, else ``parse_bool``."""
    return None if text.strip().lower() == "auto" else parse_bool(text)


def parse_int_or_ratio(text: str) -> int | str:
    """``--d-ff``: '256' -> 256; '4x', '8/3x', '4.0' stay text for ``resolve_d_ff``."""
    return int(text) if text.strip().isdigit() else text


def parse_count(text: str) -> int:
    """A whole number >= 1 (``--rounds``)."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return int(text)


def parse_value(text: str) -> Any:
    """A value written on the command line as int, float, None/true/false, or the text itself."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"none": None, "true": True, "false": False}.get(text.lower(), text)


def parse_target(text: str) -> float | None:
    """``--target-accuracy``: a number in (0, 1] (or a percentage like 99.5), or ``none``."""
    if text.strip().lower() in ("none", "off", "0"):
        return None
    value = float(text.rstrip("%"))
    return value / 100 if value > 1 or text.endswith("%") else value


def parse_token_ids(text: str, flag: str = "--tokens") -> list[int]:
    """``"1,2,3"`` or ``"1 2 3"`` -> [1, 2, 3]; ValueError naming ``flag`` and the bad piece."""
    pieces = text.replace(",", " ").split()
    if not pieces:
        raise ValueError(f"{flag} is empty: give token ids like 1,2,3")
    for piece in pieces:
        if not piece.lstrip("-").isdigit():
            raise ValueError(f"{flag} needs integer ids separated by commas or spaces; {piece!r} is not one")
    return [int(p) for p in pieces]


def parse_vary(items: list[str]) -> dict[str, list[Any]]:
    """``["n_layers=2,6", "lr=1e-3,3e-3"]`` -> ``{"n_layers": [2, 6], "lr": [0.001, 0.003]}``."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        name, sep, values = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or not values.strip():
            raise ValueError(f"--vary {item!r} must look like FIELD=V1,V2 (e.g. norm_position=post,pre)")
        if name not in FIELDS and name not in TRAIN_FIELDS:
            raise ValueError(
                f"--vary {name!r} is neither a ModelConfig field ({', '.join(FIELDS)}) "
                f"nor a TrainConfig field ({', '.join(TRAIN_FIELDS)})"
            )
        if name == "seed":
            raise ValueError("--vary seed: use --seeds N instead")
        if name in grid:
            raise ValueError(f"--vary {name} given twice")
        grid[name] = [parse_value(v.strip()) for v in values.split(",")]
    return grid


# ---- flags generated from the config dataclasses ---------------------------------------------------


def field_flags(name: str) -> list[str]:
    """``--d-model`` and ``--d_model`` for field ``d_model`` (one spelling for names without ``_``)."""
    return [f"--{name.replace('_', '-')}"] + ([f"--{name}"] if "_" in name else [])


def set_fields(args: argparse.Namespace, names: Iterable[str]) -> dict[str, Any]:
    """The fields among ``names`` the user gave on the command line (the field flags default to
    ``argparse.SUPPRESS``: an unset flag leaves no attribute, so ``--target-accuracy none`` is a value)."""
    return {name: getattr(args, name) for name in names if hasattr(args, name)}


_MODEL_FIELD_TYPES: dict[str, Callable[[str], Any]] = {
    "d_ff": parse_int_or_ratio,
    "final_norm": parse_optional_bool,
}


def add_config_flags(parser: argparse.ArgumentParser, with_preset: bool = True) -> None:
    """``--preset NAME`` plus one flag per ModelConfig field (``--d-model`` or ``--d_model``)."""
    group = parser.add_argument_group("model config (ModelConfig fields; override the preset)")
    if with_preset:
        group.add_argument("--preset", default="listops-seed", help=f"one of: {', '.join(PRESETS)}")
    for f in dataclasses.fields(ModelConfig):
        default = f.default
        kind = _MODEL_FIELD_TYPES.get(f.name) or (parse_bool if isinstance(default, bool) else type(default))
        metavar = (
            "true|false" if kind is parse_bool else ("true|false|auto" if f.name == "final_norm" else None)
        )
        group.add_argument(
            *field_flags(f.name),
            dest=f.name,
            type=kind,
            default=argparse.SUPPRESS,
            metavar=metavar,
            help=f"default: the preset's, else {default!r}",
        )


def config_from_args(args: argparse.Namespace, **task_overrides: Any) -> ModelConfig:
    """The preset, then the task's fields, then the user's flags: later wins."""
    return preset(getattr(args, "preset", "listops-seed"), **{**task_overrides, **set_fields(args, FIELDS)})


def add_train_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per TrainConfig field (``--batch-size`` or ``--batch_size``); unset: the task's default."""
    group = parser.add_argument_group("training (TrainConfig fields)")
    for f in dataclasses.fields(TrainConfig):
        kind = parse_target if f.name == "target_accuracy" else type(f.default)
        group.add_argument(
            *field_flags(f.name),
            dest=f.name,
            type=kind,
            default=argparse.SUPPRESS,
            help=f"default {f.default!r}",
        )


def add_task_flags(
    parser: argparse.ArgumentParser, default: str | None = DEFAULT_TASK, what: str = ""
) -> None:
    """``--task NAME`` and repeatable ``--task-option KEY=VALUE``."""
    what = what or f"default {default}"
    parser.add_argument("--task", default=default, help=f"{', '.join(TASKS)} ({what})")
    parser.add_argument(
        "--task-option",
        "--task_option",
        dest="task_options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a task option, e.g. path=corpus.txt seq_len=32 (repeatable)",
    )


def task_from_args(args: argparse.Namespace, seed: int | None = None, name: str | None = None) -> Task:
    """Task ``name`` (default: ``--task``) with the ``--task-option``s; its seed defaults to ``seed``."""
    options: dict[str, Any] = {} if seed is None else {"seed": seed}
    for item in args.task_options:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--task-option {item!r} must look like KEY=VALUE, e.g. seq_len=32")
        options[key.strip().replace("-", "_")] = parse_value(value.strip())
    return get_task(name or args.task or DEFAULT_TASK, **options)


def add_checkpoint_flags(parser: argparse.ArgumentParser) -> None:
    """``--checkpoint`` (a file, a checkpoint folder or a run folder), ``--task`` (default: the one
    the checkpoint records) and ``--json``."""
    parser.add_argument(
        "--checkpoint", required=True, help="model.safetensors, a checkpoint folder or a run folder"
    )
    add_task_flags(parser, default=None, what="default: the checkpoint's")
    parser.add_argument("--json", action="store_true", help="print JSON")


def add_device_flags(parser: argparse.ArgumentParser) -> None:
    """``--device`` and ``--dtype`` for commands that run a model (``train`` has them as TrainConfig
    fields); blocklab/device.py resolves and checks them (``resolve_compute``)."""
    parser.add_argument(
        "--device",
        default="auto",
        help=f"{', '.join(DEVICE_CHOICES)} or cuda:N (default auto: cuda if present, else mps, else cpu)",
    )
    parser.add_argument(
        "--dtype",
        default="float32",
        help=f"{', '.join(DTYPE_CHOICES)}: bfloat16/float16 run the matmuls under autocast (default float32)",
    )
