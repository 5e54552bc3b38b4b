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
from .config import FIELDS, from_dict
from .runfolder import CONFIG, read_json, resolve_checkpoint
from .tasks import DEFAULT_TASK, Task, get_task
from .tasks.tokenizer import tokenizer_from_spec
from .train import TRAIN_FIELDS, TrainConfig, TrainingDiverged, evaluate, train, train_config_from_dict


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
        group.add_argument(*flags, dest=f.name, type=kind, default=None, help=f"default {f.default!r}")


def add_task_flags(parser: argparse.ArgumentParser, default: str | None = DEFAULT_TASK) -> None:
    """``--task NAME`` and repeatable ``--task-option KEY=VALUE``."""
    parser.add_argument(
        "--task", default=default, help=f"listops, tiny-lm, copy, reverse, sort, text (default {default})"
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


def _value(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"none": None, "true": True, "false": False}.get(text.lower(), text)


def task_from_args(args: argparse.Namespace, seed: int | None = None) -> Task:
    """The task named by ``--task`` with its ``--task-option``s; its seed defaults to ``seed``."""
    options: dict[str, Any] = {} if seed is None else {"seed": seed}
    for item in args.task_options:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--task-option {item!r} must look like KEY=VALUE, e.g. seq_len=32")
        options[key.strip().replace("-", "_")] = _value(value.strip())
    return get_task(args.task, **options)


def _given(args: argparse.Namespace, names: tuple[str, ...]) -> list[str]:
    return [n for n in names if getattr(args, n, None) is not None]


def _main_process() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def train_command(args: argparse.Namespace, config_from_args: Any) -> int:
    """``blocklab train``: build the configs (or read them back with --resume), train, print the outcome."""
    from .cli import UsageError

    out = Path(args.out) if args.out else Path("runs") / args.task
    saved = out / CONFIG
    if args.resume and saved.exists():
        extra = _given(args, FIELDS + TRAIN_FIELDS) + (["task_option"] if args.task_options else [])
        if extra:
            raise UsageError(
                f"--resume continues {out} exactly as its config.json says; drop --"
                f"{extra[0].replace('_', '-')} (or start a new run with another --out)"
            )
        run = read_json(saved)
        model_config, train_config = from_dict(run["model"]), train_config_from_dict(run["train"])
        task = Task.from_dict(run["task"])
    else:
        train_config = TrainConfig(**{n: getattr(args, n) for n in _given(args, TRAIN_FIELDS)})
        task = task_from_args(args, seed=train_config.seed)
        model_config = config_from_args(args, **task.config_overrides())
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
    print(
        f"{result.seconds:.1f} s, {result.tokens_per_s:,.0f} tokens/s; run folder {out}: config.json, "
        f"metrics.jsonl, report.html, {result.checkpoint.relative_to(out) if result.checkpoint else '-'}"
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
