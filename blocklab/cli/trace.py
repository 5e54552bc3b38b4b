"""``blocklab trace``: pick the model and the input, collect, then print / write JSON / write HTML.

The model is a preset built with a fixed seed (``listops-seed`` and ``tiny-lm`` bring their
task's tokenizer) or a checkpoint (a blocklab file, a Hugging Face folder or an installed
model package), which brings its own tokenizer when it has one.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..config import FIELDS
from ..model import Transformer
from ..runfolder import check_output_files, write_output_file
from ..trace.collect import collect_trace, trace_to_dict
from ..trace.record import Trace
from .args import add_config_flags, add_device_flags, parse_token_ids, set_fields


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``trace``."""
    p = sub.add_parser("trace", help="walk one input through the model and print every stage's numbers")
    add_config_flags(p)
    p.add_argument("--seed", type=int, default=0, help="seed the preset's weights are drawn with (default 0)")
    p.add_argument(
        "--checkpoint",
        help="trace a trained or imported model instead of a preset: a blocklab "
        "checkpoint file, a Hugging Face model folder, or a package name",
    )
    p.add_argument("--input", help='text in the model\'s vocabulary, e.g. "Max ( 1 , 6 , 2 )"')
    p.add_argument("--tokens", help="token ids instead of text, e.g. 1,2,3")
    p.add_argument("--target", help="the token the last position should predict (adds the loss stage)")
    p.add_argument("--position", type=int, help="show only this position (-1 = last; default all)")
    p.add_argument("--decimals", type=int, default=4, help="digits after the decimal point (default 4)")
    p.add_argument(
        "--max-features",
        "--max_features",
        dest="max_features",
        type=int,
        default=16,
        help="features of each vector printed (default 16; 0 = all)",
    )
    p.add_argument(
        "--stages",
        action="append",
        help="only stages matching this glob (repeatable), e.g. 'blocks.0.*' or '*.ln1'",
    )
    p.add_argument("--width", type=int, help="width of the tables (default: the terminal's, else 160)")
    p.add_argument("--json", metavar="FILE", help="also write the trace as JSON (blocklab/trace/schema.json)")
    p.add_argument("--html", metavar="FILE", help="also write a self-contained HTML page with heatmaps")
    p.add_argument("-q", "--quiet", action="store_true", help="do not print the walk (with --json/--html)")
    add_device_flags(p)
    p.set_defaults(func=cmd_trace)


PRESET_TASKS = {"listops-seed": "listops", "tiny-lm": "tiny-lm"}  # presets that come with a tokenizer


@dataclass
class Subject:
    """The model to trace, its tokenizer (None: inputs are ids) and a line saying where it came from."""

    model: Transformer
    tokenizer: Any
    source: str


def preset_subject(name: str, seed: int, overrides: dict[str, Any]) -> Subject:
    """A preset's model built with ``torch.manual_seed(seed)``; its task's tokenizer if it has one."""
    from ..config import preset
    from ..resources import check_memory
    from ..tasks import get_task

    task = get_task(PRESET_TASKS[name]) if name in PRESET_TASKS else None
    config = preset(name, **{**(task.config_overrides() if task else {}), **overrides})
    check_memory(config, 1, training=False, what=f"tracing preset {name}", force_flag=False)
    torch.manual_seed(seed)
    changed = "".join(f", {k}={v}" for k, v in overrides.items())
    return Subject(
        Transformer(config).eval(), task.tokenizer if task else None, f"preset {name} (seed {seed}{changed})"
    )


def checkpoint_subject(path: str) -> Subject:
    """A trained or imported model with the tokenizer stored alongside it: a checkpoint file, a
    training run's folder (its newest checkpoint), a checkpoint folder, a Hugging Face model
    folder or an installed model package."""
    from ..checkpoint import FORMAT, read_checkpoint_header
    from ..interop.pretrained import load_model
    from ..runfolder import CHECKPOINTS, MODEL_FILE, resolve_checkpoint

    folder = Path(path)
    weights = folder / MODEL_FILE
    ours = folder.is_dir() and (
        (folder / CHECKPOINTS).is_dir()
        or (weights.is_file() and read_checkpoint_header(weights)[0].get("format") == FORMAT)
    )
    model, tokenizer = load_model(resolve_checkpoint(folder) if ours else path)
    return Subject(model.eval(), tokenizer, f"checkpoint {path}")


