"""``blocklab trace``: pick the model and the input, collect, then print / write JSON / write HTML.

The model is a preset built with a fixed seed (a preset shaped for a task, ``config.PRESET_TASKS``,
brings the task's tokenizer) or ``--model`` (anything ``blocklab.load`` reads: a run, a checkpoint, a
Hugging Face folder or an installed model package), which brings its own tokenizer when it has one.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

import torch

from ..files.folders import write_output_file
from ..inspect.trace.collect import collect_trace, trace_to_dict
from ..inspect.trace.record import Trace
from ..nn.config import FIELDS, PRESET_TASKS
from ..nn.model import Transformer
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
    parse_token_ids,
    say_written,
    set_fields,
)


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``trace``."""
    p = add_command(
        sub, "trace",
        "Walk one input through a model and print every stage (embeddings, each block's norms, "
        "attention, feed-forward and residual stream, the final norm, the logits): per-position "
        "statistics and the vectors themselves. The model is a preset with weights drawn from --seed, or "
        "--model (a trained or imported model, with its tokenizer).",
    )
    add_config_flags(p)
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
    p.add_argument("--width", type=at_least(MIN_WIDTH), metavar="N",
                   help=f"width of the tables, >= {MIN_WIDTH} (default: the terminal's, else 160)")
    add_json_flag(p, "the trace (blocklab/inspect/trace/schema.json)")
    p.add_argument("--html", type=parse_path, metavar="FILE",
                   help="also write a self-contained HTML page with heatmaps")
    add_quiet_flag(p, "do not print the walk (with --json FILE or --html)")
    add_device_flags(p)
    p.set_defaults(func=cmd_trace)


MIN_WIDTH = 40  # narrower, the tables' columns no longer fit one number each


@dataclass
class Subject:
    """The model to trace, its tokenizer (None: inputs are ids) and a line saying where it came from."""

    model: Transformer
    tokenizer: Any
    source: str
    _vocab: list[str] | None = field(default=None, repr=False)

    def vocab(self) -> list[str] | None:
        """Every token of the vocabulary as text (``vocabulary``), worked out once per subject."""
        if self._vocab is None:
            self._vocab = vocabulary(self.tokenizer, self.model.config.vocab_size) or []
        return self._vocab or None


def preset_subject(name: str, seed: int, overrides: dict[str, Any]) -> Subject:
    """A preset's model built with ``torch.manual_seed(seed)``; its task's tokenizer if it has one."""
    from ..nn.config import preset
    from ..nn.memory import check_memory
    from ..tasks import get_task

    task = get_task(PRESET_TASKS[name]) if name in PRESET_TASKS else None
    config = preset(name, **{**(task.config_overrides() if task else {}), **overrides})
    check_memory(config, 1, training=False, what=f"tracing preset {name}", force_flag=False)
    torch.manual_seed(seed)
    changed = "".join(f", {k}={v}" for k, v in overrides.items())
    return Subject(
        Transformer(config).eval(), task.tokenizer if task else None, f"preset {name} (seed {seed}{changed})"
    )


def model_subject(path: str, allow_nonfinite: bool = False) -> Subject:
    """A trained or imported model with its stored tokenizer (anything ``blocklab.load`` reads)."""
    from ..weights.load import load

    loaded = load(path, allow_nonfinite=allow_nonfinite)
    return Subject(loaded.model, loaded.tokenizer, loaded.source.describe())


def vocabulary(tokenizer: Any, size: int) -> list[str] | None:
    """Every token of the model's vocabulary as the text it stands for (GPT-2's ``Ġcat`` is ``" cat"``,
    as ``to_str_tokens``), or None when the tokenizer cannot name them all."""
    try:
        return list(tokenizer.str_tokens(list(range(size)))) if tokenizer is not None else None
    except (ValueError, TypeError, AttributeError):
        return None


