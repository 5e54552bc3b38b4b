"""Time to target: ``blocklab.training.loop`` with its defaults against a plain PyTorch loop, on listops.

The plain loop is written the way a user would (issue 17): ``nn.Embedding`` with its default
N(0, 1) init plus the sinusoidal position code, ``nn.TransformerEncoder`` (post-norm, 2 layers,
d_model 64, 4 heads, d_ff 256, no dropout (blocklab's default model has none; ``--plain-dropout``
gives the layer's own 0.1), the layer's defaults otherwise), a linear head, AdamW lr 3e-3 with
50 linear warmup steps then constant, batch 128, gradient clipping at 1.0, evaluation on
blocklab's listops test split every 25 steps. ``blocklab.training.loop`` runs with its defaults (the
default model and TrainConfig, a run folder with metrics, checkpoints and per-layer gradient
norms; the HTML report, written after the run, is left out here and costed by ``--costs``).
Both stop at the first evaluation with held-out exact match >= TrainConfig's target.

Seeds run interleaved (the order alternating), so both see the same machine load, after one untimed run
of each (the process's first run pays one-time start-up); the ratio per seed is what to read on a shared
machine. Steps are deterministic; seconds are not.

    .venv/bin/python benchmarks/time_to_target.py                 # seeds 0-9
    .venv/bin/python benchmarks/time_to_target.py --seeds 0-2 --rounds 2
    .venv/bin/python benchmarks/time_to_target.py --costs         # what each trainer feature costs

``--costs`` times ``blocklab.training.loop`` for a fixed number of steps with one feature turned off (or on)
at a time (interleaved rounds, medians), and prints what each costs per step against the full run; the
diagnostics rows add what ``blocklab train`` does by default beyond the loop's defaults: diagnostics every
``eval_every`` steps and at step 1 (cli/training.py), then those with the HTML report (which draws two
more figures from them) and the progress bar.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import blocklab as bl
from blocklab.inspect.diagnostics import DiagnosticsLogger
from blocklab.tasks import get_task
from blocklab.training.loop import task_train_config, train

# the plain loop's settings (issue 17); the model is blocklab's default shape
PLAIN = dict(lr=3e-3, warmup=50, batch_size=128, grad_clip=1.0, eval_every=25)


class PlainModel(nn.Module):
    """nn.Embedding + sinusoidal positions + nn.TransformerEncoder + a linear head."""

    def __init__(self, vocab: int, max_len: int, d_model: int = 64, n_heads: int = 4, d_ff: int = 256,
                 n_layers: int = 2, dropout: float = 0.1) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        position = torch.arange(max_len)[:, None]
        angle = position / 10000 ** (torch.arange(0, d_model, 2) / d_model)
        pe = torch.zeros(max_len, d_model)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(angle), torch.cos(angle)
        self.register_buffer("pe", pe)
        layer = nn.TransformerEncoderLayer(d_model, n_heads, d_ff, dropout=dropout, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, n_layers)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, vocab)
        return self.head(self.encoder(self.embed(tokens) + self.pe[: tokens.shape[1]]))


def plain_run(seed: int, max_steps: int, target: float, dropout: float) -> dict[str, Any]:
    """The plain loop until the target (or max_steps): steps, seconds, accuracy."""
    start = time.perf_counter()
    task = get_task("listops", seed=seed)
    train_data, test = task.split("train"), task.split("test")
    torch.manual_seed(seed)
    model = PlainModel(len(task.tokenizer.vocab), task.seq_len, dropout=dropout)
    opt = torch.optim.AdamW(model.parameters(), lr=PLAIN["lr"])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / PLAIN["warmup"]))
    order, at, accuracy, step = torch.randperm(len(train_data)), 0, 0.0, 0
    for step in range(1, max_steps + 1):
        if at + PLAIN["batch_size"] > len(order):
            order, at = torch.randperm(len(train_data)), 0
        idx = order[at : at + PLAIN["batch_size"]]
        at += PLAIN["batch_size"]
        logits = model(train_data.inputs[idx])
        loss = F.cross_entropy(logits.flatten(0, 1), train_data.targets[idx].flatten(), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), PLAIN["grad_clip"])
        opt.step()
        sched.step()
        if step % PLAIN["eval_every"] == 0:
            model.eval()
            with torch.no_grad():
                predicted = model(test.inputs).argmax(-1)
            model.train()
            scored = test.targets != -100
            accuracy = float(((predicted == test.targets) | ~scored).all(dim=1).double().mean())
            if accuracy >= target:
                break
    return {"steps": step if accuracy >= target else None, "seconds": time.perf_counter() - start,
            "accuracy": accuracy}


def blocklab_run(seed: int, **train_kwargs: Any) -> dict[str, Any]:
    """``blocklab.training.loop`` with its defaults (a run folder in a temporary directory)."""
    start = time.perf_counter()
    task = get_task("listops", seed=seed)
    config = bl.preset("listops-seed", **task.config_overrides())
    tc = task_train_config("listops", seed=seed)
    with tempfile.TemporaryDirectory() as folder:
        result = train(config, tc, task, out_dir=folder, report=False, **train_kwargs)
        seconds = time.perf_counter() - start
    return {"steps": result.step if result.stopped == "target" else None, "seconds": seconds,
            "accuracy": result.accuracy, "max_steps": tc.steps}


def parse_seeds(text: str) -> list[int]:
    """``0-9`` or ``0,3,5``."""
    if "-" in text:
        low, high = text.split("-")
        return list(range(int(low), int(high) + 1))
    return [int(s) for s in text.split(",")]


def time_to_target(seeds: list[int], rounds: int, dropout: float) -> None:
    """Both runs on every seed, interleaved; per-seed steps, seconds and the time ratio."""
    tc = task_train_config("listops")
    rows = []
    print(f"listops, target held-out exact match >= {tc.target_accuracy}; {torch.get_num_threads()} torch "
          f"threads in this process, blocklab threads={tc.threads} (0 = auto); plain-loop dropout {dropout}; "
          f"load average {os.getloadavg()[0]:.2f} at start")
    print(f"{'seed':>4}  {'blocklab steps':>14}  {'plain steps':>11}  {'blocklab s':>10}  {'plain s':>8}  "
          f"{'time ratio':>10}")
    # one untimed run of each first: the process's first training run pays one-time start-up (lazy imports,
    # kernels' first calls) that would otherwise land on whichever run comes first
    blocklab_run(seeds[0])
    plain_run(seeds[0], tc.steps, tc.target_accuracy, dropout)
    for seed in seeds:
        times: dict[str, list[float]] = {"blocklab": [], "plain": []}
        steps: dict[str, int | None] = {}
        for r in range(rounds):
            order = ["blocklab", "plain"] if (seed + r) % 2 == 0 else ["plain", "blocklab"]
            for name in order:
                out = blocklab_run(seed) if name == "blocklab" else plain_run(seed, tc.steps,
                                                                               tc.target_accuracy, dropout)
                times[name].append(out["seconds"])
                steps[name] = out["steps"]
        b, p = statistics.median(times["blocklab"]), statistics.median(times["plain"])
        rows.append((seed, steps["blocklab"], steps["plain"], b, p))
        show = lambda s: "-" if s is None else str(s)
        print(f"{seed:>4}  {show(steps['blocklab']):>14}  {show(steps['plain']):>11}  {b:>10.2f}  {p:>8.2f}  "
              f"{b / p:>9.2f}x", flush=True)
    reached = lambda i: [r[i] if r[i] is not None else tc.steps for r in rows]
    ratios = [r[3] / r[4] for r in rows]
    print(f"median steps: blocklab {statistics.median(reached(1)):.0f}, "
          f"plain {statistics.median(reached(2)):.0f}; "
          f"median seconds: blocklab {statistics.median(r[3] for r in rows):.2f}, "
          f"plain {statistics.median(r[4] for r in rows):.2f}")
    print(f"blocklab time / plain time: median over seeds {statistics.median(ratios):.2f}x "
          f"(min {min(ratios):.2f}x, max {max(ratios):.2f}x); load average {os.getloadavg()[0]:.2f} at end")


def costs(steps: int, rounds: int) -> None:
    """What each thing the trainer does beyond the plain loop costs, at a fixed number of steps."""
    task = get_task("listops")
    config = bl.preset("listops-seed", **task.config_overrides())
    base = task_train_config("listops", steps=steps, target_accuracy=None)

    def run(changes: dict[str, Any], folder: bool = True, report: bool = False, progress: bool = False,
            diagnostics: bool = False) -> Callable[[], None]:
        def go() -> None:
            c = base.replace(**changes)
            # `blocklab train` logs diagnostics every eval_every steps by default (cli/training.py)
            callbacks = [DiagnosticsLogger(c.eval_every)] if diagnostics else []
            with tempfile.TemporaryDirectory() as out, contextlib.redirect_stdout(io.StringIO()):
                train(config, c, task, out_dir=out if folder else None, callbacks=callbacks, report=report,
                      progress=progress)
        return go

    never = steps + 1  # an interval longer than the run: the feature runs once at the end at most
    variants: dict[str, Callable[[], None]] = {
        "full (defaults, run folder)": run({}),
        "+ progress bar": run({}, progress=True),
        "+ HTML report at the end": run({}, report=True),
        "+ diagnostics every eval_every": run({}, diagnostics=True),
        "blocklab train (diagnostics, report, bar)": run({}, report=True, progress=True, diagnostics=True),
        "- evaluation (only at the end)": run({"eval_every": never}),
        "- metrics lines and per-layer grad norms": run({"log_every": never}),
        "- checkpoints (only the final one)": run({"checkpoint_every": 0}),
        "- run folder (no files at all)": run({}, folder=False),
        "bare (none of the above)": run({"eval_every": never, "log_every": never, "checkpoint_every": 0},
                                        folder=False),
    }
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            start = time.perf_counter()
            variants[name]()
            seconds[name].append(time.perf_counter() - start)
    full = statistics.median(seconds[names[0]])
    print(f"blocklab.training.loop, default model on listops, {steps} steps per run, median of {rounds} "
          f"interleaved rounds, threads={base.threads} (0 = auto); load average {os.getloadavg()[0]:.2f}")
    print(f"{'variant':44s} {'seconds':>8} {'ms/step':>8} {'vs full, ms/step':>17}")
    for name in names:
        t = statistics.median(seconds[name])
        print(f"{name:44s} {t:8.3f} {1e3 * t / steps:8.2f} {1e3 * (t - full) / steps:+17.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0-9")
    parser.add_argument("--rounds", type=int, default=1, help="runs per seed and side (median)")
    parser.add_argument("--plain-dropout", type=float, default=0.0,
                        help="the plain loop's nn.TransformerEncoderLayer dropout (default 0, as blocklab's "
                             "model; the layer's own default is 0.1)")
    parser.add_argument("--costs", action="store_true", help="cost of each trainer feature instead")
    parser.add_argument("--steps", type=int, default=100, help="--costs: steps per run")
    args = parser.parse_args()
    if args.costs:
        costs(args.steps, max(args.rounds, 5))
    else:
        time_to_target(parse_seeds(args.seeds), args.rounds, args.plain_dropout)


if __name__ == "__main__":
    main()
