"""Forward + backward tokens/s of blocklab's pre-norm GELU block against nn.TransformerEncoderLayer.

One run, interleaved rounds (each block once per round, the order rotating), medians: the
ratio is what to read on a shared machine. Shape: d_model 512, 8 heads, d_ff 2048, batch 8,
seq 256, float32, biases. `blocklab bench` does the same against every peer, and more.

    .venv/bin/python benchmarks/block_step.py [--rounds 9] [--dtype bfloat16] [--unfused]
"""

from __future__ import annotations

import argparse
import statistics

from blocklab.bench import PEERS, Shape, blocklab_candidate, make_input, train_step
from blocklab.measure import median_ratio, time_rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
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
    times = time_rounds(steps, args.rounds, min_seconds=0.5)
    print(f"pre-norm GELU block, d_model 512, 8 heads, d_ff 2048, batch 8, seq 256, {args.dtype}; "
          f"forward + backward, median of {args.rounds} rounds")
    for name, t in times.items():
        tokens_per_s = statistics.median(shape.tokens / s for s in t)
        ratio = median_ratio(t, times["blocklab"])
        print(f"  {name:18s} {tokens_per_s:9,.0f} tokens/s   blocklab / this: {ratio:.3f}x")


if __name__ == "__main__":
    main()
