"""``blocklab diagnose``, ``ablate``, ``claims``: the lab."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..files.folders import write_output_file
from ..lab.grid import LAB_THREADS
from ..nn.config import FIELDS
from ..nn.layouts import LAYOUTS
from ..training.train_config import TRAIN_FIELDS
from .args import (
    TARGET_RULE,
    add_command,
    add_config_flags,
    add_executor_flags,
    add_json_flag,
    add_out_flag,
    add_seed_flag,
    add_task_flags,
    add_train_flags,
    at_least,
    config_from_args,
    emit_json,
    executor_from_args,
    literal,
    parse_names,
    parse_path,
    parse_target,
    parse_vary,
    say_written,
    set_fields,
    task_from_args,
)


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``diagnose``, ``ablate`` and ``claims``."""
    _add_diagnose(sub)
    _add_ablate(sub)
    _add_claims(sub)


def _add_diagnose(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "diagnose",
        "Gradient flow (through the identity path and through each branch of every block) and forward "
        "activation statistics of a model at initialization, on one batch of a task's training split.",
    )
    add_config_flags(p)
    add_task_flags(p, default="listops")
    p.add_argument("--batch-size", dest="batch_size", type=at_least(1), default=64,
                   metavar="N", help="examples in the batch (default: 64)")
    add_seed_flag(p, "model initialization seed")
    add_json_flag(p, "the diagnostics")
    p.set_defaults(func=cmd_diagnose)


def _add_ablate(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "ablate",
        "Train every combination of the --vary values, --seeds times each, and compare: accuracy, loss, "
        "steps to an accuracy, diverged runs. Rerunning with the same --out resumes the grid.",
    )
    p.add_argument(
        "--vary",
        action="append",
        default=[],
        metavar="FIELD=V1,V2",
        help="a ModelConfig or TrainConfig field and its values (repeatable: the grid is the product)",
    )
    p.add_argument("--seeds", type=at_least(1), default=1, metavar="N", help="seeds per cell (default: 1)")
    add_out_flag(p, "grid folder (default: runs/ablate-TASK); rerun to resume")
    add_executor_flags(p)
    p.add_argument("--steps-to-accuracy", dest="steps_to_accuracy",
                   type=parse_target, default=0.9, metavar="ACCURACY",
                   help=literal(f"the summary's 'steps to' column counts steps to this held-out accuracy: "
                                f"{TARGET_RULE} (default: 0.9)"))
    p.add_argument(
        "--log-diagnostics",
        dest="log_diagnostics",
        type=at_least(0),
        default=50,
        metavar="K",
        help="gradient flow every K steps for the report (default: 50; 0: off)",
    )
    p.add_argument("--run-reports", dest="run_reports", action="store_true",
                   help="also write each run's own report.html")
    add_json_flag(p, "the summary (summary.json)")
    add_config_flags(p)
    add_task_flags(p)
    add_train_flags(p, {"threads": LAB_THREADS})  # each run one thread: --jobs runs them side by side
    p.set_defaults(func=cmd_ablate, owns=ablate_out)


def _add_claims(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "claims",
        "Test claims about the transformer block (pre-norm trains deeper stacks, warmup matters for "
        "post-norm, ...) by training small models, and report each claim's verdict with every setup's "
        "numbers.",
    )
    p.add_argument("--quick", action="store_true", help="every claim at a reduced size (a few minutes)")
    p.add_argument("--only", type=parse_names, metavar="NAMES",
                   help="comma-separated claim names (default: all; --list shows them)")
    p.add_argument("--seeds", type=at_least(1), metavar="N",
                   help="seeds of every claim measured over seeds (default: each claim's own, 3 or 5 in "
                        "the full run); with --out, raising it trains only the new seeds")
    add_json_flag(p, "the report")
    p.add_argument("--html", type=parse_path, metavar="FILE",
                   help="write a self-contained HTML page with a plot per claim")
    add_out_flag(p, "folder that keeps each finished training run (default: runs/claims, or "
                    "runs/claims-quick with --quick); rerun the command to continue an interrupted run")
    add_executor_flags(p)
    p.add_argument("--list", action="store_true", help="list the claims and exit")
    p.set_defaults(func=cmd_claims, owns=claims_out)


