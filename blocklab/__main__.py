"""``python -m blocklab`` (and ``torchrun -m blocklab``) runs the CLI; ``run`` is also the ``blocklab``
console script. Ctrl-C at any moment of start-up is one line and status 130, like one at any later
moment: this module's first statement takes over SIGINT (before it, only the interpreter's own
start-up and the console script's ``import blocklab``, a few milliseconds, remain), and the CLI (torch
with it, a second or more) is imported only inside ``run``, which answers Ctrl-C itself.

May import: cli, errors.
"""

import _signal  # first, before anything slower: the built-in half of ``signal``, already loaded
import os
import sys


def _interrupted_while_starting(signum: int, frame: object) -> None:
    os.write(2, b"blocklab: interrupted while starting\n")  # nothing started: nothing to clean up
    os._exit(130)  # errors.EXIT_INTERRUPTED, not yet imported


# Only where Python's own handler is set: a SIGINT ignored (a background job, a grid worker) stays ignored.
if _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
    _signal.signal(_signal.SIGINT, _interrupted_while_starting)

from .errors import EXIT_INTERRUPTED, INTERRUPTED_WHILE_STARTING  # noqa: E402 (after SIGINT is ours)


def run() -> int:
    """The ``blocklab`` command: import the CLI, then run it on ``sys.argv``."""
    try:
        if _signal.getsignal(_signal.SIGINT) is _interrupted_while_starting:  # KeyboardInterrupt again
            _signal.signal(_signal.SIGINT, _signal.default_int_handler)
        from .cli import main
    except KeyboardInterrupt:
        print(f"blocklab: {INTERRUPTED_WHILE_STARTING}", file=sys.stderr)
        return EXIT_INTERRUPTED
    return main()


if __name__ == "__main__":
    sys.exit(run())
