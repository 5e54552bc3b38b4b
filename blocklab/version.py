"""blocklab's version: the one place it is written (pyproject reads it from here).

May import: nothing.
"""

__version__ = "0.1.0"
