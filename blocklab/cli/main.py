"""The ``blocklab`` command: the parser, the command table and the entry point.

Thin: each command module registers its subcommands and turns arguments into library calls.
Every user mistake (bad flag value, invalid config, missing file, ...) prints one line
``blocklab: error: ...`` to stderr and exits with status 2; ``--debug`` (anywhere on the line)
shows the traceback. The statuses and messages are defined in errors.py.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Callable, Sequence

from ..errors import EXIT_USAGE, describe_error, show_warning, split_debug_flag
from . import bench, lab, model, trace, training, weights

# Each group's ``add_commands(sub)``, in the order ``blocklab --help`` lists them.
COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    model.add_commands,  # params
    weights.add_commands,  # import, embed, generate
    lab.add_commands,  # diagnose, ablate, claims
    trace.add_commands,  # trace
    training.add_commands,  # train, eval, predict
    bench.add_commands,  # bench
]


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one subcommand per feature."""
    parser = argparse.ArgumentParser(
        prog="blocklab",
        description="The transformer block you can see, train, ablate and load real weights into.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks (allowed anywhere on the line)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; a failure prints one line to stderr and returns its status (errors.py)."""
    argv, debug = split_debug_flag(list(sys.argv[1:] if argv is None else argv))
    warnings.showwarning = show_warning  # a BlocklabWarning is one line "blocklab: warning: ..."
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # stdout closed early (| head): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # silences the flush at exit
        return 0
    except Exception as error:
        if debug:
            raise
        message, status = describe_error(error)
    except KeyboardInterrupt as error:
        message, status = describe_error(error)
    print(f"blocklab: {'error: ' if status == EXIT_USAGE else ''}{message}", file=sys.stderr)
    return status
