"""Writing a file so that a crash leaves the old file or the new one, never half of either."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so a crash leaves either the old file or the new one, never half.

    The new file is written beside the old one and renamed over it. Two kinds of path are not
    replaced, since replacing would destroy what they are: a path that is not a regular file
    (/dev/null, /dev/stdout, a named pipe) is written into as it is, and a symbolic link keeps
    pointing where it did while the file it names is replaced.
    """
    path = Path(path)
    if path.exists() and not path.is_file() and not path.is_dir():  # both follow symbolic links
        with open(path, "wb") as stream:  # a device or a pipe: nothing to keep whole
            stream.write(data)
        return
    if path.is_symlink():
        path = Path(os.path.realpath(path))  # raises nothing for a dangling link: it names a new file
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the usual mode
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)  # make the rename itself durable


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_dir(path: str | Path) -> None:
    """Flush a directory's entries (new names, renames) to disk."""
    dir_fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
