"""Every flag builder of the ``blocklab`` command, in one place, and the parsers that know the configs
(the plain value parsers are values.py's; every name stays importable from here).

Library modules take typed values; turning the command line's text into them happens here. The
grammar every command follows:

- ``--json [FILE|-]``: the result as JSON; ``--json`` or ``--json -`` prints it on stdout instead of
  the text, ``--json FILE`` writes it to FILE and prints the text as usual.
- ``--model PATH`` (alias ``--checkpoint``): anything ``blocklab.load`` reads.
- ``--out PATH``: where the command writes; paths start with ``~`` expanded, an empty path is refused.
- ``--jobs N``: worker processes; default one per CPU core this process may use.
- a flag name means one thing everywhere; every flag that takes one of a few values lists them and
  its default in ``--help``; numbers the configs validate are left to them, the rest are checked here.
- a mistake is one line ``blocklab: error: ...`` (a mistyped flag or command gets "did you mean").
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..device import DEVICE_CHOICES, DTYPE_CHOICES
from ..errors import UsageError
from ..nn.config import CHOICES, FIELDS, LEAN_MIN_D_MODEL, ModelConfig
from ..nn.presets import PRESETS, preset
from ..tasks import DEFAULT_TASK, TASKS, Task, get_task
from ..training.train_config import TRAIN_FIELDS, TrainConfig

if TYPE_CHECKING:
    from ..lab.executors import Executor

from .defaults import DEFAULT_PRESET, MAIN_OR_PRESET
from .field_help import FIELD_HELP
from .parser import (  # noqa: F401  (re-exported: the command modules take them from here)
    HelpFormatter,
    Parser,
    RawDescriptionHelpFormatter,
    add_command,
    dashed,
    did_you_mean,
)
from .values import (  # noqa: F401  (re-exported: the command modules take them from here)
    ACCURACY_RULE,
    TARGET_RULE,
    at_least,
    parse_accuracy,
    parse_bool,
    parse_bool_or_auto,
    parse_float,
    parse_float_or_none,
    parse_int,
    parse_int_or_none,
    parse_int_or_ratio,
    parse_ints_or_none,
    parse_json_object_or_none,
    parse_json_target,
    parse_name,
    parse_names,
    parse_optional_bool,
    parse_path,
    parse_seed,
    parse_target,
    parse_value,
)

# ---- config-aware value parsers (the plain ones: values.py) -----------------------------------


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
        parse = field_value_parser(name)
        try:
            grid[name] = [parse(v.strip()) for v in values.split(",")]
        except argparse.ArgumentTypeError as error:  # the same words as the field's own flag
            raise ValueError(f"--vary {name}: {error}") from None
    return grid


def field_value_parser(name: str) -> Callable[[str], Any]:
    """How the flag of config field ``name`` (ModelConfig's or TrainConfig's) reads a value, so that
    ``--vary residual=add,none`` means what ``--residual none`` means (the text ``none``, not None)."""
    field = next(f for f in (*public_fields(ModelConfig), *public_fields(TrainConfig)) if f.name == name)
    return _field_parser(name, field.default, field.type)[0]


def literal(text: str) -> str:
    """A help text shown as written (argparse %-formats help texts: ``99.5%`` must be ``99.5%%``)."""
    return text.replace("%", "%%")


def one_of(values: Iterable[Any], default: Any) -> str:
    """The help text of a choice: ``one of: a, b, c (default: a)``."""
    return f"one of: {', '.join(map(str, values))} (default: {default})"


# ---- flags generated from the config dataclasses ---------------------------------------------------


def field_flag(name: str) -> str:
    """``--d-model`` for field ``d_model`` (``--d_model`` is read the same: ``Parser`` takes either)."""
    return f"--{name.replace('_', '-')}"


def shown(value: Any) -> str:
    """A default as the user writes it: ``true``, ``none``, ``1e-05``."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def set_fields(args: argparse.Namespace, names: Iterable[str]) -> dict[str, Any]:
    """The fields among ``names`` the user gave on the command line (the field flags default to
    ``argparse.SUPPRESS``: an unset flag leaves no attribute, so ``--target-accuracy none`` is a value)."""
    return {name: getattr(args, name) for name in names if hasattr(args, name)}


