"""RMSNorm against LayerNorm: forward + backward of one norm, by width and dtype, on both of blocklab's paths.

Issue 38 asks for RMSNorm at LayerNorm's cost or below from d 64 to 4096 in float32 and bfloat16. Each
row times, in interleaved rounds (``bench.stats.time_rounds``), one forward + backward (dL/dx and
dL/dgamma) of ``LayerNorm(variant="standard")`` and ``LayerNorm(variant="rms")`` on the module path
(``fused=False``) and on the lean path (``fused=True``), and torch's own ``F.layer_norm`` and
``F.rms_norm`` as the peer. Each figure is the median within-round ratio, RMSNorm's time over
LayerNorm's (below 1: RMSNorm is cheaper), with the bootstrap interval of that median.

Then what a user feels: one whole training step (forward, loss, backward, AdamW) of a SmolLM2-135M-shaped
model (``preset("smollm2-135m")``, its width, heads and FFN, fewer layers: ``--layers``) with its RMSNorms
against the same model with LayerNorms, same weights otherwise, float32.

    .venv/bin/python benchmarks/norm_cost.py [--rounds 15] [--tokens 2048] [--layers 4] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as F

from blocklab import Transformer
from blocklab.bench.stats import Bootstrap, median_ratio, time_rounds, within_round_ratios
from blocklab.nn.norms import LayerNorm
from blocklab.nn.presets import preset

WIDTHS = (64, 256, 1024, 4096)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
EPS = 1e-5


def _step(norm, x: torch.Tensor, g: torch.Tensor, params: list[torch.Tensor]):
    def step() -> None:
        norm(x).backward(g)
        x.grad = None
        for p in params:
            p.grad = None

    return step


def steps_at(d: int, dtype: torch.dtype, tokens: int) -> dict[str, object]:
    """name -> a forward + backward of that norm on (tokens, d) inputs of ``dtype``."""
    torch.manual_seed(0)
    x = torch.randn(tokens, d, dtype=dtype, requires_grad=True)
    g = torch.randn(tokens, d, dtype=dtype)
    steps = {}
    for path, fused in (("module", False), ("lean", True)):
        for kind in ("standard", "rms"):
            module = LayerNorm(d, eps=EPS, variant=kind, fused=fused, dtype=dtype)
            steps[f"{path} {kind}"] = _step(module, x, g, list(module.parameters()))
    w = torch.ones(d, dtype=dtype, requires_grad=True)
    b = torch.zeros(d, dtype=dtype, requires_grad=True)
    steps["torch standard"] = _step(lambda t: F.layer_norm(t, (d,), w, b, EPS), x, g, [w, b])
    steps["torch rms"] = _step(lambda t: F.rms_norm(t, (d,), w, EPS), x, g, [w])
    return steps


def measure(d: int, dtype_name: str, tokens: int, rounds: int) -> dict:
    times = time_rounds(steps_at(d, DTYPES[dtype_name], tokens), rounds, min_seconds=0.05)
    row: dict = {"d_model": d, "dtype": dtype_name, "tokens": tokens}
    for path in ("module", "lean", "torch"):
        row[path] = _ratio(times[f"{path} rms"], times[f"{path} standard"])
    return row


def _ratio(num: list[float], den: list[float]) -> dict:
    low, high = Bootstrap().interval(within_round_ratios(num, den))
    return {"rms_over_ln": median_ratio(num, den), "interval": [low, high],
            "ln_ms": 1e3 * sorted(den)[len(den) // 2]}


def training_step(layers: int, batch: int, seq: int, rounds: int) -> dict:
    """One AdamW training step of the SmolLM2-135M shape (``layers`` of its blocks) with RMSNorm and with
    LayerNorm: the ratio of their times, interleaved."""
    config = preset("smollm2-135m").replace(n_layers=layers, max_seq_len=seq, vocab_size=4096)
    steps = {}
    for kind in ("rms", "standard"):
        torch.manual_seed(0)
        model = Transformer(config.replace(norm=kind))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        tokens = torch.randint(0, config.vocab_size, (batch, seq))

        def step(model=model, optimizer=optimizer, tokens=tokens) -> None:
            _, loss = model(tokens, targets=tokens)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        steps[kind] = step
    times = time_rounds(steps, rounds, min_seconds=0.0)
    return {"shape": f"smollm2-135m x {layers} layers", "batch": batch, "seq": seq,
            "step": _ratio(times["rms"], times["standard"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--tokens", type=int, default=2048, help="positions normalised per call")
    parser.add_argument("--widths", default=",".join(map(str, WIDTHS)))
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--layers", type=int, default=4, help="blocks of the training step's model (0: skip)")
    parser.add_argument("--step-rounds", type=int, default=7)
    parser.add_argument("--json", help="also write the rows as JSON")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"RMSNorm's forward + backward time over LayerNorm's (median of {args.rounds} interleaved rounds, "
          f"95% bootstrap interval), {args.tokens} positions, 1 thread, "
          f"load average {os.getloadavg()[0]:.1f}")
    heads = ("blocklab module path", "blocklab lean path", "torch F.rms_norm")
    print(f"{'dtype':9} {'d':>5}  " + "  ".join(f"{h:>22}" for h in heads))
    rows = []
    for dtype_name in args.dtypes.split(","):
        for d in map(int, args.widths.split(",")):
            row = measure(d, dtype_name, args.tokens, args.rounds)
            rows.append(row)
            cells = [f"{row[p]['rms_over_ln']:5.2f}x [{low:.2f}, {high:.2f}]"
                     for p in ("module", "lean", "torch") for low, high in [row[p]["interval"]]]
            print(f"{dtype_name:9} {d:5d}  " + "  ".join(f"{c:>22}" for c in cells), flush=True)
    step = training_step(args.layers, 4, 256, args.step_rounds) if args.layers else None
    if step is not None:
        r, (low, high) = step["step"], step["step"]["interval"]
        print(f"a whole training step ({step['shape']}, batch {step['batch']} x {step['seq']}, AdamW, "
              f"float32): RMSNorm {r['rms_over_ln']:.3f}x LayerNorm's time [{low:.3f}, {high:.3f}] "
              f"(LayerNorm's step {r['ln_ms']:.0f} ms)")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rounds": args.rounds, "tokens": args.tokens, "rows": rows, "training_step": step}, f,
                      indent=1)


if __name__ == "__main__":
    main()
