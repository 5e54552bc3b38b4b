"""Steps to target: how many optimizer steps ``blocklab.training.loop`` needs to reach the held-out target
(exact match >= TrainConfig.target_accuracy, evaluated every ``eval_every`` steps) on listops, for
several input-embedding designs and two models, over seeds. Steps are deterministic (same seed,
same steps, whatever the load), so this can run on a busy machine; the seconds cannot.

    .venv/bin/python benchmarks/steps_to_target.py                       # every design, both models
    .venv/bin/python benchmarks/steps_to_target.py --models post2 --designs vaswani+sin --seeds 0-9
    .venv/bin/python benchmarks/steps_to_target.py --train lr=3e-3,warmup=50 --jsonl runs.jsonl
    .venv/bin/python benchmarks/steps_to_target.py --models post2 --designs vaswani+sin --config init=default
    .venv/bin/python benchmarks/steps_to_target.py --models post2 --designs vaswani+sin --plain --seeds 0-9

A design is a set of ModelConfig embedding fields (blocklab/nn/embedding.py); a model is the default
``blocklab train`` model (post-norm, 2 layers) or pre-norm with 6 layers. ``--train`` overrides
TrainConfig fields for every run, ``--config`` ModelConfig fields (``init=default``: the linears' init
blocklab used before issue 30). Each run uses the task split of its seed, as ``blocklab train
--seed S`` does. ``--plain`` also runs, on the same seeds and splits, the plain PyTorch loop of
``benchmarks/time_to_target.py`` (``nn.Embedding``, sinusoidal positions, ``nn.TransformerEncoder``
post-norm with 2 layers and no dropout, AdamW 3e-3 with 50 warmup steps, batch 128, clip 1.0, evaluated
every 25 steps): the row blocklab's default run is read against. ``--train``'s ``steps`` and
``target_accuracy`` bound it too; its other settings are its own. A run that never reaches the target
counts as "-" (its steps are TrainConfig.steps).
With ``--jsonl FILE`` every finished run is appended to FILE at once and runs already there are not
run again (an interrupted sweep continues where it stopped); the table covers the runs asked for.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import torch

# Embedding designs: the ModelConfig fields each sets (the rest are the config's defaults).
DESIGNS: dict[str, dict[str, Any]] = {
    # blocklab before issue 13: GPT-2's token init with Vaswani's sinusoid of amplitude 1
    "gpt-init+sin": dict(pos_encoding="sinusoidal", embed_scale="none", embed_std=0.02),
    # nn.Embedding's own N(0, 1), no factor (what a plain PyTorch model gets)
    "unit+sin": dict(pos_encoding="sinusoidal", embed_scale="none", embed_std=1.0),
    # Vaswani et al. 2017 (tensor2tensor): E ~ N(0, 1/d) times sqrt(d)
    "vaswani+sin": dict(pos_encoding="sinusoidal", embed_scale="sqrt_d_model", embed_std=1.0),
    # GPT-2 as transformers initialises it: every table N(0, 0.02^2), learned positions
    "gpt-init+learned": dict(pos_encoding="learned", embed_scale="none", embed_std=0.02),
    # GPT-2's released code: wte N(0, 0.02^2), wpe N(0, 0.01^2)
    "gpt2-code+learned": dict(pos_encoding="learned", embed_scale="none", embed_std=0.02, pos_std=0.01),
    # unit token part, learned positions of the same size
    "unit+learned": dict(pos_encoding="learned", embed_scale="none", embed_std=1.0),
    # Vaswani's token part with learned positions of the same size (pos_std unset = embed_std)
    "vaswani+learned": dict(pos_encoding="learned", embed_scale="sqrt_d_model", embed_std=1.0),
    # Vaswani's token part with GPT-2's small learned positions
    "vaswani+learned-small": dict(pos_encoding="learned", embed_scale="sqrt_d_model", embed_std=1.0,
                                  pos_std=0.02),
}
MODELS: dict[str, dict[str, Any]] = {
    "post2": dict(norm_position="post", n_layers=2),
    "pre6": dict(norm_position="pre", n_layers=6),
}
# The plain PyTorch loop's rows (--plain): its own model and embedding, no dropout
PLAIN, PLAIN_DESIGN = "plain", "nn.TransformerEncoder"
PLAIN_TRAIN = ("steps", "target_accuracy")  # the --train fields that bound the plain loop too


def parse_seeds(text: str) -> list[int]:
    """``0-9`` or ``0,3,5``."""
    if "-" in text:
        low, high = text.split("-")
        return list(range(int(low), int(high) + 1))
    return [int(s) for s in text.split(",")]


def parse_overrides(text: str) -> dict[str, Any]:
    """``lr=3e-3,warmup=50,init=default`` -> {"lr": 0.003, "warmup": 50, "init": "default"}."""
    out: dict[str, Any] = {}
    for item in filter(None, text.split(",")):
        key, value = item.split("=")
        try:
            out[key] = json.loads(value) if value not in ("None", "none") else None
        except ValueError:
            out[key] = value  # a name
    return out


def run_one(model: str, design: str, seed: int, train: dict[str, Any],
            config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train one run (one thread, no folder); steps to target, final accuracy, seconds."""
    torch.set_num_threads(1)
    import blocklab as bl
    from blocklab.tasks import get_task
    from blocklab.training.loop import task_train_config
    from blocklab.training.loop import train as train_run

    overrides = config or {}
    if model == PLAIN:
        from time_to_target import plain_run  # this folder's script: the loop issue 17 wrote

        tc = task_train_config("listops", seed=seed, **train)
        out = plain_run(seed, tc.steps, tc.target_accuracy, dropout=0.0)
        return {"model": model, "design": design, "seed": seed, "train": train, "config": overrides,
                "steps": out["steps"], "max_steps": tc.steps, "accuracy": out["accuracy"],
                "seconds": out["seconds"]}
    task = get_task("listops", seed=seed)
    model_config = bl.preset("listops-seed", **{**task.config_overrides(), **MODELS[model], **DESIGNS[design],
                                                **overrides})
    tc = task_train_config("listops", seed=seed, threads=1, checkpoint_every=0, **train)
    result = train_run(model_config, tc, task, report=False)
    return {
        "model": model, "design": design, "seed": seed, "train": train, "config": overrides,
        "steps": result.step if result.stopped == "target" else None, "max_steps": tc.steps,
        "accuracy": result.accuracy, "seconds": result.seconds,
    }