def _field_parser(name: str, default: Any, annotation: str) -> tuple[Callable[[str], Any], str, str]:
    """(parser, metavar, what the values are) for a config field, from its default's type (or its
    annotation, ``float | None``, when the default is None)."""
    if name == "d_ff":
        return parse_int_or_ratio, "N|RATIO", "an integer or a ratio times d_model like 4x or 8/3x"
    if name == "final_norm":
        return parse_optional_bool, "true|false|auto", "true, false or auto (auto: on unless post-norm)"
    if name == "fused":
        return parse_bool_or_auto, "true|false|auto", (
            f"true, false or auto (auto: fused from d-model {LEAN_MIN_D_MODEL} up)")
    if name in ("device", "dtype"):  # the same spelling as add_device_flags
        return str, name.upper(), ""
    if name == "target_accuracy":
        return parse_accuracy, "ACCURACY", ACCURACY_RULE
    if name == "seed":
        return parse_seed, "N", ""
    if name in CHOICES:
        return str, "NAME", f"one of: {', '.join(CHOICES[name])}"
    spelled = str(annotation).replace(" ", "")
    unset = {"float|None": (parse_float_or_none, "X|none", "a number, or none"),
             "int|None": (parse_int_or_none, "N|none", "an integer, or none"),
             "bool|None": (parse_optional_bool, "true|false|auto", "true, false or auto"),  # qkv_bias
             "tuple[int|None,...]|None": (parse_ints_or_none, "N,none,...|none", "none: global")}
    if default is None and spelled in unset:
        return unset[spelled]
    if default is None and spelled.startswith("dict["):
        return parse_json_object_or_none, "JSON|none", "a JSON object, or none"
    if isinstance(default, bool):
        return parse_bool, "true|false", "true or false"
    if isinstance(default, int):
        return parse_int, "N", ""
    if isinstance(default, float):
        return parse_float, "X", ""
    return str, "TEXT", ""


def _field_help(name: str, values: str, default: str) -> str:
    parts = [part for part in (FIELD_HELP.get(name), values) if part]
    return literal(f"{'; '.join(parts)} (default: {default})")


