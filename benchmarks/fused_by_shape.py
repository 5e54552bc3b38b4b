"""Where the lean (fused) block pays: a training step on the lean path and the module path, by width.

The lean path keeps fewer activations (kernels.py's ledger) at the price of Python-level autograd
Functions and a recompute; at small widths that overhead is most of a step. This script times a
forward + backward of a 2-layer stack (embedding, blocks, head, loss; no optimizer) with
``fused=True`` and ``fused=False`` in interleaved rounds, for each d_model, and prints the median
within-round ratio (module time / lean time: above 1, the lean path is faster) beside the
activation bytes each path keeps per token. ``ModelConfig.fused="auto"`` takes the lean path from
``config.LEAN_MIN_D_MODEL`` up, the smallest width from which the lean step costs at most
``config.LEAN_MAX_TIME_COST`` more time in every shape and norm position: this script prints the width
the rule gives on this machine beside the configured one.

    .venv/bin/python benchmarks/fused_by_shape.py [--rounds 15] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch

from blocklab import ModelConfig, Transformer
from blocklab.bench.footprint import saved_activations
from blocklab.bench.stats import median_ratio, time_rounds
from blocklab.nn.config import LEAN_MAX_TIME_COST, LEAN_MIN_D_MODEL

WIDTHS = (32, 64, 96, 128, 192, 256, 384, 512)
# (batch, seq): listops' training batch, and a longer sequence at the same number of tokens
SHAPES = ((128, 8), (8, 128))


def step_fn(model: Transformer, tokens: torch.Tensor):
    def step() -> None:
        _, loss = model(tokens, targets=tokens)
        loss.backward()
        model.zero_grad(set_to_none=True)

    return step


def measure(d: int, position: str, batch: int, seq: int, rounds: int) -> dict:
    """Both paths at one width and shape: times, ratio, saved bytes per token."""
    config = ModelConfig(
        vocab_size=64,
        max_seq_len=seq,
        d_model=d,
        n_heads=max(1, d // 16),
        n_layers=2,
        d_ff=4 * d,
        norm_position=position,
        activation="gelu",
    )
    torch.manual_seed(0)
    lean = Transformer(config.replace(fused=True))
    module = Transformer(config.replace(fused=False))
    module.load_state_dict(lean.state_dict())
    tokens = torch.randint(0, 64, (batch, seq))
    saved = {}
    for name, model in (("lean", lean), ("module", module)):
        stats, _ = saved_activations(model, lambda t, m=model: m(t, targets=t)[1], tokens)
        saved[name] = stats.nbytes / (batch * seq)
    times = time_rounds(
        {"lean": step_fn(lean, tokens), "module": step_fn(module, tokens)}, rounds, min_seconds=0.2
    )
    return {
        "d_model": d,
        "norm_position": position,
        "batch": batch,
        "seq": seq,
        "lean_ms": 1e3 * statistics.median(times["lean"]),
        "module_ms": 1e3 * statistics.median(times["module"]),
        "module_over_lean": median_ratio(times["module"], times["lean"]),
        "saved_bytes_per_token": saved,
    }


def width_the_rule_gives(rows: list[dict]) -> int | None:
    """Smallest measured d_model from which every row (every shape, both positions) has
    module/lean >= 1 - LEAN_MAX_TIME_COST; None when even the widest fails."""
    widths = sorted({r["d_model"] for r in rows})
    cheap = lambda r: r["module_over_lean"] >= 1 - LEAN_MAX_TIME_COST
    ok = {d: all(cheap(r) for r in rows if r["d_model"] == d) for d in widths}
    passing_from = [d for i, d in enumerate(widths) if all(ok[w] for w in widths[i:])]
    return passing_from[0] if passing_from else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", help="also write the rows as JSON")
    args = parser.parse_args()
    rows = []
    print(
        f"threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}; "
        f"fused='auto' is lean from d_model {LEAN_MIN_D_MODEL}"
    )
    print(
        f"{'position':8} {'batch x seq':>11} {'d_model':>7} {'lean ms':>8} {'module ms':>9} "
        f"{'module/lean':>11} {'kept/token lean':>15} {'module':>8}"
    )
    for position in ("pre", "post"):
        for batch, seq in SHAPES:
            for d in WIDTHS:
                r = measure(d, position, batch, seq, args.rounds)
                rows.append(r)
                kept = r["saved_bytes_per_token"]
                lean_d, module_d = kept["lean"] / 4 / d, kept["module"] / 4 / d  # float32 floats / d
                print(
                    f"{position:8} {f'{batch} x {seq}':>11} {d:7d} {r['lean_ms']:8.2f} {r['module_ms']:9.2f} "
                    f"{r['module_over_lean']:11.3f} {lean_d:13.1f} d {module_d:6.1f} d",
                    flush=True,
                )
    measured = width_the_rule_gives(rows)
    print(
        f"the lean step costs at most {LEAN_MAX_TIME_COST:.0%} more time from d_model "
        f"{measured if measured is not None else '(none measured)'} on; "
        f"config.LEAN_MIN_D_MODEL = {LEAN_MIN_D_MODEL}"
        + ("" if measured == LEAN_MIN_D_MODEL else "  (they differ: see config.py's rule)")
    )
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "lean_min_d_model": LEAN_MIN_D_MODEL,
                    "lean_max_time_cost": LEAN_MAX_TIME_COST,
                    "width_the_rule_gives": measured,
                    "rounds": args.rounds,
                    "threads": torch.get_num_threads(),
                    "rows": rows,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
