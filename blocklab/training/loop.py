"""The training loop: AdamW, linear warmup then cosine decay, gradient clipping, held-out
evaluation, early stop, checkpoints and ``--resume``, single process or DDP (gloo; NCCL on CUDA),
on any device, in float32 or mixed precision (``TrainConfig.device``, ``dtype``: blocklab/device.py).

    result = train(model_config, TrainConfig(steps=600), get_task("listops"), "runs/listops")

Deterministic: model init comes from ``torch.manual_seed(seed)`` and the data order is a pure
function of (seed, step) (``batches.batch_indices``), so the same seed gives the same losses bit for bit,
and a resumed run (weights, AdamW moments, RNG state restored) continues exactly where the
interrupted one was. Under ``torchrun`` every process builds the same data and takes its slice
of each global batch; gradients are averaged by ``DistributedDataParallel``.

The model is initialised on the CPU (the same weights whatever the device), then moved; the data
stay on the CPU and each batch moves to the device. Mixed precision runs forward passes under
torch.autocast; the weights, AdamW's moments and the checkpoints stay float32, and float16 adds a
gradient scaler (a step whose gradients overflow is skipped and logged ``"skipped": true``).
"""

from __future__ import annotations

import math
import os
import time
import warnings
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..device import resolve_compute, same_rng
from ..errors import BlocklabWarning
from ..inspect.nonfinite import NonFiniteError, check_parameters, watch_step
from ..nn.config import ModelConfig
from ..nn.memory import check_memory
from ..nn.model import Transformer
from ..nn.moe import balancing_term
from ..tasks import IGNORE_INDEX, Task, get_task
from .batches import batch_indices
from .callbacks import Callback, StepContext, layer_grad_norms, layer_groups  # noqa: F401 - re-exported
from .distributed import Processes
from .evaluation import describe_eval, evaluate  # noqa: F401 - describe_eval re-exported, as evaluate
from .resources import deferred_interrupt, resolve_threads, share_cores  # noqa: F401 - share_cores re-exported
from .resume import EXTENSIBLE  # noqa: F401 - re-exported: blocklab.training.loop is where users look
from .session import Session, TrainingInterrupted  # noqa: F401 - TrainingInterrupted re-exported
from .state import (
    tokens_per_second,
)
from .train_config import (  # noqa: F401 - re-exported: blocklab.training.loop is where users look
    TASK_DEFAULTS,
    TRAIN_FIELDS,
    TrainConfig,
    lr_at,
    schedule_warning,
    task_train_config,
    train_config_from_dict,
)

METRIC_SHORT = {"exact_match": "acc", "token_accuracy": "tok acc"}  # the progress line's labels


@dataclass
class TrainResult:
    """How a run ended."""

    model: Transformer
    step: int  # updates done
    loss: float  # the last training batch's loss
    eval: dict[str, float]  # the last held-out evaluation: loss, accuracy
    stopped: str  # "target" (reached target_accuracy) or "steps"
    seconds: float  # wall time of the loop (all sessions of a resumed run)
    tokens_per_s: float  # training tokens per second (evaluation excluded)
    history: list[dict[str, Any]] = field(default_factory=list)  # the metrics lines
    out_dir: Path | None = None
    checkpoint: Path | None = None  # the final checkpoint folder
    resumed_step: int | None = None  # the step a resumed run continued from (None: a new run)

    @property
    def accuracy(self) -> float:
        """Held-out exact-match accuracy at the end."""
        return self.eval.get("accuracy", float("nan"))


class TrainingDiverged(RuntimeError):
    """The loss or the gradient became NaN/Inf; nothing was saved for that step."""


def check_task_fits(config: ModelConfig, task: Task) -> None:
    """ValueError when the model config cannot run the task (vocabulary, length, causality)."""
    need = task.config_overrides()
    problems = [
        f"{k}={getattr(config, k)!r} but task {task.name!r} needs {v!r}"
        for k, v in need.items()
        if k != "max_seq_len" and getattr(config, k) != v
    ]
    if config.max_seq_len < need["max_seq_len"]:
        problems.append(
            f"max_seq_len={config.max_seq_len} but task {task.name!r} needs >= {need['max_seq_len']}"
        )
    if problems:
        raise ValueError(f"ModelConfig.{problems[0]} (build the config with the task's config_overrides())")


