"""The ``train``, ``eval`` and ``predict`` commands: argument handling behind the thin parsers in cli.py."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import torch

from .checkpoint import Checkpoint, load_checkpoint
from .config import FIELDS, PRESETS, ModelConfig, from_dict
from .runfolder import CHECKPOINTS, CONFIG, read_json, resolve_checkpoint, run_files
from .tasks import DEFAULT_TASK, Task, get_task
from .tasks.tokenizer import tokenizer_from_spec
from .train import (
    TRAIN_FIELDS,
    TrainConfig,
    TrainingDiverged,
    evaluate,
    task_train_config,
    train,
    train_config_from_dict,
)


def parse_target(text: str) -> float | None:
    """``--target-accuracy``: a number in (0, 1] (or a percentage like 99.5), or ``none``."""
    if text.strip().lower() in ("none", "off", "0"):
        return None
    value = float(text.rstrip("%"))
    return value / 100 if value > 1 or text.endswith("%") else value


def add_train_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per TrainConfig field (``--batch-size`` or ``--batch_size``), default: TrainConfig's."""
    group = parser.add_argument_group("training (TrainConfig fields)")
    for f in dataclasses.fields(TrainConfig):
        kind = parse_target if f.name == "target_accuracy" else type(f.default)
        flags = [f"--{f.name.replace('_', '-')}"] + ([f"--{f.name}"] if "_" in f.name else [])
        group.add_argument(
            *flags, dest=f.name, type=kind, default=argparse.SUPPRESS, help=f"default {f.default!r}"
        )


def add_task_flags(
    parser: argparse.ArgumentParser, default: str | None = DEFAULT_TASK, what: str = ""
) -> None:
    """``--task NAME`` and repeatable ``--task-option KEY=VALUE``."""
    what = what or f"default {default}"
    parser.add_argument(
        "--task", default=default, help=f"listops, tiny-lm, copy, reverse, sort, text ({what})"
    )
    parser.add_argument(
        "--task-option",
        "--task_option",
        dest="task_options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a task option, e.g. path=corpus.txt seq_len=32 (repeatable)",
    )


def add_checkpoint_flags(parser: argparse.ArgumentParser) -> None:
    """``--checkpoint`` (a file, a checkpoint folder or a run folder), ``--task`` (default: the one
    the checkpoint records) and ``--json``."""
    parser.add_argument(
        "--checkpoint", required=True, help="model.safetensors, a checkpoint folder or a run folder"
    )
    add_task_flags(parser, default=None, what="default: the checkpoint's")
    parser.add_argument("--json", action="store_true", help="print JSON")


def parse_value(text: str) -> Any:
    """A flag value as int, float, None/true/false, or the text itself."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"none": None, "true": True, "false": False}.get(text.lower(), text)


_value = parse_value  # the name blocklab.experiments.ablate imports


def task_from_args(args: argparse.Namespace, seed: int | None = None, name: str | None = None) -> Task:
    """Task ``name`` with the ``--task-option``s; its seed defaults to ``seed``."""
    options: dict[str, Any] = {} if seed is None else {"seed": seed}
    for item in args.task_options:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--task-option {item!r} must look like KEY=VALUE, e.g. seq_len=32")
        options[key.strip().replace("-", "_")] = parse_value(value.strip())
    return get_task(name or args.task or DEFAULT_TASK, **options)


def _main_process() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def _first_difference(saved: dict[str, Any], asked: dict[str, Any]) -> str | None:
    return next(
        (
            f"--{k.replace('_', '-')} {asked[k]!r} (the run has {saved.get(k)!r})"
            for k in asked
            if asked[k] != saved.get(k)
        ),
        None,
    )


def configs_from_args(
    args: argparse.Namespace, config_from_args: Any
) -> tuple[ModelConfig, TrainConfig, Task]:
    """The run the flags describe: task defaults, the preset (default: the task's own, if it has
    one), then the user's flags."""
    name = args.task or DEFAULT_TASK
    train_config = task_train_config(name, **{n: getattr(args, n) for n in TRAIN_FIELDS if hasattr(args, n)})
    task = task_from_args(args, seed=train_config.seed, name=name)
    if args.preset is None:
        args.preset = name if name in PRESETS else "listops-seed"
    return config_from_args(args, **task.config_overrides()), train_config, task


def resumed_configs(args: argparse.Namespace, saved: Path) -> tuple[ModelConfig, TrainConfig, Task]:
    """The run in config.json; any flag given with --resume must agree with it."""
    from .cli import UsageError

    run = read_json(saved)
    model_config, train_config = from_dict(run["model"]), train_config_from_dict(run["train"])
    task = Task.from_dict(run["task"])
    asked_model = {n: getattr(args, n) for n in FIELDS if getattr(args, n, None) is not None}
    asked_train = {n: getattr(args, n) for n in TRAIN_FIELDS if hasattr(args, n)}
    problem = (
        _first_difference(model_config.to_dict(), model_config.replace(**asked_model).to_dict())
        or _first_difference(train_config.to_dict(), train_config.replace(**asked_train).to_dict())
        or (f"--task {args.task}" if args.task and args.task != task.name else None)
        or (
            f"--task-option {args.task_options[0]}"
            if args.task_options
            and task_from_args(args, seed=task.seed, name=task.name).to_dict() != task.to_dict()
            else None
        )
    )
    if problem:
        raise UsageError(
            f"--resume continues the run in {saved.parent} as its config.json says, "
            f"but {problem}; drop the flag or start a new run with another --out"
        )
    return model_config, train_config, task