def public_fields(cls: type) -> list[dataclasses.Field]:
    """A config's fields a user sets: given to __init__, name not private (``_derived`` is neither)."""
    return [f for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")]


def add_config_flags(parser: argparse.ArgumentParser, with_preset: bool = True,
                     default_preset: str | None = DEFAULT_PRESET) -> None:
    """``--preset NAME`` plus one flag per ModelConfig field (``--d-model``); ``default_preset`` None: the
    command opens the main run when there is one (``main_run``), else ``DEFAULT_PRESET``."""
    group = parser.add_argument_group(
        "model config", "ModelConfig fields; each overrides the preset (ModelConfig validates them)"
    )
    if with_preset:
        group.add_argument("--preset", default=default_preset, type=parse_name, metavar="NAME",
                           help=one_of(PRESETS, default_preset or MAIN_OR_PRESET))
    for f in public_fields(ModelConfig):
        kind, metavar, values = _field_parser(f.name, f.default, f.type)
        default = "auto" if f.name == "final_norm" else shown(f.default)
        group.add_argument(field_flag(f.name), dest=f.name, type=kind, default=argparse.SUPPRESS,
                           metavar=metavar, help=_field_help(f.name, values, f"the preset's, else {default}"))


def config_from_args(args: argparse.Namespace, **task_overrides: Any) -> ModelConfig:
    """The preset, then the task's fields, then the user's flags: later wins."""
    return preset(getattr(args, "preset", "listops-seed"), **{**task_overrides, **set_fields(args, FIELDS)})


def add_train_flags(parser: argparse.ArgumentParser, defaults: dict[str, Any] | None = None) -> None:
    """One flag per TrainConfig field (``--batch-size``); unset: the task's default, else ``defaults``'
    (a command's own, e.g. the lab's one thread per run), else TrainConfig's."""
    group = parser.add_argument_group("training", "TrainConfig fields (TrainConfig validates them)")
    for f in public_fields(TrainConfig):
        kind, metavar, values = _field_parser(f.name, f.default, f.type)
        default = shown((defaults or {}).get(f.name, f.default))
        group.add_argument(field_flag(f.name), dest=f.name, type=kind, default=argparse.SUPPRESS,
                           metavar=metavar, help=_field_help(f.name, values, f"the task's, else {default}"))


# ---- flags shared by several commands: one builder each ------------------------------------------


def add_task_flags(
    parser: argparse.ArgumentParser, default: str | None = DEFAULT_TASK, what: str = ""
) -> None:
    """``--task NAME`` and repeatable ``--task-option KEY=VALUE``."""
    parser.add_argument("--task", default=default, type=parse_name, metavar="NAME",
                        help=one_of(TASKS, what or default))
    parser.add_argument(
        "--task-option",
        dest="task_options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a task option, e.g. path=corpus.txt or seq_len=32 (repeatable)",
    )


def task_from_args(args: argparse.Namespace, seed: int | None = None, name: str | None = None) -> Task:
    """Task ``name`` (default: ``--task``) with the ``--task-option``s; its seed defaults to ``seed``."""
    options: dict[str, Any] = {} if seed is None else {"seed": seed}
    for item in args.task_options:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--task-option {item!r} must look like KEY=VALUE, e.g. seq_len=32")
        options[key.strip().replace("-", "_")] = parse_value(value.strip())
    return get_task(name or args.task or DEFAULT_TASK, **options)


def add_model_flag(parser: argparse.ArgumentParser, required: bool = True, what: str = "",
                   repeatable: bool = False) -> None:
    """``--model PATH`` (alias ``--checkpoint``): a run folder, checkpoint, Hugging Face folder or package.
    ``repeatable``: a command taking several models (``args.models``, a list) repeats the flag."""
    from ..weights.load import ACCEPTED

    many = dict(action="append", dest="models", default=[]) if repeatable else dict(dest="model")
    parser.add_argument("--model", "--checkpoint", required=required, type=parse_path,
                        metavar="PATH", help=f"{what or 'the model'}: {ACCEPTED}", **many)
    parser.add_argument("--allow-nonfinite", dest="allow_nonfinite", action="store_true",
                        help="load a model whose weights hold NaN or Inf (refused otherwise), to inspect it")


def add_model_and_task_flags(parser: argparse.ArgumentParser) -> None:
    """``--model`` and ``--task`` (default: the task the model's checkpoint records)."""
    add_model_flag(parser)
    add_task_flags(parser, default=None, what="the one the checkpoint records")


def add_json_flag(parser: argparse.ArgumentParser, what: str) -> None:
    """``--json [FILE|-]``: ``what`` as JSON, on stdout instead of the text, or written to FILE."""
    parser.add_argument("--json", nargs="?", const="-", default=None, type=parse_json_target, metavar="FILE",
                        help=f"{what} as JSON: --json (or --json -) prints it instead of the text; "
                             "--json FILE writes it to FILE")


def add_out_flag(parser: argparse.ArgumentParser, what: str, required: bool = False) -> None:
    """``--out PATH``: where the command writes (``~`` expanded; empty refused)."""
    parser.add_argument("--out", required=required, type=parse_path, metavar="PATH", help=what)


def add_executor_flags(parser: argparse.ArgumentParser) -> None:
    """``--executor local|ray``, ``--address`` (ray) and ``--jobs N``: where a batch of training runs
    executes (``lab.executors``); the one default rule for jobs is one per CPU core this process may use."""
    from ..lab.executors import EXECUTORS

    parser.add_argument("--executor", choices=EXECUTORS, default="local",
                        help="where the training runs execute: local worker processes, or ray: a Ray cluster "
                             "(--address) or a local Ray instance bound to 127.0.0.1 (needs blocklab[ray]); "
                             "the numbers are the same (default: local)")
    parser.add_argument("--address", metavar="ADDRESS",
                        help="with --executor ray: the cluster to use (auto, HOST:PORT or ray://HOST:PORT; "
                             "default: start a local instance)")
    parser.add_argument("--jobs", type=at_least(1), default=None, metavar="N",
                        help="runs at once: local worker processes, or the CPUs of the local Ray instance "
                             "(default: one per CPU core this process may use; 1 with local: one at a time, "
                             "in this process)")


def executor_from_args(args: argparse.Namespace) -> Executor:
    """The executor ``--executor``, ``--address`` and ``--jobs`` name (a contradiction is refused)."""
    from ..lab.executors import Executor

    try:
        return Executor(args.executor, args.jobs, args.address)
    except ValueError as error:
        raise UsageError(str(error)) from None


def add_seed_flag(parser: argparse.ArgumentParser, what: str,
                  default: int | None = 0, shown: str = "0") -> None:
    """``--seed N``: the seed of the command's randomness (``what`` says which; ``default`` None when
    giving it at all means something, as for generate, where a seed only goes with sampling)."""
    parser.add_argument("--seed", type=parse_seed, default=default, metavar="N",
                        help=f"{what} (default: {shown}; torch seeds take 64 bits)")


def add_device_flags(parser: argparse.ArgumentParser) -> None:
    """``--device`` and ``--dtype`` for commands that run a model (``train`` has them as TrainConfig
    fields); blocklab/device.py resolves and checks them (``resolve_compute``)."""
    parser.add_argument(
        "--device", default="auto", metavar="DEVICE",
        help=f"{', '.join(DEVICE_CHOICES)} or cuda:N (default: auto: cuda if present, else mps, else cpu)",
    )
    parser.add_argument(
        "--dtype", default="float32", metavar="DTYPE",
        help=f"{', '.join(DTYPE_CHOICES)}: bfloat16/float16: the matmuls under autocast (default: float32)",
    )


def add_quiet_flag(parser: argparse.ArgumentParser, what: str) -> None:
    """``-q`` / ``--quiet``."""
    parser.add_argument("-q", "--quiet", action="store_true", help=what)


OUTPUT_FLAGS = ("json", "html", "plot")  # the flags naming a file the command writes ("-": stdout)


def check_outputs(args: argparse.Namespace) -> None:
    """Refuse, before any work, an output file that is the command's input, inside an input folder,
    inside the folder the command will write (``args.owns(args)``, set by a command that writes a folder:
    its --out, the default one included), inside a blocklab folder, or named by two flags
    (files.folders.check_output_files: a command writes only what it owns)."""
    from ..files.folders import check_output_files

    named = (getattr(args, "model", None), getattr(args, "path", None))
    inputs = [p for p in named if p and Path(p).exists()]  # a package name is not a path
    outputs = {f"--{name}": getattr(args, name, None) for name in OUTPUT_FLAGS}
    owns = getattr(args, "owns", None)
    check_output_files({flag: path for flag, path in outputs.items() if path != "-"}, inputs,
                       owned=[owns(args)] if owns is not None else [])


def emit_json(target: str | None, data: Any, lines: bool = False) -> bool:
    """Carry out ``--json``: ``-`` prints ``data`` on stdout and returns True (the caller prints no
    text); a FILE is written (atomically) and False returned; None (no ``--json``): False. Strict
    JSON: a NaN or infinity is written as null. ``lines``: ``data`` is a list, one JSON line each."""
    if target is None:
        return False
    from ..files.jsonfiles import json_safe

    rows = data if lines else [data]
    text = "\n".join(json.dumps(json_safe(row), allow_nan=False) for row in rows)
    if target == "-":
        print(text)
        return True
    from ..files.atomic import atomic_write_bytes

    atomic_write_bytes(target, (text + "\n").encode(), stream=True)  # never through a link; a pipe as it is
    return False


def say_written(path: str | None, to_stderr: bool = False) -> None:
    """``wrote FILE`` after writing a flag's file (nothing for None or ``-``, stdout)."""
    if path is not None and path != "-":
        print(f"wrote {path}", file=sys.stderr if to_stderr else sys.stdout)
