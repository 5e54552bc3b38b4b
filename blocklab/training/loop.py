"""The training loop: AdamW, linear warmup then cosine decay, gradient clipping, held-out
evaluation, early stop, checkpoints and ``--resume``, single process or DDP (gloo; NCCL on CUDA),
on any device, in float32 or mixed precision (``TrainConfig.device``, ``dtype``: blocklab/device.py).

    result = train(model_config, TrainConfig(steps=600), get_task("listops"), "runs/listops")

Deterministic: model init comes from ``torch.manual_seed(seed)`` and the data order is a pure
function of (seed, step) (``batch_indices``), so the same seed gives the same losses bit for bit,
and a resumed run (weights, AdamW moments, RNG state restored) continues exactly where the
interrupted one was. Under ``torchrun`` every process builds the same data and takes its slice
of each global batch; gradients are averaged by ``DistributedDataParallel``.

The model is initialised on the CPU (the same weights whatever the device), then moved; the data
stay on the CPU and each batch moves to the device. Mixed precision runs forward passes under
torch.autocast; the weights, AdamW's moments and the checkpoints stay float32, and float16 adds a
gradient scaler (a step whose gradients overflow is skipped and logged ``"skipped": true``).
"""

from __future__ import annotations

import hashlib
import math
import os
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from ..device import Compute, device_rng_state, model_device, resolve_compute, same_rng, set_device_rng_state
from ..errors import BlocklabWarning
from ..files.atomic import atomic_write_bytes, open_regular
from ..files.folders import (
    CONFIG,
    MARKER,
    METRICS,
    MODEL_FILE,
    RunLock,
    claim_folder,
    inspect_folder,
    new_marker,
    write_marker,
)
from ..files.jsonfiles import json_line, json_safe, write_json
from ..inspect.nonfinite import NonFiniteError, check_parameters, watch_step
from ..nn.config import ModelConfig
from ..nn.memory import check_memory
from ..nn.model import Transformer
from ..tasks import ACCURACY_METRICS, IGNORE_INDEX, Task, TaskData, exact_match, get_task
from .checkpoint import load_checkpoint, save_checkpoint
from .distributed import Processes
from .runfiles import (
    SavedRun,
    check_run_names,
    checkpoint_step,
    clear_run,
    latest_checkpoint,
    publish_checkpoint,
    read_metrics,
    read_run_config,
    run_config,
    run_files,
    truncate_metrics,
)
from .state import (
    OPTIMIZER_DIGEST,
    OPTIMIZER_FILE,
    STATE_DIGEST,
    STATE_FILE,
    decode_rng,
    encode_rng,
    load_optimizer_state,
    read_train_state,
    save_optimizer_state,
    state_bytes,
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


@lru_cache(maxsize=8)
def epoch_order(seed: int, epoch: int, n: int) -> Tensor:
    """The permutation of the ``n`` training examples used in ``epoch``."""
    # torch's CPU generator keeps 32 bits of its seed, so (seed, epoch) is hashed down to 32 bits
    mixed = int.from_bytes(hashlib.sha256(f"{seed}/{epoch}".encode()).digest()[:4], "little")
    return torch.randperm(n, generator=torch.Generator().manual_seed(mixed))


def batch_indices(step: int, n: int, batch_size: int, seed: int) -> Tensor:
    """Training-example indices of global batch ``step`` (1-based): the next ``batch_size`` items of
    the endless sequence epoch 0's permutation, epoch 1's, ... A pure function of its arguments."""
    flat = torch.arange((step - 1) * batch_size, step * batch_size)
    epochs, offsets = flat // n, flat % n
    out = torch.empty(batch_size, dtype=torch.long)
    for epoch in epochs.unique().tolist():
        where = epochs == epoch
        out[where] = epoch_order(seed, epoch, n)[offsets[where]]
    return out


@torch.no_grad()
def evaluate(model: nn.Module, data: TaskData, batch_size: int = 1024, metric: str = "exact_match",
             char_level: bool = False) -> dict[str, float]:
    """Held-out ``loss`` (mean cross-entropy over scored tokens, nats), ``exact_match`` (the fraction of
    examples right at every scored token), ``token_accuracy`` (the fraction of scored tokens right),
    ``perplexity`` (exp(loss)), with ``char_level`` ``bits_per_char`` (loss / ln 2: one token is one
    character), and ``accuracy``: the one of the two the task judges by (``metric``, ACCURACY_METRICS).

    A split that carries an attention mask (a task that pads) is evaluated with it. Each batch moves
    to the model's device; the forward runs in the caller's precision (inside ``Compute.autocast()``
    for mixed precision).
    """
    if metric not in ACCURACY_METRICS:
        raise ValueError(f"metric={metric!r} is not one of: {', '.join(ACCURACY_METRICS)}")
    was_training = model.training
    model.eval()
    device = model_device(model)
    loss_sum, scored, correct, tokens_right = 0.0, 0, 0, 0
    try:
        for start in range(0, len(data), batch_size):
            rows = slice(start, start + batch_size)
            x, y = data.inputs[rows].to(device), data.targets[rows].to(device)
            mask = data.attention_mask
            logits = model(x) if mask is None else model(x, attention_mask=mask[rows].to(device))
            n = int((y != IGNORE_INDEX).sum())
            if n:
                flat = torch.nn.functional.cross_entropy(
                    logits.flatten(0, 1).float(), y.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
                )
                loss_sum += float(flat)
                scored += n
            correct += int(exact_match(logits, y).sum())
            tokens_right += int(((logits.argmax(-1) == y) & (y != IGNORE_INDEX)).sum())
    finally:
        model.train(was_training)
    loss = loss_sum / max(scored, 1)
    numbers = {"loss": loss, "exact_match": correct / max(len(data), 1),
               "token_accuracy": tokens_right / max(scored, 1),
               "perplexity": math.exp(loss) if loss < 700 else math.inf}  # exp overflows a float past ~709
    if char_level:
        numbers["bits_per_char"] = loss / math.log(2)
    return {**numbers, "accuracy": numbers[metric]}


def describe_eval(numbers: dict[str, float], metric: str) -> str:
    """``evaluate``'s numbers in words, the task's metric first: ``token accuracy 93.10% (loss 0.2134,
    perplexity 1.24, 0.308 bits per character)`` or ``exact match 99.75% (loss 0.0123)``."""
    more = [f"loss {numbers['loss']:.4f}"]
    if metric == "token_accuracy":
        more.append(f"perplexity {numbers['perplexity']:.4g}")
    if "bits_per_char" in numbers:
        more.append(f"{numbers['bits_per_char']:.4g} bits per character")
    return f"{ACCURACY_METRICS[metric]} {numbers['accuracy']:.2%} ({', '.join(more)})"


# ---- per-layer gradient norms, recorded at log steps ----------------------------------------------


def layer_groups(model: Transformer) -> dict[str, list[nn.Parameter]]:
    """Parameters by layer: ``embed`` (embeddings, positions), ``blocks.{i}``, ``head`` (ln_f, head)."""
    groups: dict[str, list[nn.Parameter]] = {}
    for name, p in model.named_parameters():
        parts = name.split(".")
        key = (
            ".".join(parts[:2])
            if parts[0] == "blocks"
            else ("head" if parts[0] in ("ln_f", "head") else "embed")
        )
        groups.setdefault(key, []).append(p)
    return groups


def layer_grad_norms(model: Transformer) -> dict[str, float]:
    """L2 norm of each layer's gradient (before clipping): ``grad_norm/blocks.0`` ..."""
    norms = {}
    for key, params in layer_groups(model).items():
        grads = [p.grad.detach().float().norm() for p in params if p.grad is not None]
        if grads:
            norms[f"grad_norm/{key}"] = float(torch.stack(grads).norm())
    return norms


# ---- callbacks -------------------------------------------------------------------------------------


@dataclass
class StepContext:
    """What a callback sees, after backward and before clipping and the optimizer step.

    ``model.parameters()`` carry this step's gradients in ``.grad`` (averaged over processes
    under DDP). A callback may run its own forward passes (the trainer restores the RNG state
    and train/eval mode afterwards) but must not change parameters or ``.grad``: use
    ``torch.autograd.grad`` for extra gradients, never ``.backward()``.
    """

    step: int  # the update about to be applied, 1-based
    model: Transformer  # the plain model (not the DDP wrapper)
    inputs: Tensor  # this process's batch (b, T)
    targets: Tensor  # (b, T), -100 where not scored
    loss: float  # the global batch's loss
    lr: float
    config: TrainConfig
    task: Task
    logged: bool  # whether this step writes a metrics line anyway (step % log_every == 0)
    attention_mask: Tensor | None = None  # (b, T), 0 at padding, for a task that pads


Callback = Callable[[StepContext], "dict[str, Any] | None"]
"""Called on rank 0 every step; a returned dict is merged into that step's metrics.jsonl line."""


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


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped training. The message says where it stopped, the checkpoint to resume from
    (``checkpoint``: the one saved at the interrupted ``step`` when the step could finish) and how."""

    def __init__(self, message: str, step: int, checkpoint: Path | None, out_dir: Path | None) -> None:
        super().__init__(message)
        self.step, self.checkpoint, self.out_dir = step, checkpoint, out_dir


# TrainConfig fields a resumed run may change: when to stop, and where it computes (a run moves from
# one machine to another; on another device it continues, but not bit for bit). Any other difference
# (dtype among them) is another run.
EXTENSIBLE = ("steps", "target_accuracy", "device")


@contextmanager
def deferred_interrupt(enabled: bool = True) -> Iterator[list[bool]]:
    """While active, a first Ctrl-C (SIGINT) only sets ``flag[0]``, so the step in progress finishes
    and can be checkpointed; a second one interrupts at once. Only in the main thread, and only
    when SIGINT has Python's default handler (a worker that ignores it keeps ignoring it)."""
    flag = [False]
    usable = enabled and threading.current_thread() is threading.main_thread() and (
        signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    if not usable:
        yield flag
        return

    def handler(signum: int, frame: object) -> None:
        if flag[0]:
            raise KeyboardInterrupt
        flag[0] = True

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)


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


# Processes one parent runs side by side on this machine (lab.grid's worker pool), set in each
# worker by ``share_cores``. Without it every worker's "auto" would take all the cores: 2 workers x 2
# threads on 2 cores oversubscribe OpenMP, whose spinning threads then run a small model ~10x slower.
_side_by_side = 1


def share_cores(processes: int) -> None:
    """Declare this process one of ``processes`` that share the machine's cores (a pool's workers):
    "auto" threads (``resolve_threads(0)``) then divide the cores among them, as under torchrun."""
    if processes < 1:
        raise ValueError(f"processes={processes}: at least one process runs")
    global _side_by_side
    _side_by_side = processes


def resolve_threads(threads: int) -> int:
    """torch intra-op threads for this process: ``threads``, or for 0 ("auto") the cores this
    process may run on, divided among the processes torchrun started on this machine (or the
    worker processes sharing it, ``share_cores``)."""
    if threads:
        return threads
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    sharing = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1"))) * _side_by_side
    return max(1, cores // sharing)


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
    check_task_fits(model_config, task)
    compute = resolve_compute(train_config.device, train_config.dtype)  # DeviceError when unavailable
    world_size = int(os.environ.get("WORLD_SIZE", "1"))  # before joining the process group
    if compute.device.type == "cpu":  # the estimate is of host memory; a GPU reports its own out-of-memory
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
    procs = Processes.from_env(compute.device)
    threads = torch.get_num_threads()
    torch.set_num_threads(resolve_threads(train_config.threads))
    try:
        with _Run(model_config, train_config, task, out_dir, list(callbacks), procs, compute) as run:
            run.detect_nonfinite = detect_nonfinite
            run.setup(resume, overwrite)
            if procs.main and not run.done and (problem := schedule_warning(train_config)) is not None:
                warnings.warn(problem, BlocklabWarning, stacklevel=2)
            result = run.loop(progress and procs.main, report)
        procs.close(wait=True)
        return result
    finally:
        torch.set_num_threads(threads)
        procs.close()


class _Run:
    """One training session's state; ``train`` is its interface."""

    def __init__(
        self,
        mc: ModelConfig,
        tc: TrainConfig,
        task: Task,
        out_dir: str | Path | None,
        callbacks: list[Callback],
        procs: Processes,
        compute: Compute,
    ) -> None:
        if tc.batch_size % procs.world_size:
            raise ValueError(
                f"TrainConfig.batch_size={tc.batch_size} must be divisible by the "
                f"{procs.world_size} processes"
            )
        self.mc, self.tc, self.task, self.callbacks, self.procs = mc, tc, task, callbacks, procs
        self.compute, self.device = compute, compute.device
        self.scaler = compute.grad_scaler()  # float16 only; otherwise it passes everything through
        self.folder = Path(out_dir) if out_dir is not None and procs.main else None
        self.train_data, self.test_data = task.split("train"), task.split("test")
        self.lock: RunLock | None = None
        self.metrics_file: Any = None
        self.history: list[dict[str, Any]] = []
        self.step, self.seconds_before, self.train_seconds, self.tokens = 0, 0.0, 0.0, 0
        self.session_start = time.perf_counter()
        self.loss, self.eval, self.stopped, self.done = float("nan"), {}, "steps", False
        self.checkpoint: Path | None = None
        self.resumed_step: int | None = None
        self.extended: dict[str, Any] | None = None  # config.json recording an extension, to be written
        self.detect_nonfinite = False

    def __enter__(self) -> _Run:
        return self

    def __exit__(self, *exc: object) -> None:
        # DDP's reducer holds the process group: dropped before Processes.close destroys the group
        # (its docstring says why its reference must be the last)
        vars(self).pop("ddp", None)
        if self.metrics_file is not None:
            self.metrics_file.close()
        if self.lock is not None:
            self.lock.release()

    # -- setup ----------------------------------------------------------------------------------

    def setup(self, resume: bool, overwrite: bool) -> None:
        """Build model and optimizer; claim the folder; restore the newest checkpoint if resuming."""
        torch.manual_seed(self.tc.seed)  # seeds the CPU's generator and every GPU's
        self.model = Transformer(self.mc).to(self.device)  # initialised on the CPU: the same weights anywhere
        self.model.tokenizer = self.task.tokenizer  # the trained model speaks its task's vocabulary
        self.optimizer = make_optimizer(self.model, self.tc)
        failure, found = None, None
        if self.folder is not None:
            try:
                found = self._claim_folder(resume, overwrite)
            except Exception as error:  # re-raised below, after telling the other ranks
                failure = error
        message, found = self.procs.share((None if failure is None else str(failure), found))
        if failure is not None:
            raise failure
        if message is not None:
            raise RuntimeError(f"process 0 could not set up the run folder: {message}")
        if found is not None:
            self._restore(Path(found))
        if self.extended is not None and self.folder is not None:  # recorded once the checkpoint loaded
            write_json(self.folder / CONFIG, self.extended)
        self.ddp: nn.Module = self.model
        if self.procs.world_size > 1:
            gpu = [self.device] if self.device.type == "cuda" else None
            self.ddp = DistributedDataParallel(self.model, device_ids=gpu)
        if self.folder is not None:
            fd = open_regular(self.folder / METRICS, os.O_WRONLY | os.O_APPEND | os.O_CREAT)  # no link/pipe
            self.metrics_file = os.fdopen(fd, "a")  # closed in __exit__

    def _claim_folder(self, resume: bool, overwrite: bool) -> str | None:
        """Claim and lock the folder (files.folders.claim_folder), check or write config.json; the
        checkpoint to resume from, if any."""
        folder = self.folder
        assert folder is not None
        if resume and inspect_folder(folder, "run") is None:  # before the claim makes the folder
            raise ValueError(f"--resume: {folder} holds no blocklab run (no {MARKER}); check the path, or "
                             "drop --resume to start a new run there")
        self.lock, _ = claim_folder(folder, "run")
        check_run_names(folder)  # no link or pipe among the names a run writes, checkpoints included
        config = run_config(self.mc, self.tc, self.task, self.procs.world_size)
        held = run_files(folder)
        if resume and (folder / CONFIG).exists():
            saved = read_run_config(folder)
            self._check_same_run(saved, config)
            latest = latest_checkpoint(folder)
            if latest is not None:
                self._extend(saved, config, checkpoint_step(latest))
                return str(latest)
        elif held and not overwrite:
            raise ValueError(
                f"{folder} already holds a run ({', '.join(held)}); pass --resume to continue "
                "it, --overwrite to start over, or choose another --out"
            )
        clear_run(folder)
        write_marker(folder, new_marker("run"))  # a new run: a new id
        write_json(folder / CONFIG, config)
        return None

    def _check_same_run(self, saved: SavedRun, config: dict[str, Any]) -> None:
        """--resume: the model, task and training settings must be the run's, but the fields an
        extension may change (EXTENSIBLE)."""
        fixed = {k: v for k, v in config["train"].items() if k not in EXTENSIBLE}
        saved_fixed = {k: v for k, v in saved.train.to_dict().items() if k not in EXTENSIBLE}
        pairs = [("model", saved.model.to_dict(), config["model"]), ("task", saved.task, config["task"]),
                 ("train", saved_fixed, fixed)]
        diffs = [f"{part}: {old} != {new}" for part, old, new in pairs if old != new]
        if diffs:
            raise ValueError(
                f"--resume: the run in {self.folder} was configured differently ({diffs[0]}); "
                "resume with its config.json or start a new run"
            )

    def _extend(self, saved: SavedRun, config: dict[str, Any], at_step: int) -> None:
        """--resume with other ``steps`` / ``target_accuracy``: check it, and keep the config.json that
        records it (``extended``, written once the checkpoint has loaded: a failed resume changes nothing).

        The schedule rule: the learning rate of every later step is ``lr_at(step)`` over the new
        total, the rate a run configured with that many steps from the start has there (the
        cosine is recomputed, so it steps up when a finished run is extended)."""
        before = saved.train.to_dict()
        changed = {k: before[k] for k in EXTENSIBLE if before[k] != config["train"][k]}
        if not changed:
            return
        if self.tc.steps < at_step:
            raise ValueError(
                f"--resume: the run in {self.folder} is at step {at_step}; steps={self.tc.steps} would "
                f"undo training, so it must be >= {at_step}"
            )
        record = {"at_step": at_step, **{f"{k}_before": v for k, v in changed.items()},
                  **{k: config["train"][k] for k in changed}}
        history = saved.data.get("extended") if isinstance(saved.data.get("extended"), list) else []
        self.extended = {**config, "extended": [*history, record]}

    def _restore(self, ckpt: Path) -> None:
        """Weights, AdamW moments, step, RNG state and metrics history from a checkpoint folder;
        every file is checked (types, steps, digests) before anything is used."""
        loaded = load_checkpoint(ckpt / MODEL_FILE)
        if loaded.config != self.mc:
            raise ValueError(f"{ckpt}: the checkpoint's model config differs from the run's")
        if not isinstance(loaded.meta, dict):
            raise ValueError(f"{ckpt / MODEL_FILE}: its metadata is not an object")
        if "train" in loaded.meta:  # what the checkpoint was trained with (covered by its digest)
            try:
                recorded = train_config_from_dict(loaded.meta["train"]).to_dict()
            except (ValueError, TypeError) as error:
                raise ValueError(f"{ckpt / MODEL_FILE}: damaged train settings in its metadata ({error})") \
                    from None
            now = self.tc.to_dict()
            edited = [k for k in now if k not in EXTENSIBLE and recorded[k] != now[k]]
            if edited:
                k = edited[0]
                raise ValueError(
                    f"{ckpt}: was trained with {k}={recorded[k]!r} but the run now says {k}={now[k]!r} "
                    f"(config.json edited?); only {' and '.join(EXTENSIBLE)} may change when resuming"
                )
        state = read_train_state(ckpt, loaded.meta, self.procs.world_size)
        self.model.load_state_dict(loaded.model.state_dict())
        load_optimizer_state(
            ckpt / OPTIMIZER_FILE, self.model, self.optimizer, loaded.meta.get(OPTIMIZER_DIGEST)
        )
        self.step, self.stopped = state["step"], state["stopped"]
        self.seconds_before, self.train_seconds, self.tokens = (
            state["seconds"],
            state["train_seconds"],
            state["tokens"],
        )
        self.loss, self.eval = state["loss"], state["eval"]
        # done is decided by this session's settings: an extension (more steps, another target) trains on
        target = self.tc.target_accuracy
        reached = self.stopped == "target" and target is not None and self.eval.get("accuracy", 0.0) >= target
        self.done = reached or self.step >= self.tc.steps
        self.stopped = "target" if reached else "steps"
        torch.set_rng_state(decode_rng(state["rng"][self.procs.rank]))
        self._restore_device_state(ckpt, state)
        self.checkpoint, self.resumed_step = ckpt, self.step
        if self.folder is not None:
            truncate_metrics(self.folder / METRICS, self.step)  # drop what the killed run logged later
            self.history = read_metrics(self.folder)

    def _restore_device_state(self, ckpt: Path, state: dict[str, Any]) -> None:
        """This process's device generator (a run resumed on the device type it was saved on) and
        float16's gradient scale, from state.json; ValueError naming the file when damaged."""
        path, rank = ckpt / STATE_FILE, self.procs.rank
        saved = state.get("device_rng")
        if saved is not None:
            if not (isinstance(saved, list) and len(saved) == self.procs.world_size):
                raise ValueError(f"{path}: device_rng is not a list of {self.procs.world_size} entries")
            mine = saved[rank]
            if not (mine is None or isinstance(mine, dict) and isinstance(mine.get("device"), str)
                    and isinstance(mine.get("state"), str)):
                raise ValueError(f"{path}: device_rng[{rank}] is not null or {{device, state}}")
            current = device_rng_state(self.device)
            if mine is not None and current is not None and mine["device"].split(":")[0] == self.device.type:
                try:
                    set_device_rng_state(self.device, decode_rng(mine["state"], current.numel()))
                except ValueError as error:
                    raise ValueError(f"{path}: device_rng[{rank}] is not a saved RNG state ({error})") \
                        from None
        scaler = state.get("grad_scaler")
        if scaler is not None and self.scaler.is_enabled():
            if not (isinstance(scaler, dict) and all(isinstance(v, (int, float)) for v in scaler.values())):
                raise ValueError(f"{path}: grad_scaler is not an object of numbers")
            self.scaler.load_state_dict(scaler)

    # -- the loop -------------------------------------------------------------------------------

    def loop(self, show_progress: bool, report: bool) -> TrainResult:
        """Train until ``steps`` or the target accuracy; checkpoint, log, report."""
        c = self.tc
        tokens_per_step = c.batch_size * self.train_data.inputs.shape[1]
        self.session_start = time.perf_counter()
        try:
            # one process only: under DDP every rank would have to stop at the same step
            with deferred_interrupt(self.procs.world_size == 1) as interrupted, \
                    progress_context(show_progress) as bar:
                bar_task = (
                    bar.add_task("train", total=c.steps, completed=self.step, status="") if bar else None
                )
                window_tokens, window_seconds = 0, 0.0
                while not self.done and self.step < c.steps:
                    start = time.perf_counter()
                    try:
                        with watch_step(self.model, self.detect_nonfinite, self._stop_nonfinite):
                            row = self._step(self.step + 1)
                        spent = time.perf_counter() - start
                        window_seconds += spent
                        window_tokens += tokens_per_step
                        self.train_seconds += spent
                        self.tokens += tokens_per_step
                        if row is not None and self.step % c.log_every == 0:
                            row["tokens_per_s"] = window_tokens / max(window_seconds, 1e-9)
                            window_tokens, window_seconds = 0, 0.0
                        self._after_step(row)
                    except KeyboardInterrupt as error:  # a second Ctrl-C: mid-step, nothing consistent
                        raise self._interrupted(save=False) from error
                    if bar is not None:
                        bar.update(bar_task, completed=self.step, status=self._status())
                    if interrupted[0] and not self.done:
                        raise self._interrupted(save=True)
        except TrainingDiverged:
            self._write_report(report)
            raise
        seconds = self.elapsed()
        self._write_report(report)
        return TrainResult(
            model=self.model,
            step=self.step,
            loss=self.loss,
            eval=dict(self.eval),
            stopped=self.stopped,
            seconds=seconds,
            tokens_per_s=tokens_per_second(self.tokens, self.train_seconds),
            history=self.history,
            out_dir=Path(self.folder) if self.folder else None,
            checkpoint=self.checkpoint,
            resumed_step=self.resumed_step,
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
        if procs.world_size == 1:
            self.loss = loss.item()
        else:  # the global batch's mean; each process's loss weighted so DDP's average is that mean
            n_global = int((self.train_data.targets[batch] != IGNORE_INDEX).sum())
            self.loss = procs.sum(loss.item() * n_local) / max(n_global, 1)
            if n_local * procs.world_size != n_global:
                loss = loss * (n_local * procs.world_size / max(n_global, 1))
        row: dict[str, Any] = {"step": step, "loss": self.loss, "lr": lr}
        if not math.isfinite(self.loss):
            raise self._diverged(row, f"the training loss is {self.loss}")
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()  # float16: the loss scaled up, so small gradients survive
        self.scaler.unscale_(self.optimizer)  # .grad is now dL/dparameter, for callbacks and clipping
        extra: dict[str, Any] = layer_grad_norms(self.model) if logged else {}
        if procs.main and self.callbacks:
            ctx = StepContext(step, self.model, x, y, self.loss, lr, c, self.task, logged, mask)
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
        self.step = step
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
        c, step = self.tc, self.step
        if step % c.eval_every == 0 or step == c.steps:
            with self.compute.autocast():
                self.eval = evaluate(self.model, self.test_data, c.eval_batch_size, self.task.metric,
                                     self.task.char_level)
            assert row is not None
            row.update({f"eval_{key}": value for key, value in self.eval.items()})
            if c.target_accuracy is not None and self.eval["accuracy"] >= c.target_accuracy:
                self.stopped = "target"
        self.done = self.stopped == "target" or step == c.steps
        if row is not None:
            row["time"] = self.elapsed()
            self._log(row)
        if self.done or (c.checkpoint_every and step % c.checkpoint_every == 0):
            self._save()

    def elapsed(self) -> float:
        """Wall seconds of the run so far, over every session of a resumed run."""
        return self.seconds_before + time.perf_counter() - self.session_start

    def _log(self, row: dict[str, Any]) -> None:
        self.history.append(row)
        if self.metrics_file is not None:
            self.metrics_file.write(json_line(row))  # strict JSON: NaN/Infinity become null
            self.metrics_file.flush()  # a SIGKILL loses nothing written before a checkpoint

    def _save(self) -> None:
        """Write checkpoints/step-N (rank 0) with every process's RNG states (CPU and device)."""
        rng = self.procs.gather(encode_rng(torch.get_rng_state()))
        on_device = device_rng_state(self.device)
        device_rng = self.procs.gather(
            None if on_device is None else {"device": str(self.device), "state": encode_rng(on_device)})
        if self.folder is None:
            return
        state = {
            "step": self.step,
            "done": self.done,
            "stopped": self.stopped,
            "seconds": self.elapsed(),
            "train_seconds": self.train_seconds,
            "tokens": self.tokens,
            "loss": self.loss,
            "eval": self.eval,
            "rng": rng,
            "device_rng": device_rng if any(r is not None for r in device_rng) else None,
            "grad_scaler": self.scaler.state_dict() or None,  # float16's scale and its growth counter
            "world_size": self.procs.world_size,
            "data_order": {
                "scheme": "epoch permutations, train.batch_indices",
                "seed": self.tc.seed,
                "batch_size": self.tc.batch_size,
                "next_example": self.step * self.tc.batch_size,
            },
        }
        meta = {"task": self.task.to_dict(), "step": self.step, "eval": self.eval, "train": self.tc.to_dict()}

        def write(tmp: Path) -> None:
            data = state_bytes(state)
            atomic_write_bytes(tmp / STATE_FILE, data)
            meta[STATE_DIGEST] = hashlib.sha256(data).hexdigest()
            meta[OPTIMIZER_DIGEST] = save_optimizer_state(tmp / OPTIMIZER_FILE, self.model, self.optimizer)
            save_checkpoint(tmp / MODEL_FILE, self.model, tokenizer=self.task.tokenizer.to_dict(),
                            meta=json_safe(meta))

        self.checkpoint = publish_checkpoint(self.folder, self.step, write, self.tc.keep_checkpoints)

    def _interrupted(self, save: bool) -> TrainingInterrupted:
        """Ctrl-C: checkpoint the finished step (``save``) and say how to continue."""
        if save and self.folder is not None and self.step > 0 and (
                self.checkpoint is None or self.checkpoint.name != f"step-{self.step:06d}"):
            self._save()
        where = f"training interrupted at step {self.step} of {self.tc.steps}"
        if self.folder is None:
            return TrainingInterrupted(f"{where}; nothing saved (no out_dir)", self.step, None, None)
        if self.checkpoint is None:
            return TrainingInterrupted(f"{where}; no checkpoint was written yet, so a new run starts over",
                                       self.step, None, self.folder)
        kept = "saved" if save else "the last checkpoint is"
        # how to resume is the caller's to say (the CLI prints its command: cli/training.py)
        return TrainingInterrupted(f"{where}; {kept} {self.checkpoint}", self.step, self.checkpoint,
                                   self.folder)

    def _stop_nonfinite(self, error: NonFiniteError) -> TrainingDiverged:
        """--detect-nonfinite: checkpoint the last good weights (if finite), then stop naming the stage."""
        if self.folder is not None and check_parameters(self.model) is None:
            self._save()
        step = self.step if error.event.kind == "parameter" else self.step + 1  # weights: after the update
        return self._diverged({"step": step, "nonfinite": error.event.describe()}, str(error))

    def _diverged(self, row: dict[str, Any], what: str) -> TrainingDiverged:
        """Log the bad step and build the error; nothing is saved for this step."""
        self._log({**row, "time": self.elapsed()})
        last = (
            f"the last good checkpoint is {self.checkpoint}"
            if self.checkpoint
            else "no checkpoint was written"
        )
        return TrainingDiverged(
            f"training stopped at step {row['step']}: {what}; nothing was saved for this step, {last}"
        )

    def _status(self) -> str:
        acc = ""
        if self.eval:
            acc = f"  {METRIC_SHORT[self.task.metric]} {self.eval['accuracy']:.1%}"
            if self.task.metric == "token_accuracy":  # a language model: its perplexity too
                acc += f"  ppl {self.eval['perplexity']:.3g}"
        tps = tokens_per_second(self.tokens, self.train_seconds)
        return f"loss {self.loss:.4f}{acc}  {tps:,.0f} tok/s"

    def _write_report(self, report: bool) -> None:
        if report and self.folder is not None:
            from .report import write_report

            write_report(self.folder, model=self.model, task=self.task)


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
