"""Writing a file so that a crash leaves the old file or the new one, never half of either, and never
through a symbolic link.

A file is written beside its final name, fsynced and renamed over it, under a descriptor of its folder.
A symbolic link is never followed: the file itself is replaced or opened with ``O_NOFOLLOW`` semantics
(an lstat in its folder), and with ``root`` (the folder a command owns) every folder from ``root`` down
to the file is opened with ``O_NOFOLLOW`` too, so a link planted anywhere inside a run folder is refused,
naming the link, before a byte is written. An existing path that is not a regular file (a folder, a
pipe, a device) is refused, but for an output the user named (``stream=True``: ``--json /dev/stdout``,
a named pipe, ``>(jq .)``), which is written into as it is: such a path is opened without creating or
truncating anything, and a regular file found there after all is refused.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def kind_of(mode: int) -> str:
    """``a folder``, ``a named pipe``, ... for a stat mode (the refusals say what was found)."""
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a device"),
             (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"))
    return next((what for test, what in kinds if test(mode)), "not a regular file")


def link_refusal(path: str | Path) -> ValueError:
    """The one-line refusal of a symbolic link found where blocklab writes, naming it and its target."""
    try:
        target = f" (to {os.readlink(path)})"
    except OSError:
        target = ""
    return ValueError(f"{path} is a symbolic link{target}; blocklab never writes through a link (it could "
                      "overwrite a file it was not asked to): remove the link or choose another path")


def _not_regular(path: str | Path, mode: int) -> ValueError:
    return ValueError(f"{path} is {kind_of(mode)}, not a regular file; blocklab writes only regular files "
                      "there: remove it or choose another path")


# ---- writing ------------------------------------------------------------------------------------------


def open_folder(folder: str | Path, root: str | Path | None = None, create: bool = True) -> int:
    """A descriptor of ``folder`` (created when missing, with ``create``). Below ``root`` no part of the
    path may be a symbolic link (ValueError naming it); ``root`` itself and the path above it are the
    caller's, links included (``runs`` may be a link to a bigger disk). Without ``root`` the whole
    folder path is the caller's."""
    folder = Path(folder)
    base = Path(root) if root is not None else folder
    parts = folder.relative_to(base).parts if root is not None else ()  # ValueError: not inside root
    if create:
        base.mkdir(parents=True, exist_ok=True)
    fd = os.open(base, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    where = base
    try:
        for part in parts:
            where = where / part
            try:
                inner = os.open(part, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, 0o777, dir_fd=fd)
                except FileExistsError:
                    pass  # made meanwhile: opened (and checked) below
                inner = os.open(part, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=fd)
            except OSError as error:
                if error.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                    mode = os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode
                    raise link_refusal(where) if stat.S_ISLNK(mode) else _not_regular_folder(where, mode) \
                        from None
                raise
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def _not_regular_folder(path: Path, mode: int) -> ValueError:
    return ValueError(f"{path} is {kind_of(mode)}, not a folder; blocklab needs a folder there")


def _lstat_in(fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _write_stream(path: Path, data: bytes) -> bool:
    """Write into ``path`` when it is (or a link names) a device or a pipe; False when it is not one."""
    try:
        mode = os.stat(path).st_mode  # follows links: /dev/stdout names the terminal or a pipe
    except (FileNotFoundError, NotADirectoryError):
        return False
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return False
    fd = os.open(path, os.O_WRONLY | os.O_NOCTTY | _CLOEXEC)  # no O_CREAT, no O_TRUNC: nothing made or cut
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):  # swapped for a regular file meanwhile: not a stream after all
            raise ValueError(f"{path} changed while it was opened; write the output again")
        _write_all(fd, data)
    finally:
        os.close(fd)
    return True


def atomic_write_bytes(path: str | Path, data: bytes, root: str | Path | None = None,
                       stream: bool = False) -> None:
    """Write ``data`` to ``path`` so a crash leaves either the old file or the new one, never half.

    The new file is written beside the old one, fsynced and renamed over it. Never through a symbolic
    link: a link at ``path`` (or, with ``root``, at any folder between ``root`` and ``path``) is refused
    naming it, as is anything there that is not a regular file; with ``stream`` (an output the user
    named), a device or a pipe is written into instead.
    """
    path = Path(path)
    if stream and _write_stream(path, data):
        return
    folder = open_folder(path.parent, root if root is not None else path.parent)
    try:
        found = _lstat_in(folder, path.name)
        if found is not None and stat.S_ISLNK(found.st_mode):
            raise link_refusal(path)
        if found is not None and not stat.S_ISREG(found.st_mode):
            raise _not_regular(path, found.st_mode)
        tmp = f".{path.name}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o666, dir_fd=folder)
        try:
            try:
                _write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path.name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=folder)
            except FileNotFoundError:
                pass
            raise
        os.fsync(folder)  # make the rename itself durable
    finally:
        os.close(folder)


def open_regular(path: str | Path, flags: int, root: str | Path | None = None) -> int:
    """``os.open`` of a regular file blocklab writes in place (a lock, an appended log): never through a
    symbolic link (with ``root``: none between it and the file either), never a pipe or device
    (opened non-blocking, so a pipe cannot hold the command); ValueError naming what was found."""
    path = Path(path)
    folder = open_folder(path.parent, root if root is not None else path.parent)
    try:
        try:
            fd = os.open(path.name, flags | _NOFOLLOW | _NONBLOCK | _CLOEXEC, 0o666, dir_fd=folder)
        except OSError as error:
            found = _lstat_in(folder, path.name)
            if found is not None and stat.S_ISLNK(found.st_mode):
                raise link_refusal(path) from None
            if found is not None and not stat.S_ISREG(found.st_mode):
                raise _not_regular(path, found.st_mode) from None
            raise error
    finally:
        os.close(folder)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _not_regular(path, mode)
    return fd


def fsync_dir(path: str | Path) -> None:
    """Flush a directory's entries (new names, renames) to disk."""
    dir_fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def refuse_links_below(root: str | Path, path: str | Path) -> None:
    """ValueError naming the first symbolic link (or non-folder) among the folders from ``root`` down
    to ``path`` (both included but ``root``), whichever of them exist: checked before a command that
    owns ``root`` plans to write at ``path``."""
    root, path = Path(root), Path(path)
    where = root
    for part in path.relative_to(root).parts:
        where = where / part
        try:
            mode = os.lstat(where).st_mode
        except FileNotFoundError:
            return
        if stat.S_ISLNK(mode):
            raise link_refusal(where)
        if not stat.S_ISDIR(mode):
            raise _not_regular_folder(where, mode)
