"""``blocklab train``, ``eval``, ``predict``: train a model on a task, score it, ask it."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

import torch

from ..device import resolve_compute
from ..errors import UsageError
from ..files.folders import CHECKPOINTS, CONFIG, inspect_folder
from ..inspect.nonfinite import refuse_nonfinite_output
from ..nn.config import FIELDS, ModelConfig
from ..nn.presets import PRESETS
from ..tasks import DEFAULT_TASK, Task, task_from_dict
from ..training.loop import (
    TrainingDiverged,
    TrainingInterrupted,
    TrainResult,
    check_task_fits,
    describe_eval,
    evaluate,
    train,
)
from ..training.resume import flag_difference, split
from ..training.runfiles import read_run_config, run_files
from ..training.train_config import TRAIN_FIELDS, TrainConfig, task_train_config
from ..weights.load import Loaded, load
from .args import (
    add_command,
    add_config_flags,
    add_device_flags,
    add_json_flag,
    add_model_and_task_flags,
    add_out_flag,
    add_quiet_flag,
    add_task_flags,
    add_train_flags,
    at_least,
    config_from_args,
    emit_json,
    one_of,
    say_written,
    set_fields,
    task_from_args,
)
from .defaults import default_out


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``train``, ``eval`` and ``predict``."""
    _add_train(sub)
    _add_eval(sub)
    _add_predict(sub)


def _add_train(sub: argparse._SubParsersAction) -> None:
    """Register ``train``."""
    p = add_command(
        sub, "train",
        "Train a model (a preset plus any ModelConfig flag) on a built-in task. The run folder holds "
        "config.json, metrics.jsonl, checkpoints/ and report.html; --resume continues it from its newest "
        "checkpoint (with a larger --steps, it extends a finished run).",
    )
    add_config_flags(p)
    p.set_defaults(preset=None)  # None: the task's own preset if it has one (tiny-lm), else listops-seed
    add_task_flags(p, default=None, what="listops")
    add_train_flags(p)
    add_out_flag(p, "run folder (default runs/TASK): config.json, metrics.jsonl, checkpoints/, report.html")
    either = p.add_mutually_exclusive_group()  # continuing a run and replacing it contradict each other
    either.add_argument(
        "--resume", action="store_true", help="continue the run in --out from its newest checkpoint"
    )
    either.add_argument("--overwrite", action="store_true", help="replace a blocklab run already in --out")
    p.add_argument(
        "--detect-nonfinite",
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
        dest="log_diagnostics",
        type=at_least(0),
        metavar="K",
        help="gradient flow and LayerNorm statistics every K steps (default: eval-every; 0: off)",
    )
    add_quiet_flag(p, "no progress bar")
    p.add_argument("--no-report", dest="report", action="store_false", help="skip report.html")
    add_json_flag(p, "the outcome (step, accuracy, loss, seconds, tokens/s)")
    p.set_defaults(func=train_command, owns=train_out)


def _add_eval(sub: argparse._SubParsersAction) -> None:
    """Register ``eval``."""
    p = add_command(
        sub, "eval",
        "Score a model on a split of its task: the loss and the accuracy as the task counts it: exact "
        "match (every answer position right) for the puzzles, token accuracy for the language-model "
        "tasks (tiny-lm, text: with perplexity, and bits per character for text). The task is the one "
        "its checkpoint records, or --task.",
    )
    add_model_and_task_flags(p)
    p.add_argument("--split", default="test", choices=("test", "train"), metavar="SPLIT",
                   help=one_of(("test", "train"), "test"))
    p.add_argument("--batch-size", dest="batch_size", type=at_least(1), default=1024,
                   metavar="N", help="examples per forward pass (default: 1024)")
    add_device_flags(p)
    add_json_flag(p, "the scores")
    p.set_defaults(func=eval_command)


def _add_predict(sub: argparse._SubParsersAction) -> None:
    """Register ``predict``."""
    p = add_command(
        sub, "predict",
        "A model's answer to each --input, with its probability: the task's answer when the checkpoint "
        "records a task (or --task names one), else the most likely next token.",
    )
    add_model_and_task_flags(p)
    p.add_argument(
        "--input", action="append", required=True, metavar="TEXT",
        help="a query in the task's format (repeatable)",
    )
    add_device_flags(p)
    add_json_flag(p, "the answers")
    p.set_defaults(func=predict_command)


def resume_command(out: Path) -> str:
    """The command that continues the run in ``out`` (config.json holds everything else)."""
    return f"blocklab train --resume --out {shlex.quote(str(out))}"


