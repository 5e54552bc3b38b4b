"""The ``blocklab`` command's parser, light enough to answer ``--help`` and ``--version`` before the
library (torch) loads: one-line errors with "did you mean", rich help, and the one-line summary of
every command (``COMMAND_SUMMARIES``: ``blocklab --help`` lists them without importing the commands).

May import: errors.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

from rich_argparse import RawDescriptionRichHelpFormatter, RichHelpFormatter

from ..errors import UsageError

# Each command's line in ``blocklab --help``, in the order the help lists them (cli/main.py's groups
# register them in this order).
COMMAND_SUMMARIES: dict[str, str] = {
    "train": "train a model on a built-in task; writes a run folder with a report",
    "eval": "held-out loss and accuracy of a trained model",
    "predict": 'a trained model\'s answer to a query, e.g. --input "Max ( 3 , 9 , 4 )"',
    "trace": "walk one input through the model and print every stage's numbers",
    "explain": "type a vector into a norm, an activation or the FFN and see each step's numbers",
    "explore": "a live web page over one or more models: trace as you type, predict, ablate",
    "diagnose": "gradient flow and activation statistics of a model at initialization",
    "ablate": "train a grid of configs x seeds; summary table, summary.json, report.html",
    "claims": "test what the textbooks say about the block; table + HTML report",
    "import": "write a Hugging Face model folder (or any model) as one blocklab checkpoint",
    "embed": "sentence embeddings (mean pooling + L2 norm) and cosine similarities",
    "generate": "continue prompts with a causal model (greedy or sampled, KV cache, streamed)",
    "params": "analytic parameter count with a per-component breakdown",
    "bench": "blocklab's block vs PyTorch, transformers and x-transformers blocks: tokens/s, saved "
             "activations, peak memory, FLOP rate, sweeps",
}


# ---- the parser: one-line errors, "did you mean", readable help ------------------------------------


class HelpFormatter(RichHelpFormatter):
    """rich-argparse's help, with help texts taken literally (no console markup in them)."""

    help_markup = False
    text_markup = False


class RawDescriptionHelpFormatter(RawDescriptionRichHelpFormatter):
    """``HelpFormatter`` keeping the description's and epilog's line breaks (for examples)."""

    help_markup = False
    text_markup = False


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose mistakes are one line (``UsageError``, exit 2) ending in a hint, with
    "did you mean" for a mistyped flag, command or choice. Flags are never abbreviated: ``--step``
    is not ``--steps`` (an abbreviation would change meaning the day a longer flag is added)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        """Raise the message as one line naming the flag (``--steps: ...``), with where help is."""
        message = re.sub(r"^argument COMMAND: ", "", message)
        if message == "the following arguments are required: COMMAND":
            message = f"no command given; the commands are {', '.join(self.commands())}"
        message = re.sub(r"^argument (-[^/:\s]+)(/-[^/:\s]+)*: ", r"\1: ", message)
        raise UsageError(f"{message}; see '{self.prog} --help'")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        """Unknown choices (and commands) get the nearest known one."""
        if action.choices is None or value in action.choices:
            return
        known = [str(c) for c in action.choices]
        what = "command" if isinstance(action, argparse._SubParsersAction) else "value"
        raise argparse.ArgumentError(action, f"unknown {what} {value!r}{did_you_mean(str(value), known)} "
                                             f"(choose from {', '.join(known)})")

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        """Parse with ``--d_model`` read as ``--d-model``: every flag may be spelled with ``_`` or ``-``."""
        return super().parse_known_args(None if args is None else dashed(args), namespace)

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        """Parse; an unknown argument is refused naming the command it was given to."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = self.command_parser(getattr(parsed, "command", None)) or self
            command.refuse_extra(extras)
        return parsed

    def command_parser(self, name: str | None) -> Parser | None:
        """The subcommand parser called ``name`` (None when there is none)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction) and name in action.choices:
                return action.choices[name]
        return None

    def commands(self) -> list[str]:
        """The names of this parser's subcommands."""
        subparsers = [a for a in self._actions if isinstance(a, argparse._SubParsersAction)]
        return [name for action in subparsers for name in action.choices]

    def option_strings(self) -> list[str]:
        """Every flag this parser knows."""
        return [s for action in self._actions for s in action.option_strings]

    def refuse_extra(self, extras: list[str]) -> NoReturn:
        """Refuse the first unknown flag (or stray value), with the nearest known flag."""
        flag = next((e for e in extras if e.startswith("-") and e != "-"), None)
        if flag is None:
            self.error(f"unexpected argument {extras[0]!r}")
        name = flag.split("=", 1)[0]
        self.error(f"unknown flag {name}{did_you_mean(name, self.option_strings())}")


def dashed(argv: Sequence[str]) -> list[str]:
    """``--d_model=8`` -> ``--d-model=8`` (flags only, up to a ``--`` separator; values untouched)."""
    out, flags = [], True
    for arg in argv:
        if arg == "--":
            flags = False
        if flags and arg.startswith("--") and "_" in arg.split("=", 1)[0]:
            name, sep, value = arg.partition("=")
            arg = name.replace("_", "-") + sep + value
        out.append(arg)
    return out


def did_you_mean(text: str, known: Iterable[str]) -> str:
    """``"; did you mean --steps?"`` for the nearest of ``known``, or ``""``."""
    close = difflib.get_close_matches(text, list(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def add_command(sub: argparse._SubParsersAction, name: str, description: str) -> Parser:
    """A subcommand: ``description`` is its own help's text; its line in ``blocklab --help`` is
    ``COMMAND_SUMMARIES[name]`` (kept there so that the top-level help needs no command module)."""
    if name not in COMMAND_SUMMARIES:
        raise ValueError(f"command {name!r} has no line in blocklab/cli/parser.py's COMMAND_SUMMARIES: add "
                         "it there (blocklab --help lists the commands without importing them)")
    return sub.add_parser(name, help=COMMAND_SUMMARIES[name], description=description)
