"""A training run's life around its step loop (``loop._Run``): the run folder (claimed and locked,
config.json), ``--resume`` and its extensions, restoring a checkpoint and saving one, the metrics log
and the report. What a checkpoint carries from one session to the next is ``Progress``; the loop
advances it and this module writes and reads it back.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..device import Compute, device_rng_state
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
from ..nn.config import ModelConfig
from ..nn.model import Transformer
from ..tasks import Task
from .checkpoint import load_checkpoint, save_checkpoint
from .distributed import Processes
from .resume import check_recorded_train, check_same_run, extension
from .runfiles import (
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
    restore_device_state,
    save_optimizer_state,
    state_bytes,
)
from .train_config import TrainConfig, train_config_from_dict


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped training. The message says where it stopped, the checkpoint to resume from
    (``checkpoint``: the one saved at the interrupted ``step`` when the step could finish) and how."""

    def __init__(self, message: str, step: int, checkpoint: Path | None, out_dir: Path | None) -> None:
        super().__init__(message)
        self.step, self.checkpoint, self.out_dir = step, checkpoint, out_dir


@dataclass
class Progress:
    """How far a run is: what a checkpoint saves and ``--resume`` restores, and what the loop advances."""

    step: int = 0
    loss: float = math.nan
    eval: dict[str, Any] = field(default_factory=dict)
    stopped: str = "steps"  # state.STOPPED: why the run ended (all its steps, or the target)
    done: bool = False
    seconds_before: float = 0.0  # wall seconds of earlier sessions of a resumed run
    train_seconds: float = 0.0  # seconds inside training steps, every session
    tokens: int = 0
    session_start: float = field(default_factory=time.perf_counter)
    history: list[dict[str, Any]] = field(default_factory=list)  # metrics rows, every session
    checkpoint: Path | None = None  # the newest checkpoint written or resumed from
    resumed_step: int | None = None

    def saved(self, seconds: float) -> dict[str, Any]:
        """What state.json keeps of it (``seconds``: the run's wall time so far, every session)."""
        return {"step": self.step, "done": self.done, "stopped": self.stopped, "seconds": seconds,
                "train_seconds": self.train_seconds, "tokens": self.tokens, "loss": self.loss,
                "eval": self.eval}

    def restore(self, state: dict[str, Any], tc: TrainConfig) -> None:
        """Continue from a checkpoint's state.json (``state.read_train_state``'s checked dict)."""
        self.step, self.stopped = state["step"], state["stopped"]
        self.seconds_before, self.train_seconds = state["seconds"], state["train_seconds"]
        self.tokens = state["tokens"]
        self.loss, self.eval = state["loss"], state["eval"]
        # done is decided by this session's settings: an extension (more steps, another target) trains on
        reached = (self.stopped == "target" and tc.target_accuracy is not None
                   and self.eval.get("accuracy", 0.0) >= tc.target_accuracy)
        self.done = reached or self.step >= tc.steps
        self.stopped = "target" if reached else "steps"