def train_command(args: argparse.Namespace, config_from_args: Any) -> int:
    """``blocklab train``: build the configs (or read them back with --resume), train, print the outcome."""
    out = Path(args.out) if args.out else Path("runs") / (args.task or DEFAULT_TASK)
    if args.resume and (out / CONFIG).exists():
        model_config, train_config, task = resumed_configs(args, out / CONFIG)
    else:
        model_config, train_config, task = configs_from_args(args, config_from_args)
    callbacks = []
    every = train_config.eval_every if args.log_diagnostics is None else args.log_diagnostics
    if every:
        from .diagnostics import DiagnosticsLogger

        callbacks.append(DiagnosticsLogger(every))
    try:
        result = train(
            model_config,
            train_config,
            task,
            out,
            callbacks=callbacks,
            resume=args.resume,
            overwrite=args.overwrite,
            progress=not args.quiet,
            report=args.report,
            detect_nonfinite=args.detect_nonfinite,
            force=args.force,
        )
    except TrainingDiverged as error:
        print(f"blocklab: error: {error}", file=sys.stderr, flush=True)
        return 1
    if not _main_process():
        return 0
    summary = {
        "out": str(out),
        "step": result.step,
        "steps": train_config.steps,
        "stopped": result.stopped,
        "eval_loss": result.eval.get("loss"),
        "eval_accuracy": result.accuracy,
        "train_loss": result.loss,
        "seconds": result.seconds,
        "tokens_per_s": result.tokens_per_s,
    }
    if args.json:
        print(json.dumps(summary))
        return 0
    why = "target accuracy reached" if result.stopped == "target" else "all steps done"
    print(
        f"{task.name}: held-out exact match {result.accuracy:.2%} "
        f"(loss {result.eval.get('loss', math.nan):.4f}) "
        f"at step {result.step} of {train_config.steps} ({why})"
    )
    written = [name for name in run_files(out) if name != CHECKPOINTS]
    written += [str(result.checkpoint.relative_to(out))] if result.checkpoint else []
    print(
        f"{result.seconds:.1f} s, {result.tokens_per_s:,.0f} tokens/s; run folder {out}: {', '.join(written)}"
    )
    return 0


def open_checkpoint(path: str) -> tuple[Checkpoint, Path]:
    """Load the model behind ``--checkpoint`` (a file, a checkpoint folder or a run folder)."""
    file = resolve_checkpoint(path)
    return load_checkpoint(file), file


def checkpoint_task(ckpt: Checkpoint, args: argparse.Namespace, file: Path) -> Task:
    """The task a checkpoint was trained on (its metadata), or the one ``--task`` names."""
    if getattr(args, "task", None):
        return task_from_args(args)
    if "task" not in ckpt.meta:
        raise ValueError(f"{file} does not record a task (not trained by blocklab train?); pass --task NAME")
    return Task.from_dict(ckpt.meta["task"])


def eval_command(args: argparse.Namespace) -> int:
    """``blocklab eval``: loss and exact-match accuracy of a checkpoint on a split of its task."""
    ckpt, file = open_checkpoint(args.checkpoint)
    task = checkpoint_task(ckpt, args, file)
    data = task.split(args.split)
    result = evaluate(ckpt.model, data, args.batch_size)
    if args.json:
        print(
            json.dumps(
                {
                    "checkpoint": str(file),
                    "task": task.to_dict(),
                    "split": args.split,
                    "examples": len(data),
                    **result,
                }
            )
        )
        return 0
    step = f" (step {ckpt.meta['step']})" if "step" in ckpt.meta else ""
    print(
        f"{file}{step}: {task.name} {args.split} split, {len(data)} examples: "
        f"loss {result['loss']:.4f}, exact match {result['accuracy']:.2%}"
    )
    return 0


def predict_command(args: argparse.Namespace) -> int:
    """``blocklab predict``: the model's answer to each ``--input``, with its probability."""
    ckpt, file = open_checkpoint(args.checkpoint)
    model = ckpt.model.eval()
    task = None if "task" not in ckpt.meta and not args.task else checkpoint_task(ckpt, args, file)
    results = []
    for text in args.input:
        if task is not None:
            ids, positions = task.encode_query(text)
        else:  # no task recorded (an imported model): predict the next token
            if ckpt.tokenizer is None:
                raise ValueError(f"{file} has neither a task nor a tokenizer; pass --task NAME")
            tokenizer = tokenizer_from_spec(ckpt.tokenizer)
            ids = tokenizer.encode(text)
            positions = [len(ids) - 1]
        with torch.no_grad():
            probs = torch.softmax(model(torch.tensor([ids]))[0, positions].float(), dim=-1)  # (P, vocab)
        top = probs.argmax(-1)
        answer = task.decode_answer(top.tolist()) if task else tokenizer.decode(top.tolist())
        results.append({"input": text, "answer": answer, "probability": float(probs.max(-1).values.prod())})
    if args.json:
        print(json.dumps(results if len(results) > 1 else results[0]))
        return 0
    for r in results:
        print(f"{r['input']} -> {r['answer']}  (p={r['probability']:.3f})")
    return 0
