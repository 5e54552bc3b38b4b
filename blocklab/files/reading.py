"""Reading a file blocklab did not necessarily write: never a pipe, a device or a folder, never more
than a cap.

Every file is opened non-blocking and checked to be a regular file before a byte is read (a named pipe
never holds a command, a device is never read to its end), and its size is capped (``what`` it should
be names the cap in the refusal). Links are followed when reading: they harm nothing there (a Hugging
Face cache folder is made of them). Every refusal is a one-line ValueError naming the file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .atomic import kind_of

_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

MB = 1024 * 1024
JSON_LIMIT = 64 * MB  # a JSON file blocklab reads: configs, markers, state, results (a few KB each)
TEXT_LIMIT = 256 * MB  # a tokenizer's files (the largest real tokenizer.json are tens of MB)


def open_to_read(path: str | Path, what: str, limit: int | None = None) -> int:
    """A descriptor of ``path`` for reading, checked to be a regular file (of at most ``limit`` bytes);
    ValueError naming the file and ``what`` it should be (FileNotFoundError when missing). Opened
    non-blocking: a named pipe is refused without waiting for a writer."""
    try:
        fd = os.open(path, os.O_RDONLY | _NONBLOCK | _CLOEXEC)
    except IsADirectoryError:
        raise ValueError(f"{path} is a folder, not a file ({what})") from None
    info = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(info.st_mode):
        problem = f"{path} is {kind_of(info.st_mode)}, not a regular file ({what})"
    elif limit is not None and info.st_size > limit:
        problem = (f"{path} is {info.st_size:,} bytes, more than the {limit:,} a file of this kind ({what}) "
                   "may have; is it the right file?")
    if problem:
        os.close(fd)
        raise ValueError(problem)
    return fd


def read_regular_bytes(path: str | Path, what: str, limit: int = JSON_LIMIT) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes (``open_to_read``); never more
    than ``limit`` bytes are read, even from a file that grows meanwhile."""
    fd = open_to_read(path, what, limit)
    try:
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(limit + 1 - size, 16 * MB))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise ValueError(f"{path} is more than the {limit:,} bytes a file of this kind ({what}) may have")
    return b"".join(chunks)


def read_text(path: str | Path, what: str, limit: int = TEXT_LIMIT) -> str:
    """``read_regular_bytes`` decoded as UTF-8; ValueError naming the file when it is not UTF-8."""
    data = read_regular_bytes(path, what, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start}); expected {what}") \
            from None