class Session:
    """The run folder and checkpoints of one training session (rank 0 writes; every rank restores its own
    RNG state): what a run is (its configs, task, processes and device) and the life of its folder. The
    step loop (loop._Run) reads the run from here; it hands over the model it trains in ``open``."""

    def __init__(
        self,
        mc: ModelConfig,
        tc: TrainConfig,
        task: Task,
        out_dir: str | Path | None,
        procs: Processes,
        compute: Compute,
    ) -> None:
        self.mc, self.tc, self.task, self.procs = mc, tc, task, procs
        self.compute, self.device = compute, compute.device
        self.folder = Path(out_dir) if out_dir is not None and procs.main else None
        self.lock: RunLock | None = None
        self.metrics_file: Any = None
        self.extended: dict[str, Any] | None = None  # config.json recording an extension, to be written
        self.progress = Progress()

    def open(self, model: Transformer, optimizer: torch.optim.Optimizer, scaler: Any, resume: bool,
             overwrite: bool) -> None:
        """Take the model trained, its optimizer and gradient scaler (what a checkpoint saves and restores);
        claim the folder (rank 0), restore the newest checkpoint if resuming (every rank), open the
        metrics log."""
        self.model, self.optimizer, self.scaler = model, optimizer, scaler
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
        if self.folder is not None:
            fd = open_regular(self.folder / METRICS, os.O_WRONLY | os.O_APPEND | os.O_CREAT)  # no link/pipe
            self.metrics_file = os.fdopen(fd, "a")  # closed in close()

    def close(self) -> None:
        """Close the metrics log and release the folder's lock."""
        if self.metrics_file is not None:
            self.metrics_file.close()
        if self.lock is not None:
            self.lock.release()

    def _claim_folder(self, resume: bool, overwrite: bool) -> str | None:
        """Claim and lock the folder (files.folders.claim_folder), check or write config.json; the
        checkpoint to resume from, if any."""
        folder = self.folder
        assert folder is not None
        if resume and inspect_folder(folder, "run") is None:  # before the claim makes the folder
            raise ValueError(
                f"--resume: {folder} holds no blocklab run (no {MARKER}); check the path, or "
                "drop --resume to start a new run there"
            )
        self.lock, _ = claim_folder(folder, "run")
        check_run_names(folder)  # no link or pipe among the names a run writes, checkpoints included
        config = run_config(self.mc, self.tc, self.task, self.procs.world_size)
        held = run_files(folder)
        if resume and (folder / CONFIG).exists():
            saved = read_run_config(folder)
            check_same_run(folder, saved, config)
            latest = latest_checkpoint(folder)
            if latest is not None:
                self.extended = extension(folder, saved, config, checkpoint_step(latest))
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
                raise ValueError(
                    f"{ckpt / MODEL_FILE}: damaged train settings in its metadata ({error})"
                ) from None
            check_recorded_train(ckpt, recorded, self.tc.to_dict())
        state = read_train_state(ckpt, loaded.meta, self.procs.world_size)
        self.model.load_state_dict(loaded.model.state_dict())
        load_optimizer_state(
            ckpt / OPTIMIZER_FILE, self.model, self.optimizer, loaded.meta.get(OPTIMIZER_DIGEST)
        )
        self.progress.restore(state, self.tc)
        torch.set_rng_state(decode_rng(state["rng"][self.procs.rank]))
        restore_device_state(
            ckpt / STATE_FILE, state, self.procs.rank, self.procs.world_size, self.device, self.scaler
        )
        self.progress.checkpoint, self.progress.resumed_step = ckpt, self.progress.step
        if self.folder is not None:
            truncate_metrics(
                self.folder / METRICS, self.progress.step
            )  # drop what the killed run logged later
            self.progress.history = read_metrics(self.folder)

    def elapsed(self) -> float:
        """Wall seconds of the run so far, over every session of a resumed run."""
        return self.progress.seconds_before + time.perf_counter() - self.progress.session_start

    def log(self, row: dict[str, Any]) -> None:
        """Append a metrics row to the history and to metrics.jsonl."""
        self.progress.history.append(row)
        if self.metrics_file is not None:
            self.metrics_file.write(json_line(row))  # strict JSON: NaN/Infinity become null
            self.metrics_file.flush()  # a SIGKILL loses nothing written before a checkpoint

    def save(self) -> None:
        """Write checkpoints/step-N (rank 0) with every process's RNG states (CPU and device)."""
        rng = self.procs.gather(encode_rng(torch.get_rng_state()))
        on_device = device_rng_state(self.device)
        device_rng = self.procs.gather(
            None if on_device is None else {"device": str(self.device), "state": encode_rng(on_device)}
        )
        if self.folder is None:
            return
        state = {
            **self.progress.saved(self.elapsed()),
            "rng": rng,
            "device_rng": device_rng if any(r is not None for r in device_rng) else None,
            "grad_scaler": self.scaler.state_dict() or None,  # float16's scale and its growth counter
            "world_size": self.procs.world_size,
            "data_order": {
                "scheme": "epoch permutations, train.batch_indices",
                "seed": self.tc.seed,
                "batch_size": self.tc.batch_size,
                "next_example": self.progress.step * self.tc.batch_size,
            },
        }
        meta = {
            "task": self.task.to_dict(),
            "step": self.progress.step,
            "eval": self.progress.eval,
            "train": self.tc.to_dict(),
        }

        def write(tmp: Path) -> None:
            data = state_bytes(state)
            atomic_write_bytes(tmp / STATE_FILE, data)
            meta[STATE_DIGEST] = hashlib.sha256(data).hexdigest()
            meta[OPTIMIZER_DIGEST] = save_optimizer_state(tmp / OPTIMIZER_FILE, self.model, self.optimizer)
            save_checkpoint(
                tmp / MODEL_FILE, self.model, tokenizer=self.task.tokenizer.to_dict(), meta=json_safe(meta)
            )

        self.progress.checkpoint = publish_checkpoint(
            self.folder, self.progress.step, write, self.tc.keep_checkpoints
        )

    def interrupted(self, save: bool) -> TrainingInterrupted:
        """Ctrl-C: checkpoint the finished step (``save``) and say how to continue."""
        if (
            save
            and self.folder is not None
            and self.progress.step > 0
            and (
                self.progress.checkpoint is None
                or self.progress.checkpoint.name != f"step-{self.progress.step:06d}"
            )
        ):
            self.save()
        where = f"training interrupted at step {self.progress.step} of {self.tc.steps}"
        if self.folder is None:
            return TrainingInterrupted(f"{where}; nothing saved (no out_dir)", self.progress.step, None, None)
        if self.progress.checkpoint is None:
            return TrainingInterrupted(
                f"{where}; no checkpoint was written yet, so a new run starts over",
                self.progress.step,
                None,
                self.folder,
            )
        kept = "saved" if save else "the last checkpoint is"
        # how to resume is the caller's to say (the CLI prints its command: cli/training.py)
        return TrainingInterrupted(
            f"{where}; {kept} {self.progress.checkpoint}",
            self.progress.step,
            self.progress.checkpoint,
            self.folder,
        )

    def write_report(self, report: bool) -> None:
        """The run's report.html (with ``report`` and a folder)."""
        if report and self.folder is not None:
            from .report import write_report

            write_report(self.folder, model=self.model, task=self.task)
