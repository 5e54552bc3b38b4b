"""How the ``blocklab`` command reports a failure: one line on stderr and an exit status.

    2    a user mistake: a bad flag value, an invalid config, a missing or unreadable file, input
         outside the vocabulary, a corrupt checkpoint, a locked run folder, a NaN stop (the
         message says what to change). argparse's own errors also exit 2.
    1    something failed that is not the user's input: out of memory, or a bug in blocklab
         (an "internal error" line; ``--debug`` shows the traceback).
    130  interrupted (Ctrl-C).

Never a traceback unless ``--debug`` is given (anywhere on the command line).

May import: nothing.
"""

from __future__ import annotations

import errno
from collections.abc import Iterable

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

_OUT_OF_MEMORY = ("can't allocate memory", "not enough memory", "out of memory")


class UsageError(Exception):
    """A mistake in what the user asked for: reported in one line, exit status 2."""


def names(items: Iterable[object]) -> str:
    """Names from the user's input for a one-line message: ``a, b`` as they are when they are plain
    identifiers, quoted (``'a b'``, ``'\\n'``, ``3``) when not, sorted."""
    shown = [n if isinstance(n, str) and n.isidentifier() else repr(n) for n in items]
    return ", ".join(sorted(shown))


class BlocklabWarning(UserWarning):
    """Something the user asked for works but likely not as meant; the CLI prints it as one line
    ``blocklab: warning: ...`` on stderr."""


def one_line(text: str) -> str:
    """Collapse a (possibly multi-line) message into one line."""
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def printable(text: str) -> str:
    """``text`` with each character a terminal would not show as itself (a newline, U+009B, U+2028, a
    bidirectional override) written as its escape, as ``repr`` writes it: a message stays one line
    and says what the user typed."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def _os_message(error: OSError) -> str:
    reason = error.strerror or one_line(str(error)) or type(error).__name__
    if error.errno == errno.ENOSPC:
        reason += " (free some disk space or choose another --out)"
    names = [printable(str(n)) for n in (error.filename, error.filename2) if n is not None]
    return f"{' -> '.join(names)}: {reason}" if names else reason


INTERRUPTED_WHILE_STARTING = "interrupted while starting"  # Ctrl-C before a command began (E8)


def describe_error(error: BaseException) -> tuple[str, int]:
    """(the one-line message, the exit status) for an exception that ended a command."""
    if isinstance(error, KeyboardInterrupt):  # train's TrainingInterrupted says where and how to resume
        return one_line(str(error)) or "interrupted", EXIT_INTERRUPTED
    if isinstance(error, MemoryError) or (
        isinstance(error, RuntimeError) and any(s in str(error).lower() for s in _OUT_OF_MEMORY)
    ):
        return (f"out of memory ({one_line(str(error)) or 'MemoryError'}); use a smaller config or batch "
                "(the memory guard estimates what a run needs; --force skips it)"), EXIT_FAILURE
    if isinstance(error, UnicodeDecodeError):
        return (f"cannot read the input as UTF-8 text ({error.reason} at byte {error.start}); "
                "is it a text file?"), EXIT_USAGE
    if isinstance(error, OSError):
        return _os_message(error), EXIT_USAGE
    if isinstance(error, (UsageError, ValueError)):
        return one_line(str(error)) or type(error).__name__, EXIT_USAGE
    detail = one_line(str(error))
    return (f"internal error: {type(error).__name__}{': ' + detail if detail else ''} "
            "(a bug in blocklab; rerun with --debug for the traceback)"), EXIT_FAILURE


def split_debug_flag(argv: list[str]) -> tuple[list[str], bool]:
    """Remove ``--debug`` from anywhere before a ``--`` separator; return (argv, whether it was there)."""
    end = argv.index("--") if "--" in argv else len(argv)
    debug = "--debug" in argv[:end]
    return [a for i, a in enumerate(argv) if not (i < end and a == "--debug")], debug
