"""``blocklab bench``: blocklab's block against the peers', side by side."""

from __future__ import annotations

import argparse

from ..bench.runner import FULL, MIN_ROUNDS_FOR_VERDICT, QUICK
from .args import add_command, add_json_flag, at_least, emit_json, one_of, parse_path, say_written


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``bench``."""
    p = add_command(
        sub, "bench",
        "Benchmark blocklab's block against the same block from PyTorch, transformers and x-transformers, "
        "measured side by side in one run (interleaved rounds): tokens/s, activation memory saved for "
        "backward, peak memory, FLOP rate, and sweeps over width and sequence length.",
    )
    p.add_argument("--quick", action="store_true", help=f"{QUICK.rounds} interleaved rounds instead of "
                   f"{FULL.rounds}, fewer sweep points")
    p.add_argument("--rounds", type=at_least(1), metavar="N",
                   help=f"interleaved rounds of the comparison (default {FULL.rounds}, --quick "
                   f"{QUICK.rounds}; a speed verdict needs {MIN_ROUNDS_FOR_VERDICT})")
    p.add_argument(
        "--compile", action="store_true", help="also torch.compile every block (compile time reported)"
    )
    p.add_argument("--dtype", default="float32", choices=DTYPES, metavar="DTYPE",
                   help=one_of(DTYPES, "float32"))
    add_json_flag(p, "the full report")
    p.add_argument("--plot", type=parse_path, metavar="FILE", help="write the sweep plot (PNG) to FILE")
    p.set_defaults(func=cmd_bench)


DTYPES = ("float32", "bfloat16")


def cmd_bench(args: argparse.Namespace) -> int:
    """Run the benchmark, print its tables, optionally write JSON and the sweep plot."""
    from ..bench.report import print_report
    from ..bench.runner import run_bench

    # only files the user named: a plot beside --json FILE could replace a file of theirs (main checked both)
    report = run_bench(
        quick=args.quick, compile=args.compile, dtype=args.dtype, plot=args.plot, rounds=args.rounds
    )
    if emit_json(args.json, report):
        return 0
    print_report(report)
    say_written(args.json)
    return 0
