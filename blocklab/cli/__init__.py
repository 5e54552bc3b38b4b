"""The ``blocklab`` command-line interface: ``main`` is the console script's entry point.

cli/main.py      the parser, the command table, error handling
cli/args.py      every flag builder, and the parsers that know the configs
cli/values.py    the plain value parsers (booleans, bounded numbers, accuracies, paths, names)
cli/defaults.py  what the commands use when nothing is named (train's run folder, the model trace and
                 explore open: the README's run, else a random preset)
cli/<group>.py   one module per command group (model, weights, lab, trace, training, bench)

May import: any.
"""

from .main import build_parser, main

__all__ = ["build_parser", "main"]
