"""A tokenizer's regexes checked before the ``tokenizers`` library runs them: a repeated group that holds
a repeat or alternatives (``(a+)+``) can take exponential time on a short input, and the library's regex
engine panics when it gives up."""

from __future__ import annotations

import json
import re
from typing import Any

# a quantifier that repeats: +, *, {n,}, {n,m} with m > 1 (Onig's syntax, as Python's)
_REPEAT = re.compile(r"[+*]|\{(\d*),(\d*)\}|\{(\d+)\}")


def risky_repeat(pattern: str) -> str | None:
    """The first group of a regex that is repeated and holds a repeat or alternatives (``(a+)+``,
    ``(a|aa)+``): the shapes whose backtracking grows exponentially with the input; None when there is
    none. (Conservative: ``((a|b)c)+`` is refused too; no tokenizer published on the Hub repeats a group.)"""
    stack: list[list[Any]] = [[0, False]]  # each open group: where it starts, whether it holds a repeat or |
    closed: list[Any] | None = None  # the group that has just closed
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i, closed = i + 2, None
            continue
        if c == "[":  # a character class (Onig nests them): no group inside
            i, depth = i + 1, 1
            i += pattern.startswith("^", i)
            i += pattern.startswith("]", i)
            while i < len(pattern) and depth:
                depth += {"[": 1, "]": -1}.get(pattern[i], 0)
                i += 2 if pattern[i] == "\\" else 1
            closed = None
            continue
        if c == "(":
            stack.append([i, False])
            i, closed = i + 1, None
            continue
        if c == "|":
            stack[-1][1] = True
            i, closed = i + 1, None
            continue
        if c == ")" and len(stack) > 1:
            closed = stack.pop()
            stack[-1][1] = stack[-1][1] or closed[1]
            i += 1
            continue
        quantifier = _REPEAT.match(pattern, i)
        if quantifier is not None:
            _, high, exact = quantifier.groups()
            repeats = c in "+*" or (high == "" or int(high or 0) > 1) if exact is None else int(exact) > 1
            if repeats and closed is not None and closed[1]:
                return pattern[closed[0] : quantifier.end()]
            stack[-1][1] = stack[-1][1] or repeats
            i = quantifier.end()
        else:
            i += 1
        closed = None
    return None


def _regexes(value: Any) -> list[str]:
    """Every regex a tokenizer.json holds (a Split pre-tokenizer's, a Replace normalizer's pattern)."""
    if isinstance(value, dict):
        found = [value["Regex"]] if isinstance(value.get("Regex"), str) else []
        return found + [r for v in value.values() for r in _regexes(v)]
    if isinstance(value, list):
        return [r for v in value for r in _regexes(v)]
    return []


def check_regexes(json_text: str) -> None:
    """Refuse a tokenizer whose regex can take exponential time on a short input (``(a+)+b`` against
    ``aaaa...c``: the ``tokenizers`` library panics when its regex engine gives up)."""
    for pattern in _regexes(json.loads(json_text)):
        risky = risky_repeat(pattern)
        if risky is not None:
            raise ValueError(
                f"the regex {pattern[:80]!r} repeats a group holding a repeat or alternatives "
                f"({risky[:40]!r}): its matching time can grow exponentially with the input; "
                "blocklab loads tokenizers whose repeated groups are plain sequences"
            )
