"""``python -m blocklab`` (and ``torchrun -m blocklab``) runs the CLI."""

import sys

from .cli import main

sys.exit(main())
