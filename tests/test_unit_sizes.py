"""Units a newcomer can read (issue 34, item 4): no library module over ``MAX_MODULE_LINES`` lines and no
function over ``MAX_FUNCTION_LINES`` lines (decorators aside, its docstring included) unless a comment
starting ``# long because`` sits on the line above its ``def`` (or its first decorator), saying why.
"""

from __future__ import annotations

import ast
from pathlib import Path

import blocklab as bl

MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60
REASON = "# long because"
PACKAGE = Path(bl.__file__).parent


def offenders(source: str, rel: str) -> list[str]:
    """``rel: N lines`` for a module over the limit, ``rel:LINE name: N lines`` for each long function
    without a reason above it."""
    lines = source.splitlines()
    found = [f"{rel}: {len(lines)} lines"] if len(lines) > MAX_MODULE_LINES else []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        length = node.end_lineno - node.lineno + 1
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        reasoned = first >= 2 and lines[first - 2].strip().startswith(REASON)
        if length > MAX_FUNCTION_LINES and not reasoned:
            found.append(f"{rel}:{node.lineno} {node.name}: {length} lines")
    return found


def test_no_long_module_or_function_without_a_reason() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += offenders(path.read_text(), path.relative_to(PACKAGE).as_posix())
    assert not found, "\n".join(found)


def test_the_scan_finds_a_long_function_and_accepts_a_reason() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    long = f"def f():\n{body}"
    assert offenders(long, "m.py") == [f"m.py:1 f: {MAX_FUNCTION_LINES + 1} lines"]
    assert offenders(f"# long because a table is read top to bottom\n{long}", "m.py") == []
    assert offenders("x = 1\n" * (MAX_MODULE_LINES + 1), "m.py") == [f"m.py: {MAX_MODULE_LINES + 1} lines"]