def vocabulary(tokenizer: Any, size: int) -> list[str] | None:
    """Every token string of the model's vocabulary, or None when the tokenizer cannot name them all."""
    try:
        return list(tokenizer.tokens(list(range(size)))) if tokenizer is not None else None
    except (ValueError, TypeError, AttributeError):
        return None


def target_id(tokenizer: Any, token: str) -> int:
    """The id of ``--target``: a token of the vocabulary, or an id when there is no tokenizer."""
    table = getattr(tokenizer, "token_to_id", None)
    found = (
        table.get(token)
        if isinstance(table, dict)
        else (tokenizer.token_id(token) if hasattr(tokenizer, "token_id") else None)
    )
    if found is not None:
        return int(found)
    if tokenizer is None and token.isdigit():
        return int(token)
    raise ValueError(
        f"--target {token!r} is not a token of the vocabulary"
        + (f"; {tokenizer.describe_vocab()}" if hasattr(tokenizer, "describe_vocab") else "")
    )


def collect_for_args(args: argparse.Namespace, overrides: dict[str, Any]) -> Trace:
    """The model and input the flags name, traced on ``--device`` in ``--dtype``."""
    from ..device import resolve_compute

    compute = resolve_compute(args.device, args.dtype)
    if args.checkpoint:
        if overrides:
            raise ValueError(f"config flags ({', '.join(overrides)}) apply to --preset, not to --checkpoint")
        subject = checkpoint_subject(args.checkpoint)
    else:
        subject = preset_subject(args.preset, args.seed, overrides)
    tok = subject.tokenizer
    if (args.input is None) == (args.tokens is None):
        raise ValueError("give the input as text with --input or as ids with --tokens (one of them)")
    if args.input is not None and tok is None:
        raise ValueError(f"{subject.source} has no tokenizer: give token ids with --tokens 1,2,3")
    ids = tok.encode(args.input) if args.input is not None else parse_token_ids(args.tokens)
    V = subject.model.config.vocab_size
    bad = [i for i in ids if not 0 <= i < V]
    if bad:
        raise ValueError(f"token id {bad[0]} is out of range: the model's vocabulary has ids 0..{V - 1}")
    labels = tok.tokens(ids) if tok is not None else [str(i) for i in ids]
    target = target_id(tok, args.target) if args.target is not None else None
    with compute.autocast():
        return collect_trace(
            subject.model.to(compute.device),
            ids,
            labels,
            position=args.position,
            target=target,
            target_token=args.target,
            vocab=vocabulary(tok, V),
            names=args.stages,
            source=subject.source,
            text=args.input,
        )


def cmd_trace(args: argparse.Namespace) -> int:
    """Trace, then print (unless --quiet) and write --json / --html."""
    if args.decimals < 0 or args.decimals > 12:
        raise ValueError(f"--decimals {args.decimals} must be between 0 and 12")
    # One short sequence: the matmuls are too small for a second thread to pay off, and on a busy
    # machine waiting for it costs more than the work (0.5 s instead of 0.03 s for listops-seed).
    torch.set_num_threads(1)
    inputs = [args.checkpoint] if args.checkpoint and Path(args.checkpoint).exists() else []
    check_output_files({"--json": args.json, "--html": args.html}, inputs)  # never over the model read
    trace = collect_for_args(args, set_fields(args, FIELDS))
    if not args.quiet:
        from rich.console import Console

        from ..trace.text import render_text

        console = Console(highlight=False)
        if args.width:
            console.width = args.width
        elif not console.is_terminal:
            console.width = 160
        render_text(trace, console, decimals=args.decimals, max_features=args.max_features)
    if args.json:
        write_output_file(args.json, (json.dumps(trace_to_dict(trace)) + "\n").encode(), inputs, "--json")
        print(f"wrote {args.json}")
    if args.html:
        from ..trace.html import render_html

        write_output_file(args.html, render_html(trace, args.decimals).encode(), inputs, "--html")
        print(f"wrote {args.html}")
    return 0
