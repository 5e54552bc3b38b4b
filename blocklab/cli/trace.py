"""``blocklab trace``: pick the model and the input, collect, then print / write JSON / write HTML.

The model is a preset built with a fixed seed (a preset shaped for a task, ``presets.PRESET_TASKS``,
brings the task's tokenizer) or ``--model`` (anything ``blocklab.load`` reads: a run, a checkpoint, a
Hugging Face folder or an installed model package), which brings its own tokenizer when it has one.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from ..files.folders import write_output_file
from ..inspect.trace.collect import trace_to_dict
from ..inspect.trace.record import Trace
from ..inspect.trace.subject import ENCODER_NOTE, RANDOM_NOTE, Subject, preset_subject, trace_subject
from ..nn.config import FIELDS
from .args import (
    add_command,
    add_config_flags,
    add_device_flags,
    add_json_flag,
    add_model_flag,
    add_quiet_flag,
    add_seed_flag,
    at_least,
    emit_json,
    parse_int,
    parse_path,
    say_written,
    set_fields,
)
from .defaults import DEFAULT_PRESET, NO_MAIN_RUN, default_model


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``trace``."""
    p = add_command(
        sub, "trace",
        "Walk one input through a model and print every stage (embeddings, each block's norms, "
        "attention, feed-forward and residual stream, the final norm, the logits): per-position "
        "statistics and the vectors themselves. The model is a preset with weights drawn from --seed, or "
        "--model (a trained or imported model, with its tokenizer).",
    )
    add_config_flags(p, default_preset=None)
    add_seed_flag(p, "seed the preset's weights are drawn with")
    add_model_flag(p, required=False, what="trace this model instead of a preset")
    p.add_argument("--input", metavar="TEXT",
                   help='text in the model\'s vocabulary, e.g. "Max ( 1 , 6 , 2 )"')
    p.add_argument("--tokens", metavar="IDS", help="token ids instead of text, e.g. 1,2,3")
    p.add_argument("--target", metavar="TOKEN",
                   help="the token the last position should predict (adds the loss stage)")
    p.add_argument("--position", type=parse_int, metavar="N",
                   help="show only this position (-1: the last; default: all)")
    p.add_argument("--decimals", type=at_least(0, 12), default=4, metavar="N",
                   help="digits after the decimal point, 0 to 12 (default: 4)")
    p.add_argument(
        "--max-features",
        dest="max_features",
        type=at_least(0),
        default=16,
        metavar="N",
        help="features of each vector printed (default: 16; 0: all)",
    )
    p.add_argument(
        "--stages",
        action="append",
        metavar="GLOB",
        help="only stages matching this glob (repeatable), e.g. 'blocks.0.*' or '*.ln1'",
    )
    p.add_argument("--walk", action="store_true",
                   help="print the forward pass as the tutorials teach it, step by step, as grids of "
                        "numbers: embeddings, positions, Q/K/V per head, QK^T, scaled, masked, exp, row "
                        "sums, "
                        "weights, weights @ V, concatenation, Wo, residual sum, the norm's mu, var, "
                        "denominator, z_hat, gamma, beta, W1 x + b1, activation, W2, ..., logits "
                        "(docs/tutorial.md)")
    p.add_argument("--width", type=at_least(MIN_WIDTH), metavar="N",
                   help=f"width of the tables, >= {MIN_WIDTH} (default: the terminal's, else 160)")
    p.add_argument("--weights", type=parse_path, metavar="FILE",
                   help="set the model's weights from this file (.json or .safetensors) named by stage: "
                        "embedding, blocks.0.attn.Wq (or Wq.h0 per head), ..., ffn.W1, ln1.gamma, W_vocab "
                        "(docs/tutorial.md); --write-weights writes every entry the model takes")
    p.add_argument("--write-weights", dest="write_weights", type=parse_path, metavar="FILE",
                   help="write the model's weights (after --weights) to this .json or .safetensors file, "
                        "named by stage, one head per entry, to read and edit")
    add_json_flag(p, "the trace (blocklab/inspect/trace/schema.json)")
    p.add_argument("--html", type=parse_path, metavar="FILE",
                   help="also write a self-contained HTML page with heatmaps")
    add_quiet_flag(p, "do not print the walk (with --json FILE or --html)")
    add_device_flags(p)
    p.set_defaults(func=cmd_trace)


