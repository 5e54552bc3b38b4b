"""The ``blocklab`` command. Thin: it parses arguments, builds configs and calls the library.

Every user mistake (bad flag value, invalid config, missing file, ...) prints one line
``blocklab: error: ...`` to stderr and exits with status 2; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any, Callable, Sequence

from .config import FIELDS, PRESET_NOTES, PRESETS, PUBLISHED_TOTALS, ModelConfig, preset

EXIT_USAGE = 2


class UsageError(Exception):
    """A mistake in what the user asked for: reported in one line, exit status 2."""


def parse_bool(text: str) -> bool:
    """'true'/'false' (also yes/no, 1/0, on/off) -> bool."""
    value = text.strip().lower()
    if value in ("true", "yes", "1", "on"):
        return True
    if value in ("false", "no", "0", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not true or false")


def _optional_bool(text: str) -> bool | None:
    return None if text.strip().lower() == "auto" else parse_bool(text)


def _int_or_ratio(text: str) -> int | str:
    return int(text) if text.strip().isdigit() else text


_FIELD_TYPES: dict[str, Callable[[str], Any]] = {
    "d_ff": _int_or_ratio,
    "final_norm": _optional_bool,
}


def add_config_flags(parser: argparse.ArgumentParser, with_preset: bool = True) -> None:
    """``--preset NAME`` plus one flag per ModelConfig field (``--d-model`` or ``--d_model``)."""
    group = parser.add_argument_group("model config (ModelConfig fields; override the preset)")
    if with_preset:
        group.add_argument("--preset", default="listops-seed", help=f"one of: {', '.join(PRESETS)}")
    for f in dataclasses.fields(ModelConfig):
        default = f.default
        kind = _FIELD_TYPES.get(f.name) or (parse_bool if isinstance(default, bool) else type(default))
        flags = [f"--{f.name.replace('_', '-')}"] + ([f"--{f.name}"] if "_" in f.name else [])
        metavar = "true|false" if kind is parse_bool else ("true|false|auto" if f.name == "final_norm" else None)
        group.add_argument(*flags, dest=f.name, type=kind, default=None, metavar=metavar,
                           help=f"default: the preset's, else {default!r}")


def config_from_args(args: argparse.Namespace, **task_overrides: Any) -> ModelConfig:
    """The preset, then the task's fields, then the user's flags: later wins."""
    overrides = {name: getattr(args, name) for name in FIELDS if getattr(args, name, None) is not None}
    return preset(getattr(args, "preset", "listops-seed"), **{**task_overrides, **overrides})


# ---- blocklab params ---------------------------------------------------------------------------


def _add_params(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("params", help="analytic parameter count with a per-component breakdown")
    add_config_flags(p)
    p.add_argument("--json", action="store_true", help='print {"total": int, "components": {...}}')
    p.set_defaults(func=cmd_params)


def cmd_params(args: argparse.Namespace) -> int:
    """Print the parameter table (or JSON) for a preset plus overrides."""
    from .params import count_parameters

    config = config_from_args(args)
    count = count_parameters(config)
    if args.json:
        print(json.dumps(count.to_dict()))
        return 0
    from rich.console import Console
    from rich.table import Table

    c = config
    table = Table(title=f"parameters: {args.preset} (d_model {c.d_model}, {c.n_layers} layers, "
                        f"{c.n_heads} heads, d_ff {c.d_ff}, vocab {c.vocab_size})")
    table.add_column("component")
    table.add_column("parameters", justify="right")
    table.add_column("share", justify="right")
    table.add_column("how", style="dim")
    formulas = _formulas(c)
    for name, n in count.components.items():
        table.add_row(name, f"{n:,}", f"{100 * n / count.total:.1f}%", formulas.get(name, ""))
    table.add_section()
    table.add_row("total", f"{count.total:,}", "100%", "")
    console = Console()
    console.print(table)
    per_layer = ", ".join(f"{k} {v:,}" for k, v in count.per_layer.items())
    console.print(f"per block: {per_layer}")
    if args.preset in PUBLISHED_TOTALS and config == preset(args.preset):
        published = PUBLISHED_TOTALS[args.preset]
        verdict = "equal" if published == count.total else f"differs by {count.total - published:+,}"
        console.print(f"published total: {published:,} ({verdict})")
    if args.preset in PRESET_NOTES:
        console.print(f"note: {PRESET_NOTES[args.preset]}")
    return 0


def _formulas(c: ModelConfig) -> dict[str, str]:
    """One-line 'how it is counted' for each component of the table."""
    from .activations import is_gated

    d, L = c.d_model, c.n_layers
    b = " + 4d" if c.bias else ""
    n_in = "3" if is_gated(c.activation) else "2"
    ln = "2d" if c.bias and c.norm != "rms" else "d"
    return {
        "embed": f"vocab {c.vocab_size} x d {d}",
        "pos": f"max_seq_len {c.max_seq_len} x d {d}",
        "token_type": f"{c.type_vocab_size} x d {d}",
        "blocks.attn": f"L {L} x (4d^2{b})",
        "blocks.ffn": f"L {L} x ({n_in} d d_ff{' + biases' if c.bias else ''}), d_ff {c.d_ff}",
        "blocks.ln1": f"L {L} x {ln}",
        "blocks.ln2": f"L {L} x {ln}",
        "ln_f": ln,
        "head": "tied to embed (shared)" if c.tie_embeddings else f"d {d} x vocab {c.vocab_size}",
    }


# ---- entry point -------------------------------------------------------------------------------

COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [_add_params]


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one subcommand per feature."""
    parser = argparse.ArgumentParser(prog="blocklab", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; user errors print one line to stderr and return 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (UsageError, ValueError, FileNotFoundError, IsADirectoryError, PermissionError) as error:
        if args.debug:
            raise
        message = str(error) if not isinstance(error, OSError) or not error.filename else (
            f"{error.strerror}: {error.filename}")
        print(f"blocklab: error: {message}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("blocklab: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
