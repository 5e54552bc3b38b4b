"""``python -m blocklab`` (and ``torchrun -m blocklab``) runs the CLI.

May import: cli.
"""

import sys

from .cli import main

sys.exit(main())
