"""``blocklab train``, ``eval``, ``predict``: train a model on a task, score it, ask it."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import torch

from ..checkpoint import Checkpoint, load_checkpoint
from ..config import FIELDS, PRESETS, ModelConfig
from ..device import resolve_compute
from ..errors import UsageError
from ..interop.tokenizer import tokenizer_from_spec
from ..runfolder import CHECKPOINTS, CONFIG, read_run_config, resolve_checkpoint, run_files
from ..tasks import DEFAULT_TASK, Task, task_from_dict
from ..train import EXTENSIBLE, TrainingDiverged, evaluate, train
from ..trainconfig import TRAIN_FIELDS, TrainConfig, task_train_config
from .args import (
    add_checkpoint_flags,
    add_config_flags,
    add_device_flags,
    add_task_flags,
    add_train_flags,
    config_from_args,
    set_fields,
    task_from_args,
)


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``train``, ``eval`` and ``predict``."""
    p = sub.add_parser("train", help="train a model on a built-in task; writes a run folder with a report")
    add_config_flags(p)
    p.set_defaults(preset=None)  # None: the task's own preset if it has one (tiny-lm), else listops-seed
    add_task_flags(p, default=None, what="default listops")
    add_train_flags(p)
    p.add_argument(
        "--out", help="run folder (default runs/TASK): config.json, metrics.jsonl, checkpoints/, report.html"
    )
    p.add_argument(
        "--resume", action="store_true", help="continue the run in --out from its newest checkpoint"
    )
    p.add_argument("--overwrite", action="store_true", help="replace a run already in --out")
    p.add_argument(
        "--detect-nonfinite",
        "--detect_nonfinite",
        dest="detect_nonfinite",
        action="store_true",
        help="stop at the first NaN/Inf, naming its stage, layer and position; keep the last good "
        "weights as a checkpoint",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="train even when the memory estimate exceeds the available memory",
    )
    p.add_argument(
        "--log-diagnostics",
        "--log_diagnostics",
        dest="log_diagnostics",
        type=int,
        metavar="K",
        help="gradient flow and LayerNorm statistics every K steps (default: eval-every; 0: off)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.add_argument("--no-report", "--no_report", dest="report", action="store_false", help="skip report.html")
    p.add_argument("--json", action="store_true", help="print the outcome as JSON")
    p.set_defaults(func=train_command)

    p = sub.add_parser("eval", help="held-out loss and exact-match accuracy of a checkpoint")
    add_checkpoint_flags(p)
    p.add_argument("--split", default="test", choices=("test", "train"))
    p.add_argument("--batch-size", "--batch_size", dest="batch_size", type=int, default=1024)
    add_device_flags(p)
    p.set_defaults(func=eval_command)

    p = sub.add_parser("predict", help='a checkpoint\'s answer, e.g. --input "Max ( 3 , 9 , 4 )"')
    add_checkpoint_flags(p)
    p.add_argument(
        "--input", action="append", required=True, help="a query in the task's format (repeatable)"
    )
    add_device_flags(p)
    p.set_defaults(func=predict_command)


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


def configs_from_args(args: argparse.Namespace) -> tuple[ModelConfig, TrainConfig, Task]:
    """The run the flags describe: task defaults, the preset (default: the task's own, if it has
    one), then the user's flags."""
    name = args.task or DEFAULT_TASK
    train_config = task_train_config(name, **set_fields(args, TRAIN_FIELDS))
    task = task_from_args(args, seed=train_config.seed, name=name)
    if args.preset is None:
        args.preset = name if name in PRESETS else "listops-seed"
    return config_from_args(args, **task.config_overrides()), train_config, task


def resumed_configs(args: argparse.Namespace, folder: Path) -> tuple[ModelConfig, TrainConfig, Task]:
    """The run in config.json (checked: runfiles.read_run_config); a flag given with --resume must
    agree with it, but --steps and --target-accuracy (train.EXTENSIBLE), which extend the run."""
    saved = read_run_config(folder)
    model_config, train_config = saved.model, saved.train
    task = task_from_dict(saved.task)
    asked_model, asked_train = set_fields(args, FIELDS), set_fields(args, TRAIN_FIELDS)
    extension = {k: v for k, v in asked_train.items() if k in EXTENSIBLE}
    asked_train = {k: v for k, v in asked_train.items() if k not in EXTENSIBLE}
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
            f"--resume continues the run in {folder} as its config.json says, "
            f"but {problem}; drop the flag or start a new run with another --out"
        )
    return model_config, train_config.replace(**extension), task


def train_command(args: argparse.Namespace) -> int:
    """``blocklab train``: build the configs (or read them back with --resume), train, print the outcome."""
    out = Path(args.out) if args.out else Path("runs") / (args.task or DEFAULT_TASK)
    if args.resume and (out / CONFIG).exists():
        model_config, train_config, task = resumed_configs(args, out)
    else:
        model_config, train_config, task = configs_from_args(args)
    callbacks = []
    every = train_config.eval_every if args.log_diagnostics is None else args.log_diagnostics
    if every:
        from ..diagnostics import DiagnosticsLogger

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
    if result.resumed_step is not None and result.step == result.resumed_step:
        more = "--target-accuracy none (or higher) and " if result.stopped == "target" else ""
        why = f"{why} before: nothing to train; pass {more}--steps N (N > {result.step}) to extend it"
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
    return task_from_dict(ckpt.meta["task"])


def eval_command(args: argparse.Namespace) -> int:
    """``blocklab eval``: loss and exact-match accuracy of a checkpoint on a split of its task."""
    compute = resolve_compute(args.device, args.dtype)
    ckpt, file = open_checkpoint(args.checkpoint)
    task = checkpoint_task(ckpt, args, file)
    data = task.split(args.split)
    with compute.autocast():
        result = evaluate(ckpt.model.to(compute.device), data, args.batch_size)
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
    compute = resolve_compute(args.device, args.dtype)
    ckpt, file = open_checkpoint(args.checkpoint)
    model = ckpt.model.to(compute.device).eval()
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
        with torch.no_grad(), compute.autocast():
            logits = model(torch.tensor([ids], device=compute.device))[0, positions]  # (P, vocab)
        probs = torch.softmax(logits.float(), dim=-1).cpu()  # (P, vocab)
        top = probs.argmax(-1)
        answer = task.decode_answer(top.tolist()) if task else tokenizer.decode(top.tolist())
        results.append({"input": text, "answer": answer, "probability": float(probs.max(-1).values.prod())})
    if args.json:
        print(json.dumps(results if len(results) > 1 else results[0]))
        return 0
    for r in results:
        print(f"{r['input']} -> {r['answer']}  (p={r['probability']:.3f})")
    return 0
