"""Forward + backward tokens/s of blocklab's pre-norm GELU block against nn.TransformerEncoderLayer.

One run, interleaved rounds (each block once per round, the order rotating): the ratio of step
times within a round is what to read on a shared machine; its median over rounds is printed with a
95% percentile bootstrap interval (10,000 resamples, seed 0). Shape: d_model 512, 8 heads, d_ff
2048, batch 8, seq 256, float32, biases. `blocklab bench` does the same against every peer, and more.

    .venv/bin/python benchmarks/block_step.py [--rounds 30] [--dtype bfloat16] [--unfused]
"""

from __future__ import annotations

import argparse
import os
import statistics

from blocklab.bench.runner import BOOTSTRAP, PEERS, Shape, blocklab_candidate, make_input, train_step
from blocklab.bench.stats import time_rounds, within_round_ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--unfused", action="store_true", help="also time blocklab with fused=False")
    args = parser.parse_args()
    shape = Shape(dtype=args.dtype)
    blocks = [blocklab_candidate(shape), PEERS["torch-pre"](shape)]
    if args.unfused:
        blocks.append(blocklab_candidate(shape, "blocklab-unfused", fused=False))
    x, g = make_input(shape)
    for block in blocks:
        block.module.to(shape.torch_dtype)
    steps = {b.name: (lambda b=b: train_step(b, x, g)) for b in blocks}
    load = os.getloadavg()[0]
    times = time_rounds(steps, args.rounds, min_seconds=0.0)
    print(f"pre-norm GELU block, d_model 512, 8 heads, d_ff 2048, batch 8, seq 256, {args.dtype}; "
          f"forward + backward, {args.rounds} interleaved rounds; load average {load:.1f} at the start, "
          f"{os.getloadavg()[0]:.1f} at the end")
    print("  blocklab is (this block's step time / blocklab's, within a round): median [95% interval], "
          "best rounds")
    for name, t in times.items():
        tokens_per_s = statistics.median(shape.tokens / s for s in t)
        ratios = within_round_ratios(t, times["blocklab"])
        low, high = BOOTSTRAP.interval(ratios)
        print(f"  {name:18s} {tokens_per_s:9,.0f} tokens/s   {statistics.median(ratios):.3f}x "
              f"[{low:.3f}-{high:.3f}]   {min(t) / min(times['blocklab']):.3f}x")


if __name__ == "__main__":
    main()