def _main_process() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


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
    agree with it, but --steps and --target-accuracy (training.resume.EXTENSIBLE), which extend the run."""
    saved = read_run_config(folder)
    model_config, train_config = saved.model, saved.train
    task = task_from_dict(saved.task)
    asked_model, asked_train = set_fields(args, FIELDS), set_fields(args, TRAIN_FIELDS)
    asked_train, extension = split(asked_train)
    problem = (
        flag_difference(model_config.to_dict(), model_config.replace(**asked_model).to_dict())
        or flag_difference(train_config.to_dict(), train_config.replace(**asked_train).to_dict())
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


def train_out(args: argparse.Namespace) -> Path:
    """The run folder ``train`` writes: ``--out``, else ``runs/TASK``."""
    return Path(args.out) if args.out else default_out(args.task or DEFAULT_TASK)


def train_command(args: argparse.Namespace) -> int:
    """``blocklab train``: build the configs (or read them back with --resume), train, print the outcome."""
    out = train_out(args)
    # --resume reads the run's config.json: only once the folder is known to be a run (its marker)
    if args.resume and inspect_folder(out, "run") is not None and (out / CONFIG).exists():
        model_config, train_config, task = resumed_configs(args, out)
    else:
        model_config, train_config, task = configs_from_args(args)
    callbacks = []
    every = train_config.eval_every if args.log_diagnostics is None else args.log_diagnostics
    if every:
        from ..inspect.diagnostics import DiagnosticsLogger

        callbacks.append(DiagnosticsLogger(every))
    json_on_stdout = args.json == "-"
    try:
        result = train(
            model_config,
            train_config,
            task,
            out,
            callbacks=callbacks,
            resume=args.resume,
            overwrite=args.overwrite,
            progress=not args.quiet and not json_on_stdout,
            report=args.report,
            detect_nonfinite=args.detect_nonfinite,
            force=args.force,
        )
    except TrainingDiverged as error:
        print(f"blocklab: error: {error}", file=sys.stderr, flush=True)
        return 1
    except TrainingInterrupted as stop:  # Ctrl-C: say how to go on from the checkpoint it names
        if stop.checkpoint is None or stop.out_dir is None:
            raise
        message = f"{stop}; continue with: {resume_command(stop.out_dir)}"
        raise TrainingInterrupted(message, stop.step, stop.checkpoint, stop.out_dir) from None
    if not _main_process():
        return 0
    return _print_outcome(args, out, result, train_config, task)


def _print_outcome(args: argparse.Namespace, out: Path, result: TrainResult, train_config: TrainConfig,
                   task: Task) -> int:
    """The outcome of ``train``: its JSON (--json) and its two lines (how it ended, where it was written)."""
    summary = {
        "out": str(out),
        "step": result.step,
        "steps": train_config.steps,
        "stopped": result.stopped,
        **{f"eval_{key}": value for key, value in result.eval.items()},
        "train_loss": result.loss,
        "seconds": result.seconds,
        "tokens_per_s": result.tokens_per_s,
    }
    if emit_json(args.json, summary):
        return 0
    why = "target accuracy reached" if result.stopped == "target" else "all steps done"
    if result.resumed_step is not None and result.step == result.resumed_step:
        more = "--target-accuracy none (or higher) and " if result.stopped == "target" else ""
        why = f"{why} before: nothing to train; pass {more}--steps N (N > {result.step}) to extend it"
    held_out = f"held-out {describe_eval(result.eval, task.metric)}" if result.eval else "not evaluated"
    print(f"{task.name}: {held_out} at step {result.step} of {train_config.steps} ({why})")
    written = [name for name in run_files(out) if name != CHECKPOINTS]
    written += [str(result.checkpoint.relative_to(out))] if result.checkpoint else []
    print(
        f"{result.seconds:.1f} s, {result.tokens_per_s:,.0f} tokens/s; run folder {out}: {', '.join(written)}"
    )
    say_written(args.json)
    return 0


def model_task(loaded: Loaded, args: argparse.Namespace) -> Task | None:
    """The task ``--task`` names, else the one the checkpoint records (None: neither); refused when
    the model cannot run it (another vocabulary, too short, not causal)."""
    task = task_from_args(args) if args.task else loaded.task
    if task is not None:
        check_task_fits(loaded.model.config, task)
    return task


def eval_command(args: argparse.Namespace) -> int:
    """``blocklab eval``: loss and accuracy (as the task counts it) of a model on a split of its task."""
    loaded = load(args.model, allow_nonfinite=args.allow_nonfinite)
    task = model_task(loaded, args)
    if task is None:
        raise UsageError(f"{loaded.source.path} does not record a task (not trained by blocklab train?); "
                         "pass --task NAME")
    data = task.split(args.split)
    compute = resolve_compute(args.device, args.dtype)
    with compute.autocast():
        model = loaded.model.to(compute.device)
        result = evaluate(model, data, args.batch_size, task.metric, task.char_level)
    record = {"model": str(loaded.source.path), "task": task.to_dict(), "split": args.split,
              "examples": len(data), **result}
    if emit_json(args.json, record):
        return 0
    step = f" (step {loaded.meta['step']})" if "step" in loaded.meta else ""
    print(
        f"{loaded.source.path}{step}: {task.name} {args.split} split, {len(data)} examples: "
        f"{describe_eval(result, task.metric)}"
    )
    say_written(args.json)
    return 0


def predict_command(args: argparse.Namespace) -> int:
    """``blocklab predict``: the model's answer to each ``--input``, with its probability."""
    compute = resolve_compute(args.device, args.dtype)
    loaded = load(args.model, allow_nonfinite=args.allow_nonfinite)
    model, tokenizer = loaded.model.to(compute.device).eval(), loaded.tokenizer
    task = model_task(loaded, args)
    if task is None and tokenizer is None:
        raise UsageError(f"{loaded.source.path} has neither a task nor a tokenizer; pass --task NAME")
    results = []
    for text in args.input:
        if task is not None:
            ids, positions = task.encode_query(text)
        else:  # no task recorded (an imported model): predict the next token
            ids = tokenizer.encode(text)
            positions = [len(ids) - 1]
        with torch.no_grad(), compute.autocast():
            logits = model(torch.tensor([ids], device=compute.device))[0, positions]  # (P, vocab)
        refuse_nonfinite_output(model, logits, "logits", torch.tensor([ids], device=compute.device))
        probs = torch.softmax(logits.float(), dim=-1).cpu()  # (P, vocab)
        top = probs.argmax(-1)
        answer = task.decode_answer(top.tolist()) if task else tokenizer.decode(top.tolist())
        results.append({"input": text, "answer": answer, "probability": float(probs.max(-1).values.prod())})
    if emit_json(args.json, results if len(results) > 1 else results[0]):
        return 0
    for r in results:
        print(f"{r['input']} -> {r['answer']}  (p={r['probability']:.3f})")
    say_written(args.json)
    return 0