def summarize(rows: list[dict[str, Any]]) -> str:
    """One line per (model, design): steps per seed, median, max, how many reached the target."""
    lines = []
    order = [*DESIGNS, PLAIN_DESIGN]
    keys = sorted({(r["model"], r["design"]) for r in rows},
                  key=lambda k: (k[0] == PLAIN, k[0], order.index(k[1])))
    for model, design in keys:
        mine = sorted((r for r in rows if (r["model"], r["design"]) == (model, design)),
                      key=lambda r: r["seed"])
        steps = [r["steps"] if r["steps"] is not None else r["max_steps"] for r in mine]
        shown = " ".join(f"{r['steps']:>4}" if r["steps"] is not None else "   -" for r in mine)
        reached = sum(r["steps"] is not None for r in mine)
        median = statistics.median(steps)
        lines.append(f"{model:6s} {design:22s} reached {reached:2d}/{len(mine):<2d} median {median:6.0f} "
                     f"max {max(steps):5d}  min acc {min(r['accuracy'] for r in mine):.4f}  steps: {shown}")
    return "\n".join(lines)


def _key(model: str, design: str, seed: int, train: dict[str, Any], config: dict[str, Any] | None) -> str:
    """A run's identity; ``config`` None: a row recorded before --config existed (init N(0, 0.02) then)."""
    return json.dumps([model, design, seed, train, config], sort_keys=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"from: {', '.join(MODELS)}")
    parser.add_argument("--designs", default=",".join(DESIGNS), help=f"from: {', '.join(DESIGNS)}")
    parser.add_argument("--seeds", default="0-9")
    parser.add_argument("--train", default="", help="TrainConfig overrides, e.g. lr=3e-3,warmup=50")
    parser.add_argument("--config", default="", help="ModelConfig overrides, e.g. init=default")
    parser.add_argument("--plain", action="store_true",
                        help="also the plain nn.TransformerEncoder loop (no dropout) on the same seeds")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (one thread each)")
    parser.add_argument("--jsonl", default=None, help="append each finished run; skip runs already in it")
    args = parser.parse_args()
    models, designs = args.models.split(","), args.designs.split(",")
    for name, known in [(d, DESIGNS) for d in designs] + [(m, MODELS) for m in models]:
        if name not in known:
            kind = "design" if known is DESIGNS else "model"
            sys.exit(f"unknown {kind} {name!r}; known: {', '.join(known)}")
    train, config = parse_overrides(args.train), parse_overrides(args.config)
    jobs = [(m, d, s, train, config) for m in models for d in designs for s in parse_seeds(args.seeds)]
    if args.plain:
        bounds = {k: v for k, v in train.items() if k in PLAIN_TRAIN}
        jobs += [(PLAIN, PLAIN_DESIGN, s, bounds, {}) for s in parse_seeds(args.seeds)]
    done: dict[str, dict[str, Any]] = {}
    path = Path(args.jsonl) if args.jsonl else None
    if path is not None and path.exists():
        for line in path.read_text().splitlines():
            row = json.loads(line)
            done[_key(row["model"], row["design"], row["seed"], row["train"], row.get("config"))] = row
    todo = [job for job in jobs if _key(*job) not in done]
    with ProcessPoolExecutor(max(1, args.jobs), mp_context=get_context("spawn")) as pool:
        for future in as_completed([pool.submit(run_one, *job) for job in todo]):
            row = future.result()
            done[_key(row["model"], row["design"], row["seed"], row["train"], row.get("config"))] = row
            if path is not None:
                with path.open("a") as f:
                    f.write(json.dumps(row) + "\n")
    rows = [done[_key(*job)] for job in jobs]
    print(f"listops, steps to held-out exact match >= target (evaluated every eval_every steps); "
          f"train overrides: {train or 'none'}; config overrides: {config or 'none'}")
    print(summarize(rows))


if __name__ == "__main__":
    main()
