"""``blocklab explain``: a vector a learner types, through a norm, an activation or the FFN, each step as
numbers (inspect/trace/by_hand.py; printed as the walk prints its steps).

    blocklab explain norm 4,2,0,-2                      mu, var, sqrt(var + eps), z_hat, gamma, beta
    blocklab explain activation 4,2,0,-2                every activation kind, element by element
    blocklab explain ffn 1,2,...,16 --preset tutorial   W1 x + b1, the activation, W2 h + b2
"""

from __future__ import annotations

import argparse

import torch

from ..nn.activation_kinds import ACTIVATION_KINDS
from ..nn.config import DEFAULT_EPS
from ..nn.norm_kinds import NORM_KINDS
from ..nn.presets import PRESETS
from .args import (
    add_command,
    add_json_flag,
    add_model_flag,
    at_least,
    emit_json,
    one_of,
    parse_float,
    parse_int,
    parse_name,
    parse_names,
    parse_path,
    parse_seed,
    say_written,
)
from .trace import MIN_WIDTH
from .values import parse_numbers

FFN_PRESET = "tutorial"
# the flags each kind of explanation reads (argparse dest names); any other one given is refused
FLAGS = {
    "norm": ("norm", "eps", "gamma", "beta"),
    "activation": ("activation",),
    "ffn": ("activation", "preset", "seed", "model", "weights", "block"),
}
EXAMPLES = """examples:
  blocklab explain norm 4,2,0,-2                         LayerNorm step by step (mu 1, var 5, ...)
  blocklab explain norm 4,2,0,-2 --norm rms --gamma 1,2,1,2
  blocklab explain activation 4,2,0,-2                   every activation, element by element
  blocklab explain activation 4,2,0,-2 --activation gelu,gelu_tanh
  blocklab explain ffn 1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0 --weights tutorial.json
A vector that starts with a minus goes after --: blocklab explain norm -- -1,0,1"""


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``explain``."""
    p = add_command(
        sub, "explain",
        "Type a vector and see each step a norm, an activation or the feed-forward network computes from "
        "it, as numbers (the tutorials' [4, 2, 0, -2] through LayerNorm). The FFN is a model's: a "
        f"preset's (default {FFN_PRESET}, weights drawn from --seed) or --model's, weights from --weights.",
    )
    p.epilog = EXAMPLES
    p.add_argument("what", choices=list(FLAGS), metavar="WHAT", help=f"one of: {', '.join(FLAGS)}")
    p.add_argument("vector", type=parse_numbers, metavar="VECTOR",
                   help='the numbers, e.g. 4,2,0,-2 or "[4, 2, 0, -2]"')
    p.add_argument("--norm", choices=list(NORM_KINDS), metavar="NAME",
                   help=f"norm: the kind, one of {', '.join(NORM_KINDS)} (default: standard, LayerNorm)")
    p.add_argument("--eps", type=parse_float, metavar="X", help=f"norm: its eps (default: {DEFAULT_EPS:g})")
    p.add_argument("--gamma", type=parse_numbers, metavar="VECTOR",
                   help="norm: gamma, one number per element (default: ones)")
    p.add_argument("--beta", type=parse_numbers, metavar="VECTOR",
                   help="norm: beta, one number per element (default: zeros; RMSNorm has none)")
    p.add_argument("--activation", type=parse_names, metavar="NAME",
                   help="activation: these kinds, comma-separated (default: all: "
                        f"{', '.join(ACTIVATION_KINDS)}); ffn: the preset's activation replaced by this one")
    p.add_argument("--preset", type=parse_name, metavar="NAME",
                   help=f"ffn: the preset, {one_of(PRESETS, FFN_PRESET)}")
    p.add_argument("--seed", type=parse_seed, metavar="N",
                   help="ffn: the seed of the preset's weights (default: 0)")
    add_model_flag(p, required=False, what="ffn: this model's FFN instead of a preset's")
    p.add_argument("--weights", type=parse_path, metavar="FILE",
                   help="ffn: the model's weights from this .json or .safetensors file named by stage "
                        "(blocks.0.ffn.W1, ...; blocklab trace --write-weights writes one)")
    p.add_argument("--block", type=parse_int, metavar="N", help="ffn: the block whose FFN (default: 0)")
    p.add_argument("--decimals", type=at_least(0, 12), default=4, metavar="N",
                   help="digits after the decimal point, 0 to 12 (default: 4)")
    p.add_argument("--width", type=at_least(MIN_WIDTH), metavar="N",
                   help=f"width of the grids, >= {MIN_WIDTH} (default: the terminal's, else 160)")
    add_json_flag(p, "the steps (title, formula, rows, columns, values)")
    p.set_defaults(func=cmd_explain)


def refuse_other_flags(args: argparse.Namespace) -> None:
    """A flag the explanation does not read is refused, naming the explanations that do."""
    for dest in sorted({d for dests in FLAGS.values() for d in dests} - set(FLAGS[args.what])):
        if getattr(args, dest) not in (None, False):
            readers = " and ".join(f"'explain {w}'" for w, dests in FLAGS.items() if dest in dests)
            raise ValueError(f"--{dest} applies to {readers}, not to 'explain {args.what}'")


def ffn_steps(args: argparse.Namespace, x: torch.Tensor) -> tuple[str, list[str], list]:
    """The FFN of the model the flags name: its description, notes and steps."""
    from ..inspect.trace.by_hand import ffn_by_hand
    from ..inspect.trace.subject import preset_subject
    from .trace import model_subject, set_file_weights

    names = args.activation or []
    if len(names) > 1:
        raise ValueError(f"--activation names one activation for 'explain ffn', not {len(names)}")
    overrides = {"activation": names[0]} if names else {}
    if args.model:
        if overrides:
            raise ValueError("--activation applies to a preset, not to --model (its FFN has its own)")
        subject = model_subject(args.model, args.allow_nonfinite)
    else:
        subject = preset_subject(args.preset or FFN_PRESET, args.seed or 0, overrides)
    if args.weights:
        set_file_weights(subject, args.weights)
    blocks, block = subject.model.blocks, 0 if args.block is None else args.block
    if not 0 <= block < len(blocks):
        raise ValueError(f"--block {block}: the model has {len(blocks)} blocks, 0 to {len(blocks) - 1}")
    ffn = blocks[block].ffn
    shape = f"{ffn.activation}, d_model {ffn.d_model}, d_ff {ffn.d_ff}"
    where = f"block {block}: " if len(blocks) > 1 else ""
    return f"{subject.source}, block {block}'s FFN ({shape})", subject.notes, ffn_by_hand(x, ffn, where)


def explain_steps(args: argparse.Namespace) -> tuple[str, list[str], list]:
    """What is explained (one line), its notes and its steps."""
    from ..inspect.trace.by_hand import activations_by_hand, norm_by_hand

    x = torch.tensor(args.vector, dtype=torch.float64)
    if args.what == "ffn":
        return ffn_steps(args, x)
    if args.what == "activation":
        return f"activations of a vector of {x.numel()}", [], activations_by_hand(x, args.activation)
    norm, eps = args.norm or "standard", DEFAULT_EPS if args.eps is None else args.eps
    if not eps > 0:
        raise ValueError(f"--eps {eps:g} must be > 0")
    gamma, beta = (None if v is None else torch.tensor(v, dtype=torch.float64)
                   for v in (args.gamma, args.beta))
    return (f"{NORM_KINDS[norm].label} (norm {norm}), eps {eps:g}, d = {x.numel()}", [],
            norm_by_hand(x, norm, eps, gamma, beta))


def cmd_explain(args: argparse.Namespace) -> int:
    """Print the steps of the explanation the arguments name."""
    from rich.console import Console
    from rich.text import Text

    from ..inspect.trace.walk import render_steps, step_to_dict

    refuse_other_flags(args)
    torch.set_num_threads(1)  # one vector: a second thread costs more than it brings
    what, notes, steps = explain_steps(args)
    data = {"what": args.what, "subject": what, "notes": notes, "steps": [step_to_dict(s) for s in steps]}
    if emit_json(args.json, data):
        return 0
    console = Console(highlight=False)
    console.width = args.width or (console.width if console.is_terminal else 160)
    console.print(Text.assemble((f"blocklab explain {args.what}", "bold"), "  ", what))
    for note in notes:
        console.print(f"note: {note}", style="yellow", markup=False)
    console.print()
    render_steps(steps, console, args.decimals, console.width, corner="")
    say_written(args.json)
    return 0
