"""``blocklab diagnose``, ``ablate``, ``claims``: the lab."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..config import FIELDS
from ..errors import UsageError
from ..runfolder import check_output_files, write_output_file
from ..trainconfig import TRAIN_FIELDS
from .args import (
    add_config_flags,
    add_task_flags,
    add_train_flags,
    config_from_args,
    parse_vary,
    set_fields,
    task_from_args,
)


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``diagnose``, ``ablate`` and ``claims``."""
    p = sub.add_parser(
        "diagnose", help="gradient flow and activation statistics of a model at initialization"
    )
    add_config_flags(p)
    p.add_argument(
        "--task", default="listops", help="the batch and loss come from this task's training split"
    )
    p.add_argument("--batch-size", "--batch_size", dest="batch_size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0, help="model initialization seed")
    p.add_argument("--json", action="store_true", help="print the diagnostics as JSON")
    p.set_defaults(func=cmd_diagnose)

    p = sub.add_parser(
        "ablate", help="train a grid of configs x seeds; summary table, summary.json, report.html"
    )
    p.add_argument(
        "--vary",
        action="append",
        default=[],
        metavar="FIELD=V1,V2",
        help="a ModelConfig or TrainConfig field and its values (repeatable: the grid is the product)",
    )
    p.add_argument("--seeds", type=int, default=1, help="seeds per cell (default 1)")
    p.add_argument("--out", help="grid folder (default runs/ablate-TASK); rerun to resume")
    p.add_argument("--jobs", type=int, default=1, help="parallel worker processes (default 1)")
    p.add_argument("--target", type=float, default=0.9, help="accuracy for 'steps to target' (default 0.9)")
    p.add_argument(
        "--log-diagnostics",
        "--log_diagnostics",
        dest="log_diagnostics",
        type=int,
        default=50,
        metavar="K",
        help="gradient flow every K steps for the report (default 50; 0: off)",
    )
    p.add_argument("--run-reports", action="store_true", help="also write each run's own report.html")
    p.add_argument("--json", action="store_true", help="print summary.json instead of the table")
    add_config_flags(p)
    add_task_flags(p)
    add_train_flags(p)
    p.set_defaults(func=cmd_ablate)

    p = sub.add_parser("claims", help="test what the textbooks say about the block; table + HTML report")
    p.add_argument("--quick", action="store_true", help="every claim at a reduced size (about 3 minutes)")
    p.add_argument("--only", help="comma-separated claim names (default: all)")
    p.add_argument("--json", metavar="FILE", help="write the report as JSON ('-' for stdout)")
    p.add_argument("--html", metavar="FILE", help="write a self-contained HTML page with a plot per claim")
    p.add_argument("--jobs", type=int, default=None, help="parallel worker processes (default: CPU count)")
    p.add_argument("--list", action="store_true", help="list the claims and exit")
    p.set_defaults(func=cmd_claims)


def cmd_diagnose(args: argparse.Namespace) -> int:
    """Per-layer gradient flow (identity vs branch paths) and forward statistics at init."""
    from ..diagnostics import diagnose_at_init, diagnostics_table
    from ..tasks import get_task

    if args.batch_size < 1:
        raise UsageError(f"--batch-size={args.batch_size} must be >= 1")
    task = get_task(args.task)
    config = config_from_args(args, **task.config_overrides())
    diag = diagnose_at_init(config, task, args.batch_size, args.seed)
    if args.json:
        print(json.dumps({"config": config.to_dict(), "task": task.to_dict(), **diag.to_dict()}))
        return 0
    from rich.console import Console

    title = (
        f"{args.preset} at init on {args.task} ({config.n_layers} layers, {config.norm_position}-norm, "
        f"residual {config.residual}), loss {diag.loss:.4f}"
    )
    Console(width=200).print(diagnostics_table(diag, title))
    return 0


def cmd_ablate(args: argparse.Namespace) -> int:
    """Run (or resume) an ablation grid and print its summary."""
    from ..experiments.ablate import ablate, summary_table

    if args.jobs < 1:
        raise UsageError(f"--jobs={args.jobs} must be >= 1")
    vary = parse_vary(args.vary)
    task = task_from_args(args)
    out = args.out or f"runs/ablate-{task.name}"
    done = [0]

    def report(spec: Any, result: dict[str, Any], skipped: bool) -> None:
        done[0] += 1
        if not args.json:
            state = (
                "skipped (done before)"
                if skipped
                else f"{result['accuracy']:.1%} in {result['seconds']:.0f} s"
            )
            print(f"[{done[0]}] {spec.key}: {state}", flush=True)

    summary = ablate(
        task.to_dict(),
        vary,
        out,
        seeds=args.seeds,
        preset_name=args.preset,
        model=set_fields(args, FIELDS),
        train=set_fields(args, TRAIN_FIELDS),
        jobs=args.jobs,
        target=args.target,
        log_diagnostics=args.log_diagnostics,
        run_reports=args.run_reports,
        on_done=report,
    )
    if args.json:
        print(json.dumps(summary))
        return 0
    from rich.console import Console

    Console().print(summary_table(summary))
    print(f"wrote {out}/summary.json and {out}/report.html")
    return 0


def cmd_claims(args: argparse.Namespace) -> int:
    """Run the claims and show the verdicts."""
    from rich.console import Console

    from ..experiments.claims import CLAIMS, claims_html, claims_table, run_claims, select

    console = Console(stderr=args.json == "-")
    if args.list:
        for claim in CLAIMS:
            print(f"{claim.name:24} {claim.statement}")
        return 0
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs={args.jobs} must be >= 1")
    names = [n.strip() for n in args.only.split(",") if n.strip()] if args.only else None
    select(names)  # unknown names fail before anything runs
    check_output_files({"--json": None if args.json == "-" else args.json, "--html": args.html})
    report = run_claims(names, quick=args.quick, jobs=args.jobs, progress=args.json != "-")
    if args.json == "-":
        print(json.dumps(report, allow_nan=False))
    else:
        console.print(claims_table(report))
    if args.json and args.json != "-":
        write_output_file(args.json, json.dumps(report, indent=1, allow_nan=False).encode(), flag="--json")
        console.print(f"wrote {args.json}")
    if args.html:
        write_output_file(args.html, claims_html(report).encode(), flag="--html")
        console.print(f"wrote {args.html}")
    return 0
