"""Strict JSON files: what blocklab writes (non-finite numbers as null) and reads back (NaN refused)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .atomic import atomic_write_bytes


def json_safe(value: Any) -> Any:
    """``value`` with every NaN/Infinity replaced by None, so it serialises as strict JSON (null)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def json_line(row: dict[str, Any]) -> str:
    """One metrics.jsonl line: strict JSON (non-finite numbers as null) and a newline."""
    return json.dumps(json_safe(row), allow_nan=False) + "\n"


def write_json(path: str | Path, data: dict[str, Any]) -> None:
    """Atomically write pretty, strict JSON (non-finite numbers as null)."""
    atomic_write_bytes(path, (json.dumps(json_safe(data), indent=2, allow_nan=False) + "\n").encode())


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json(text: str) -> Any:
    """Parse strict JSON text: NaN and Infinity are refused (ValueError), as Python's json accepts them."""
    return json.loads(text, parse_constant=_reject_constant)


def read_json(path: str | Path) -> Any:
    """Parse a strict-JSON file; ValueError naming the file when it is not valid (NaN included)."""
    try:
        return parse_json(Path(path).read_bytes().decode("utf-8"))
    except (ValueError, RecursionError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"{path}: not valid JSON ({error})") from None


def read_json_object(path: str | Path, what: str) -> dict[str, Any]:
    """A JSON file that must hold an object; ValueError naming the file and ``what`` it should be."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object ({what}), found {type(data).__name__}")
    return data