def cmd_diagnose(args: argparse.Namespace) -> int:
    """Per-layer gradient flow (identity vs branch paths) and forward statistics at init."""
    from ..inspect.diagnostics import diagnose_at_init, diagnostics_table

    task = task_from_args(args)
    config = config_from_args(args, **task.config_overrides())
    diag = diagnose_at_init(config, task, args.batch_size, args.seed)
    if emit_json(args.json, {"config": config.to_dict(), "task": task.to_dict(), **diag.to_dict()}):
        return 0
    from rich.console import Console

    layout = LAYOUTS[config.norm_position].title  # "post-norm", "sandwich", "res-post"
    title = (f"{args.preset} at init on {task.name} ({config.n_layers} layers, {layout}, "
             f"residual {config.residual}), loss {diag.loss:.4f}")
    Console(width=200).print(diagnostics_table(diag, title))
    say_written(args.json)
    return 0


def ablate_out(args: argparse.Namespace) -> str:
    """The grid folder ``ablate`` writes: ``--out``, else ``runs/ablate-TASK``."""
    return args.out or f"runs/ablate-{args.task}"


def cmd_ablate(args: argparse.Namespace) -> int:
    """Run (or resume) an ablation grid and print its summary."""
    from ..lab.ablate import ablate, summary_table

    vary = parse_vary(args.vary)
    task = task_from_args(args)
    out = ablate_out(args)
    done = [0]

    def report(spec: Any, result: dict[str, Any], skipped: bool) -> None:
        done[0] += 1
        if args.json != "-":
            state = (
                "skipped (done before)"
                if skipped
                else f"{result['accuracy']:.1%} in {result['seconds']:.0f} s"
            )
            print(f"[{done[0]}] {spec.key}: {state}", flush=True)

    with resumable(out):
        summary = ablate(
            task.to_dict(),
            vary,
            out,
            seeds=args.seeds,
            preset_name=args.preset,
            model=set_fields(args, FIELDS),
            train=set_fields(args, TRAIN_FIELDS),
            executor=executor_from_args(args),
            target=args.steps_to_accuracy,
            log_diagnostics=args.log_diagnostics,
            run_reports=args.run_reports,
            on_done=report,
        )
    if emit_json(args.json, summary):
        return 0
    from rich.console import Console

    Console().print(summary_table(summary))
    print(f"wrote {out}/summary.json and {out}/report.html")
    say_written(args.json)
    return 0


@contextmanager
def resumable(out: str | Path) -> Iterator[None]:
    """Ctrl-C meanwhile says where the finished runs are and how to continue (status 130)."""
    try:
        yield
    except KeyboardInterrupt:
        raise KeyboardInterrupt(f"interrupted; the finished training runs are kept in {out}: run the same "
                                "command again to continue") from None


def claims_out(args: argparse.Namespace) -> str:
    """The folder ``claims`` keeps its finished runs in: ``--out``, else runs/claims (-quick)."""
    return args.out or ("runs/claims-quick" if args.quick else "runs/claims")


def cmd_claims(args: argparse.Namespace) -> int:
    """Run the claims and show the verdicts."""
    from rich.console import Console

    from ..lab.claims import CLAIMS, claims_html, claims_table, run_claims, select, with_seeds

    if args.list:
        for claim in CLAIMS:
            print(f"{claim.name:24} {claim.statement}")
        return 0
    with_seeds(select(args.only), args.seeds, args.quick)  # unknown names, --seeds that cannot apply: now
    json_on_stdout = args.json == "-"
    out = claims_out(args)
    with resumable(out):
        report = run_claims(args.only, quick=args.quick, executor=executor_from_args(args), out=out,
                            progress=not json_on_stdout, seeds=args.seeds)
    if not emit_json(args.json, report):
        Console().print(claims_table(report))
    say_written(args.json)
    if args.html:
        write_output_file(args.html, claims_html(report).encode("utf-8"), flag="--html")
        say_written(args.html, to_stderr=json_on_stdout)
    return 0