def target_id(tokenizer: Any, token: str, vocab_size: int) -> int:
    """The id of ``--target``: a token of the vocabulary, or an id when there is no tokenizer; either
    way an id the model's vocabulary has (0..vocab_size-1)."""
    table = getattr(tokenizer, "token_to_id", None)
    found = (
        table.get(token)
        if isinstance(table, dict)
        else (tokenizer.token_id(token) if hasattr(tokenizer, "token_id") else None)
    )
    if found is None and tokenizer is None and token.isdigit():
        found = int(token)
    if found is not None:
        if not 0 <= int(found) < vocab_size:
            raise ValueError(f"--target {token!r} is id {found}, out of range: the model's vocabulary has "
                             f"ids 0..{vocab_size - 1}")
        return int(found)
    if tokenizer is not None:  # the token as text (" cat"), when it is one token
        try:
            ids = tokenizer.encode(token)
        except ValueError:  # not in a vocabulary tokenizer's words
            ids = []
        ids = [i for i in ids if tokenizer.str_tokens([i])[0] in token]  # without the special tokens it adds
        if len(ids) == 1 and 0 <= int(ids[0]) < vocab_size:
            return int(ids[0])
    raise ValueError(
        f"--target {token!r} is not a token of the vocabulary"
        + (f"; {tokenizer.describe_vocab()}" if hasattr(tokenizer, "describe_vocab") else "")
    )


def collect_for_args(args: argparse.Namespace, overrides: dict[str, Any]) -> Trace:
    """The model and input the flags name, traced on ``--device`` in ``--dtype``."""
    from ..device import resolve_compute

    compute = resolve_compute(args.device, args.dtype)
    if args.model:
        if overrides:
            raise ValueError(f"config flags ({', '.join(overrides)}) apply to --preset, not to --model")
        subject = model_subject(args.model, args.allow_nonfinite)
    else:
        subject = preset_subject(args.preset, args.seed, overrides)
    subject.model.to(compute.device)
    with compute.autocast():
        return trace_subject(subject, args.input, args.tokens, args.target, args.position, args.stages)


def input_ids(subject: Subject, text: str | None, tokens: str | None) -> list[int]:
    """The input as ids: ``text`` through the subject's tokenizer, or ``tokens`` ("1,2,3"); each id checked
    against the vocabulary."""
    tok = subject.tokenizer
    if (text is None) == (tokens is None):
        raise ValueError("give the input as text with --input or as ids with --tokens (one of them)")
    if text is not None and tok is None:
        raise ValueError(f"{subject.source} has no tokenizer: give token ids with --tokens 1,2,3")
    ids = tok.encode(text) if text is not None else parse_token_ids(tokens)
    V = subject.model.config.vocab_size
    bad = [i for i in ids if not 0 <= i < V]
    if bad:
        raise ValueError(f"token id {bad[0]} is out of range: the model's vocabulary has ids 0..{V - 1}")
    return ids


def trace_subject(subject: Subject, text: str | None, tokens: str | None, target: str | None = None,
                  position: int | None = None, stages: list[str] | None = None) -> Trace:
    """``collect_trace`` of one input given as ``blocklab trace`` takes it (--input or --tokens, --target,
    --position, --stages): the command and ``blocklab explore`` share it, so they agree number for number."""
    tok = subject.tokenizer
    ids = input_ids(subject, text, tokens)
    labels = tok.str_tokens(ids) if tok is not None else [str(i) for i in ids]  # as text, not vocab spelling
    aim = target_id(tok, target, subject.model.config.vocab_size) if target is not None else None
    return collect_trace(
        subject.model,
        ids,
        labels,
        position=position,
        target=aim,
        target_token=target,
        vocab=subject.vocab(),
        names=stages,
        source=subject.source,
        text=text,
    )


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
        render_text(trace, console, decimals=args.decimals, max_features=args.max_features)
    say_written(args.json)
    if args.html:
        from ..inspect.trace.html import render_html

        write_output_file(args.html, render_html(trace, args.decimals).encode(), flag="--html")
        say_written(args.html, to_stderr=args.json == "-")
    return 0
