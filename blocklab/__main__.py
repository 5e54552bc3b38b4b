"""``python -m blocklab`` (and ``torchrun -m blocklab``) runs the CLI; ``run`` is also the ``blocklab``
console script. It imports the CLI (torch with it, a second or more) only once it can answer Ctrl-C:
an interrupt during start-up is one line and status 130, like one at any later moment.

May import: cli, errors.
"""

import sys

from .errors import EXIT_INTERRUPTED, INTERRUPTED_WHILE_STARTING


def run() -> int:
    """The ``blocklab`` command: import the CLI, then run it on ``sys.argv``."""
    try:
        from .cli import main
    except KeyboardInterrupt:
        print(f"blocklab: {INTERRUPTED_WHILE_STARTING}", file=sys.stderr)
        return EXIT_INTERRUPTED
    return main()


if __name__ == "__main__":
    sys.exit(run())