MIN_WIDTH = 40  # narrower, the tables' columns no longer fit one number each


def model_subject(path: str, allow_nonfinite: bool = False) -> Subject:
    """A trained or imported model with its stored tokenizer (anything ``blocklab.load`` reads). A model
    that is not causal and was trained on no task of blocklab's (an imported BERT) has no next-token head."""
    from ..weights.load import load

    loaded = load(path, allow_nonfinite=allow_nonfinite)
    encoder = not loaded.model.config.causal and "task" not in loaded.meta
    return Subject(loaded.model, loaded.tokenizer, loaded.source.describe(),
                   notes=[ENCODER_NOTE] if encoder else [], next_token=not encoder)


def named_or_default(preset: str | None, seed: int, overrides: dict[str, Any],
                     allow_nonfinite: bool = False) -> Subject:
    """The preset named (with ``overrides``); with none and no config flag, the README's main run when it
    holds a checkpoint, else the language model blocklab ships, whose note says what it is and how to train
    the README's model."""
    if preset is not None or overrides:
        return preset_subject(preset or DEFAULT_PRESET, seed, overrides)
    model, is_main_run = default_model()
    subject = model_subject(model, allow_nonfinite)
    subject.notes += [] if is_main_run else [NO_MAIN_RUN]
    return subject


def set_file_weights(subject: Subject, path: str) -> None:
    """The subject's weights from a file named by stage (``weights.by_stage``); its source and notes say so
    (the note that its weights are random goes)."""
    from ..weights.by_stage import read_weights_file, set_weights_by_stage

    set_weights_by_stage(subject.model, read_weights_file(path), source=f"the weights in {path}")
    subject.source += f", weights from {path}"
    subject.notes = [n for n in subject.notes if not n.startswith(RANDOM_NOTE)]


def collect_for_args(args: argparse.Namespace, overrides: dict[str, Any]) -> Trace:
    """The model and input the flags name, traced on ``--device`` in ``--dtype``."""
    from ..device import resolve_compute

    compute = resolve_compute(args.device, args.dtype)
    if args.model:
        if overrides:
            raise ValueError(f"config flags ({', '.join(overrides)}) apply to --preset, not to --model")
        subject = model_subject(args.model, args.allow_nonfinite)
    else:
        subject = named_or_default(args.preset, args.seed, overrides, args.allow_nonfinite)
    if args.weights:
        set_file_weights(subject, args.weights)
    if args.write_weights:
        from ..weights.by_stage import weights_by_stage, write_weights_file

        write_weights_file(args.write_weights, weights_by_stage(subject.model), flag="--write-weights")
    subject.model.to(compute.device)
    with compute.autocast():
        return trace_subject(subject, args.input, args.tokens, args.target, args.position, args.stages)


def cmd_trace(args: argparse.Namespace) -> int:
    """Trace, then print (unless --quiet or --json on stdout) and write --json FILE / --html."""
    # One short sequence: the matmuls are too small for a second thread to pay off, and on a busy
    # machine waiting for it costs more than the work (0.5 s instead of 0.03 s for listops-seed).
    torch.set_num_threads(1)
    trace = collect_for_args(args, set_fields(args, FIELDS))
    if emit_json(args.json, trace_to_dict(trace)):
        args.quiet = True
    if not args.quiet:
        from rich.console import Console

        from ..inspect.trace.text import render_text

        console = Console(highlight=False)
        if args.width:
            console.width = args.width
        elif not console.is_terminal:
            console.width = 160
        if args.walk:
            from ..inspect.trace.text import header
            from ..inspect.trace.walk import render_walk

            console.print(header(trace))
            render_walk(trace, console, args.decimals, console.width)
        else:
            render_text(trace, console, decimals=args.decimals, max_features=args.max_features)
    say_written(args.json)
    say_written(args.write_weights, to_stderr=True)
    if args.html:
        from ..inspect.trace.html import render_html

        write_output_file(args.html, render_html(trace, args.decimals).encode(), flag="--html")
        say_written(args.html, to_stderr=args.json == "-")
    return 0
