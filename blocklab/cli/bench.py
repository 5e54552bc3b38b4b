"""``blocklab bench``: blocklab's block against the peers', side by side."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..bench import FULL, MIN_ROUNDS_FOR_VERDICT, QUICK
from ..runfolder import check_output_files, write_output_file
from .args import parse_count


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``bench``."""
    p = sub.add_parser(
        "bench",
        help="blocklab's block vs PyTorch, transformers and x-transformers blocks: "
        "tokens/s, saved activations, peak memory, FLOP rate, sweeps",
    )
    p.add_argument("--quick", action="store_true", help=f"{QUICK.rounds} interleaved rounds instead of "
                   f"{FULL.rounds}, fewer sweep points")
    p.add_argument("--rounds", type=parse_count, metavar="N",
                   help=f"interleaved rounds of the comparison (default {FULL.rounds}, --quick "
                   f"{QUICK.rounds}; a speed verdict needs {MIN_ROUNDS_FOR_VERDICT})")
    p.add_argument(
        "--compile", action="store_true", help="also torch.compile every block (compile time reported)"
    )
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--json", metavar="FILE", help="write the full report as JSON")
    p.add_argument("--plot", metavar="FILE", help="sweep plot (PNG); default: next to --json, else none")
    p.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    """Run the benchmark, print its tables, optionally write JSON and the sweep plot."""
    from ..bench import run_bench
    from ..bench_report import print_report

    plot = args.plot or (str(Path(args.json).with_suffix(".png")) if args.json else None)
    check_output_files({"--json": args.json, "--plot": plot})  # before minutes of measuring
    report = run_bench(
        quick=args.quick, compile=args.compile, dtype=args.dtype, plot=plot, rounds=args.rounds
    )
    print_report(report)
    if args.json:
        write_output_file(args.json, json.dumps(report, indent=1).encode(), flag="--json")
    return 0