def make_optimizer(model: nn.Module, c: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices and embeddings only (biases and norm gains are not decayed).

    The fused implementation (one kernel for every parameter's update) where this torch has it
    for the parameters' device (CPU since torch 2.4), else the multi-tensor ``foreach`` one. Both
    are deterministic; they round differently from the one-tensor-at-a-time loop in the last bits.
    """
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": c.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    try:
        return torch.optim.AdamW(groups, lr=c.lr, betas=(c.beta1, c.beta2), fused=True)
    except RuntimeError:  # "fused=True requires ... supported devices": this torch has no fused kernel here
        return torch.optim.AdamW(groups, lr=c.lr, betas=(c.beta1, c.beta2), foreach=True)


def check_can_run(model_config: ModelConfig, train_config: TrainConfig, task: Task, device: torch.device,
                  detect_nonfinite: bool, force: bool) -> None:
    """Refuse, before anything is built, a run that cannot work: a config that does not fit the task, a
    run whose memory estimate exceeds what is available (unless ``force``), --detect-nonfinite under
    several processes."""
    check_task_fits(model_config, task)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))  # before joining the process group
    if device.type == "cpu":  # the estimate is of host memory; a GPU reports its own out-of-memory
        check_memory(
            model_config,
            max(1, train_config.batch_size // world_size),
            task.seq_len,
            force=force,
            what=f"training on {task.name}",
            eval_batch_size=train_config.eval_batch_size,
        )
    if detect_nonfinite and world_size > 1:
        raise ValueError("--detect-nonfinite needs a single process (a stop on one would hang the others)")


def train(
    model_config: ModelConfig,
    train_config: TrainConfig | None = None,
    task: Task | None = None,
    out_dir: str | Path | None = None,
    callbacks: Sequence[Callback] = (),
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = False,
    report: bool = True,
    detect_nonfinite: bool = False,
    force: bool = False,
) -> TrainResult:
    """Train a model of ``model_config`` on ``task`` (default listops); with ``out_dir``, write the
    run folder there (config.json, metrics.jsonl, checkpoints, report.html).

    ``out_dir`` must be new, empty, or a run folder blocklab made (files.folders.claim_folder: never
    ``.``, the home folder or a filesystem root, never another tool's folder). ``resume`` continues
    from the newest checkpoint in ``out_dir``: the configs must equal its config.json, but
    ``steps`` and ``target_accuracy`` (EXTENSIBLE) may change to extend a finished or stopped run,
    later steps taking the learning rate ``lr_at`` gives over the new total. ``overwrite``
    replaces a run already there (removing only the files the run wrote). Raises TrainingDiverged
    when the loss or the gradient turns NaN/Inf, RunLockedError when another live run holds
    ``out_dir``, TrainingInterrupted on Ctrl-C: the step in progress finishes and is checkpointed,
    and the error names the checkpoint (a second Ctrl-C stops at once).
    ``detect_nonfinite`` watches every stage: the first NaN/Inf stops the run naming its stage,
    layer and position, and the last good weights are checkpointed. The memory guard refuses a
    run whose estimate exceeds the available memory (InsufficientMemoryError) unless ``force``.
    """
    if resume and overwrite:
        raise ValueError("resume and overwrite contradict each other: --resume continues the run in the "
                         "folder, --overwrite replaces it; pass one of them")
    task = task if task is not None else get_task()
    train_config = train_config if train_config is not None else task_train_config(task.name)
    compute = resolve_compute(train_config.device, train_config.dtype)  # DeviceError when unavailable
    check_can_run(model_config, train_config, task, compute.device, detect_nonfinite, force)
    procs = Processes.from_env(compute.device)
    threads = torch.get_num_threads()
    torch.set_num_threads(resolve_threads(train_config.threads))
    try:
        session = Session(model_config, train_config, task, out_dir, procs, compute)
        with _Run(session, list(callbacks)) as run:
            run.detect_nonfinite = detect_nonfinite
            run.setup(resume, overwrite)
            problem = schedule_warning(train_config)
            if procs.main and not run.progress.done and problem is not None:
                warnings.warn(problem, BlocklabWarning, stacklevel=2)
            result = run.loop(progress and procs.main, report)
        procs.close(wait=True)
        return result
    finally:
        torch.set_num_threads(threads)
        procs.close()


class _Run:
    """One training session's step loop; ``train`` is its interface. What the run is (configs, task,
    processes, device), its folder, checkpoints and what survives a session (``Progress``) are its
    ``session``'s (session.py); the loop reads them there."""

    def __init__(self, session: Session, callbacks: list[Callback]) -> None:
        tc, procs = session.tc, session.procs
        if tc.batch_size % procs.world_size:
            raise ValueError(
                f"TrainConfig.batch_size={tc.batch_size} must be divisible by the "
                f"{procs.world_size} processes"
            )
        self.session, self.callbacks = session, callbacks
        self.mc, self.tc, self.task, self.procs = session.mc, tc, session.task, procs
        self.compute, self.device = session.compute, session.device
        self.scaler = self.compute.grad_scaler()  # float16 only; otherwise it passes everything through
        self.train_data, self.test_data = self.task.split("train"), self.task.split("test")
        self.detect_nonfinite = False

    def __enter__(self) -> _Run:
        return self

    def __exit__(self, *exc: object) -> None:
        # DDP's reducer holds the process group: dropped before Processes.close destroys the group
        # (its docstring says why its reference must be the last)
        vars(self).pop("ddp", None)
        self.session.close()

    def setup(self, resume: bool, overwrite: bool) -> None:
        """Build model and optimizer; open the session (claim the folder, restore the newest checkpoint
        if resuming); wrap the model in DDP under torchrun."""
        torch.manual_seed(self.tc.seed)  # seeds the CPU's generator and every GPU's
        self.model = Transformer(self.mc).to(self.device)  # initialised on the CPU: the same weights anywhere
        self.model.tokenizer = self.task.tokenizer  # the trained model speaks its task's vocabulary
        self.optimizer = make_optimizer(self.model, self.tc)
        self.progress = self.session.progress
        self.session.open(self.model, self.optimizer, self.scaler, resume, overwrite)
        self.ddp: nn.Module = self.model
        if self.procs.world_size > 1:
            gpu = [self.device] if self.device.type == "cuda" else None
            self.ddp = DistributedDataParallel(self.model, device_ids=gpu)

    # -- the loop -------------------------------------------------------------------------------

    def loop(self, show_progress: bool, report: bool) -> TrainResult:
        """Train until ``steps`` or the target accuracy; checkpoint, log, report."""
        c = self.tc
        tokens_per_step = c.batch_size * self.train_data.inputs.shape[1]
        self.progress.session_start = time.perf_counter()
        try:
            # one process only: under DDP every rank would have to stop at the same step
            with deferred_interrupt(self.procs.world_size == 1) as interrupted, \
                    progress_context(show_progress) as bar:
                done = self.progress.step
                bar_task = bar.add_task("train", total=c.steps, completed=done, status="") if bar else None
                window_tokens, window_seconds = 0, 0.0
                while not self.progress.done and self.progress.step < c.steps:
                    start = time.perf_counter()
                    try:
                        with watch_step(self.model, self.detect_nonfinite, self._stop_nonfinite):
                            row = self._step(self.progress.step + 1)
                        spent = time.perf_counter() - start
                        window_seconds += spent
                        window_tokens += tokens_per_step
                        self.progress.train_seconds += spent
                        self.progress.tokens += tokens_per_step
                        if row is not None and self.progress.step % c.log_every == 0:
                            row["tokens_per_s"] = window_tokens / max(window_seconds, 1e-9)
                            window_tokens, window_seconds = 0, 0.0
                        self._after_step(row)
                    except KeyboardInterrupt as error:  # a second Ctrl-C: mid-step, nothing consistent
                        raise self.session.interrupted(save=False) from error
                    if bar is not None:
                        bar.update(bar_task, completed=self.progress.step, status=self._status())
                    if interrupted[0] and not self.progress.done:
                        raise self.session.interrupted(save=True)
        except TrainingDiverged:
            self.session.write_report(report)
            raise
        seconds = self.session.elapsed()
        self.session.write_report(report)
        return TrainResult(
            model=self.model,
            step=self.progress.step,
            loss=self.progress.loss,
            eval=dict(self.progress.eval),
            stopped=self.progress.stopped,
            seconds=seconds,
            tokens_per_s=tokens_per_second(self.progress.tokens, self.progress.train_seconds),
            history=self.progress.history,
            out_dir=Path(self.session.folder) if self.session.folder else None,
            checkpoint=self.progress.checkpoint,
            resumed_step=self.progress.resumed_step,
        )

    def _step(self, step: int) -> dict[str, Any] | None:
        """One update: forward, backward, callbacks, clip, AdamW. The metrics row, if one is due."""
        c, procs = self.tc, self.procs
        lr = lr_at(step, c)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        batch = batch_indices(step, len(self.train_data), c.batch_size, c.seed)
        local = batch.chunk(procs.world_size)[procs.rank]
        x, y = self.train_data.inputs[local], self.train_data.targets[local]
        mask = self.train_data.attention_mask  # a task that pads: pads are masked, not seen as tokens
        mask = None if mask is None else mask[local].to(self.device)  # (b, T)
        logged = step % c.log_every == 0 or step == c.steps
        n_local = int((y != IGNORE_INDEX).sum())
        x, y = x.to(self.device), y.to(self.device)
        with self.compute.autocast():
            _, loss = self.ddp(x, y, attention_mask=mask)
            balance = balancing_term(self.model, mask)  # None without experts
        if procs.world_size == 1:
            self.progress.loss = loss.item()
        else:  # the global batch's mean; each process's loss weighted so DDP's average is that mean
            n_global = int((self.train_data.targets[batch] != IGNORE_INDEX).sum())
            self.progress.loss = procs.sum(loss.item() * n_local) / max(n_global, 1)
            if n_local * procs.world_size != n_global:
                loss = loss * (n_local * procs.world_size / max(n_global, 1))
        row: dict[str, Any] = {"step": step, "loss": self.progress.loss, "lr": lr}
        if balance is not None:  # Switch Transformer's balancing term, added to what backward sees
            row["aux_loss"] = balance[0].item()
            loss = loss + balance[1]
        if not math.isfinite(self.progress.loss):
            raise self._diverged(row, f"the training loss is {self.progress.loss}")
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()  # float16: the loss scaled up, so small gradients survive
        self.scaler.unscale_(self.optimizer)  # .grad is now dL/dparameter, for callbacks and clipping
        extra: dict[str, Any] = layer_grad_norms(self.model) if logged else {}
        if procs.main and self.callbacks:
            ctx = StepContext(step, self.model, x, y, self.progress.loss, lr, c, self.task, logged, mask)
            extra.update(self._callbacks(ctx))
        max_norm = c.grad_clip if c.grad_clip > 0 else math.inf
        row["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        if not math.isfinite(row["grad_norm"]):
            if not self.scaler.is_enabled():
                raise self._diverged(row, f"the gradient norm is {row['grad_norm']}")
            # float16 overflowed at this scale: the scaler skips the update and halves the scale
            row["skipped"] = True
        if self.scaler.is_enabled():
            row["grad_scale"] = self.scaler.get_scale()
        self.scaler.step(self.optimizer)  # optimizer.step(), unless float16 gradients overflowed
        self.scaler.update()
        self.progress.step = step
        due = logged or extra or step % c.eval_every == 0 or row.get("skipped")
        return {**row, **extra} if due else None

    def _callbacks(self, ctx: StepContext) -> dict[str, Any]:
        """Run the callbacks, restoring RNG state and train mode so they cannot change the run."""
        merged: dict[str, Any] = {}
        mode = self.model.training
        for callback in self.callbacks:
            with same_rng(self.device), self.compute.autocast():
                out = callback(ctx)
            self.model.train(mode)
            merged.update(out or {})
        return merged

    def _after_step(self, row: dict[str, Any] | None) -> None:
        """Evaluate, decide whether to stop, log, checkpoint."""
        c, step = self.tc, self.progress.step
        if step % c.eval_every == 0 or step == c.steps:
            with self.compute.autocast():
                self.progress.eval = evaluate(self.model, self.test_data, c.eval_batch_size, self.task.metric,
                                     self.task.char_level)
            assert row is not None
            row.update({f"eval_{key}": value for key, value in self.progress.eval.items()})
            if c.target_accuracy is not None and self.progress.eval["accuracy"] >= c.target_accuracy:
                self.progress.stopped = "target"
        self.progress.done = self.progress.stopped == "target" or step == c.steps
        if row is not None:
            row["time"] = self.session.elapsed()
            self.session.log(row)
        if self.progress.done or (c.checkpoint_every and step % c.checkpoint_every == 0):
            self.session.save()

    def _stop_nonfinite(self, error: NonFiniteError) -> TrainingDiverged:
        """--detect-nonfinite: checkpoint the last good weights (if finite), then stop naming the stage."""
        if self.session.folder is not None and check_parameters(self.model) is None:
            self.session.save()
        step = self.progress.step + (error.event.kind != "parameter")  # weights: after the update
        return self._diverged({"step": step, "nonfinite": error.event.describe()}, str(error))

    def _diverged(self, row: dict[str, Any], what: str) -> TrainingDiverged:
        """Log the bad step and build the error; nothing is saved for this step."""
        self.session.log({**row, "time": self.session.elapsed()})
        last = (
            f"the last good checkpoint is {self.progress.checkpoint}"
            if self.progress.checkpoint
            else "no checkpoint was written"
        )
        return TrainingDiverged(
            f"training stopped at step {row['step']}: {what}; nothing was saved for this step, {last}"
        )

    def _status(self) -> str:
        acc = ""
        if self.progress.eval:
            acc = f"  {METRIC_SHORT[self.task.metric]} {self.progress.eval['accuracy']:.1%}"
            if self.task.metric == "token_accuracy":  # a language model: its perplexity too
                acc += f"  ppl {self.progress.eval['perplexity']:.3g}"
        tps = tokens_per_second(self.progress.tokens, self.progress.train_seconds)
        return f"loss {self.progress.loss:.4f}{acc}  {tps:,.0f} tok/s"

def progress_context(enabled: bool) -> Any:
    """A rich progress bar with loss, accuracy and tokens/s, or nothing."""
    if not enabled:
        return nullcontext(None)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("[bold]train"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[status]}"),
    )
