"""The command line's values: each flag's text turned into the typed value a library function takes
(booleans, numbers with their bounds, accuracies, paths, names), refused with argparse's one-line error
naming the text and what is allowed. Knows no config: the flags built from the configs are args.py's.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any


def parse_bool(text: str) -> bool:
    """'true'/'false' (also yes/no, 1/0, on/off) -> bool."""
    value = text.strip().lower()
    if value in ("true", "yes", "1", "on"):
        return True
    if value in ("false", "no", "0", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not true or false")


def parse_optional_bool(text: str) -> bool | None:
    """'auto' -> None, else ``parse_bool``."""
    return None if text.strip().lower() == "auto" else parse_bool(text)


def parse_bool_or_auto(text: str) -> bool | str:
    """'auto' -> 'auto', else ``parse_bool`` (``fused``)."""
    return "auto" if text.strip().lower() == "auto" else parse_bool(text)


def parse_int(text: str) -> int:
    """An integer written in decimal ('1.5' and '1e3' are refused: a count is never rounded)."""
    try:
        return int(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def parse_float(text: str) -> float:
    """A number (``1e-3``, ``0.5``, ``nan`` and ``inf`` too: the configs say which they allow)."""
    try:
        return float(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def parse_float_or_none(text: str) -> float | None:
    """'none' -> None (the field's own default rule), else ``parse_float``."""
    return None if text.strip().lower() == "none" else parse_float(text)


def parse_int_or_none(text: str) -> int | None:
    """'none' -> None (the field's own default rule), else ``parse_int``."""
    return None if text.strip().lower() == "none" else parse_int(text)


def parse_ints_or_none(text: str) -> tuple[int | None, ...] | None:
    """'none' -> None; '4096,none,4096' -> (4096, None, 4096) (``layer_windows``)."""
    if text.strip().lower() == "none":
        return None
    return tuple(parse_int_or_none(part) for part in text.split(","))


def parse_json_object_or_none(text: str) -> dict[str, Any] | None:
    """'none' -> None, else a JSON object (``rope_scaling``: the config says what it may hold)."""
    if text.strip().lower() == "none":
        return None
    try:
        value = json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON (an object: '{{\"a\": 1}}')") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object")
    return value


def at_least(minimum: int, most: int | None = None) -> Callable[[str], int]:
    """A parser of integers >= ``minimum`` (and <= ``most``), for numbers no config validates."""

    def parse(text: str) -> int:
        value = parse_int(text)
        if value < minimum or (most is not None and value > most):
            rule = f"between {minimum} and {most}" if most is not None else f">= {minimum}"
            raise argparse.ArgumentTypeError(f"{text!r} must be an integer {rule}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


parse_seed = at_least(0, 2**64 - 1)  # every --seed: torch seeds take 64 bits


def parse_int_or_ratio(text: str) -> int | str:
    """``--d-ff``: '256' -> 256; '4x', '8/3x', '4.0' stay text for ``resolve_d_ff``."""
    return int(text) if text.strip().isdigit() else text


def parse_value(text: str) -> Any:
    """A value written on the command line as int, float, None/true/false, or the text itself."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"none": None, "true": True, "false": False}.get(text.lower(), text)


ACCURACY_RULE = "a fraction in (0, 1] like 0.995, a percentage like 99.5%, or none"


def parse_accuracy(text: str) -> float | None:
    """An accuracy: a fraction in (0, 1] (``0.995``) or a percentage with its sign (``99.5%``);
    ``none``, ``off`` or ``0``: no target. ``1.5`` is refused: 1.5% or 150%, it is not a fraction."""
    value = text.strip().lower()
    if value in ("none", "off", "0"):
        return None
    percent = value.endswith("%")
    try:
        number = float(value.removesuffix("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {ACCURACY_RULE}") from None
    fraction = number / 100 if percent else number
    if not 0 < fraction <= 1:  # also refuses nan
        raise argparse.ArgumentTypeError(f"{text!r} is not {ACCURACY_RULE}")
    return fraction


TARGET_RULE = ACCURACY_RULE.removesuffix(", or none")


def parse_target(text: str) -> float:
    """An accuracy a command needs (``--steps-to-accuracy``): ``parse_accuracy`` without ``none``."""
    try:
        value = parse_accuracy(text)
    except argparse.ArgumentTypeError:  # its rule offers none, which this flag refuses
        raise argparse.ArgumentTypeError(f"{text!r} is not {TARGET_RULE}") from None
    if value is None:
        raise argparse.ArgumentTypeError(f"{text!r}: this flag needs an accuracy, {TARGET_RULE}")
    return value


def parse_numbers(text: str) -> list[float]:
    """A vector a learner types: ``4,2,0,-2``, ``"4 2 0 -2"`` or ``"[4, 2, 0, -2]"``; finite numbers only."""
    parts = [p for p in re.split(r"[,\s]+", text.strip().strip("[]()").strip()) if p]
    if not parts:
        raise argparse.ArgumentTypeError(f"{text!r} holds no numbers; give them separated by commas, e.g. "
                                         "4,2,0,-2")
    numbers = []
    for part in parts:
        try:
            number = float(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r} in {text!r} is not a number; give numbers separated "
                                             "by commas, e.g. 4,2,0,-2") from None
        if not math.isfinite(number):
            raise argparse.ArgumentTypeError(f"{part!r} in {text!r} is not a finite number")
        numbers.append(number)
    return numbers


def parse_path(text: str) -> str:
    """A path from a flag: ``~`` expanded, an empty path refused."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path; name a file or folder")
    return str(Path(text).expanduser())


def parse_json_target(text: str) -> str:
    """``--json``'s value: ``-`` (stdout) or a file path."""
    return text if text == "-" else parse_path(text)


def parse_name(text: str) -> str:
    """A name (task, preset, claim): not empty, surrounding spaces dropped."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty name")
    return text.strip()


def parse_names(text: str) -> list[str]:
    """``"a,b"`` -> ["a", "b"]; a list that names nothing (``","``) is refused."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"{text!r} names nothing; give comma-separated names like a,b")
    return names
