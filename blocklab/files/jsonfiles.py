"""Strict JSON files: what blocklab writes (non-finite numbers as null, by the one writer) and reads
back (by the one reader: a regular file, capped; NaN refused; nested at most ``MAX_JSON_DEPTH`` deep;
then the file's schema, a ``check`` returning what is wrong or None, before the caller sees the value)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .atomic import atomic_write_bytes
from .reading import JSON_LIMIT, read_regular_bytes

MAX_JSON_DEPTH = 64  # blocklab's files nest 4 deep, Hugging Face's tokenizer.json about 6

Check = Callable[[Any], "str | None"]  # a file's schema: what is wrong with a parsed value, or None


def json_safe(value: Any) -> Any:
    """``value`` with every NaN/Infinity replaced by None, so it serialises as strict JSON (null)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def json_bytes(data: Any) -> bytes:
    """Pretty, strict JSON (non-finite numbers as null) and a newline."""
    return (json.dumps(json_safe(data), indent=2, allow_nan=False) + "\n").encode()


def write_json(path: str | Path, data: Any, root: str | Path | None = None) -> None:
    """Atomically write pretty, strict JSON (``atomic_write_bytes``: never through a link)."""
    atomic_write_bytes(path, json_bytes(data), root=root)


def json_line(row: dict[str, Any]) -> str:
    """One metrics.jsonl line: strict JSON (non-finite numbers as null) and a newline."""
    return json.dumps(json_safe(row), allow_nan=False) + "\n"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def json_depth(value: Any) -> int:
    """How deep lists and objects nest in a parsed JSON value (a scalar: 0), without recursion."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, depth = todo.pop()
        inner = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if inner is None:
            continue
        deepest = max(deepest, depth)
        todo.extend((v, depth + 1) for v in inner if isinstance(v, (dict, list)))
    return deepest


def parse_json(text: str | bytes, where: str, check: Check | None = None) -> Any:
    """Strict JSON (no NaN or Infinity) nested at most ``MAX_JSON_DEPTH`` deep, then ``check``; ValueError
    ``where: ...`` in one line for anything else."""
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        value = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise ValueError(f"{where}: JSON nested deeper than {MAX_JSON_DEPTH} levels; not a file blocklab "
                         "reads") from None
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"{where}: not valid JSON ({' '.join(str(error).split())})") from None
    if json_depth(value) > MAX_JSON_DEPTH:
        raise ValueError(f"{where}: JSON nested deeper than {MAX_JSON_DEPTH} levels; not a file blocklab "
                         "reads")
    problem = check(value) if check is not None else None
    if problem:
        raise ValueError(f"{where}: {problem}")
    return value


def read_json(path: str | Path, what: str = "a JSON file", check: Check | None = None,
              limit: int = JSON_LIMIT) -> Any:
    """A JSON file (``read_regular_bytes``, then ``parse_json``): ValueError naming the file when it is
    not a regular file, too large, not strict JSON, too deep, or fails ``check``."""
    return parse_json(read_regular_bytes(path, what, limit), str(path), check)


def object_check(what: str) -> Check:
    """The schema "a JSON object" (``what`` says which one)."""
    return lambda value: None if isinstance(value, dict) else \
        f"expected a JSON object ({what}), found {json_type(value)}"


def read_json_object(path: str | Path, what: str, check: Check | None = None,
                     limit: int = JSON_LIMIT) -> dict[str, Any]:
    """A JSON file that must hold an object (then ``check``); ValueError naming the file and ``what``."""
    is_object = object_check(what)
    return read_json(path, what, lambda value: is_object(value) or (check(value) if check else None), limit)


def json_type(value: Any) -> str:
    """The JSON name of a parsed value's type: ``object``, ``array``, ``string``, ``number``, ..."""
    if isinstance(value, bool):
        return "a boolean"
    names = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number",
             type(None): "null"}
    return names.get(type(value), type(value).__name__)
