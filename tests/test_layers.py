"""The package's architecture: each subpackage (and top-level module) imports only what its docstring
declares, never in a loop.

Every subpackage's ``__init__`` and every top-level module says in its docstring what it may import,
on a line ``May import: errors, device, nn.`` (``nothing`` or ``any``). This test reads those
declarations; there is no second map of the package here. Every import of a blocklab module counts,
also the ones inside functions (a lazy import is still a dependency), except under ``if
TYPE_CHECKING:`` (annotations only: nothing runs). Within a subpackage modules import each other
freely, but never in a loop.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "blocklab"
DECLARATION = re.compile(r"^May import: (?P<names>[\w, ]+)\.$", re.MULTILINE)


def module_name(path: Path, package: Path = PACKAGE) -> str:
    """``blocklab/inspect/trace/collect.py`` -> ``inspect.trace.collect``; ``__init__.py``: its package."""
    parts = list(path.relative_to(package).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, module: str, modules: set[str]) -> set[str]:
    """The blocklab modules the file ``path`` (``module``) imports, relative or absolute, at any depth."""
    package = [] if module == "__init__" else module.split(".") if path.name == "__init__.py" \
        else module.split(".")[:-1]
    found: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {id(n) for guard in ast.walk(tree)
                   if isinstance(guard, ast.If) and _checks_types(guard.test)
                   for stmt in guard.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                stem = ".".join(["blocklab", *base, *([node.module] if node.module else [])])
            else:
                stem = node.module or ""
            submodules = [f"{stem}.{a.name}" for a in node.names]  # `from . import x`: x may be a module
            is_module = [s.removeprefix("blocklab.") in modules for s in submodules]
            # `from . import x` of submodules imports them, not their package's other contents
            targets = submodules if node.module is None and all(is_module) else [stem, *submodules]
        for target in targets:
            if target == "blocklab" or target.startswith("blocklab."):
                name = target.removeprefix("blocklab").removeprefix(".") or "__init__"
                if name in modules:
                    found.add(name)
    found.discard(module)
    return found


def _checks_types(test: ast.expr) -> bool:
    """``TYPE_CHECKING`` or ``typing.TYPE_CHECKING``: a block only type checkers read."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def unit(module: str) -> str:
    """The unit a module's rule belongs to: its top-level subpackage, or itself at the top."""
    return module.split(".")[0]


def declared(package: Path) -> dict[str, set[str] | None]:
    """Each unit's declared imports (None: any), read from its docstring's ``May import:`` line."""
    rules: dict[str, set[str] | None] = {}
    for path in sorted(package.iterdir()):
        if path.name.startswith(("_", ".")) and path.name not in ("__init__.py", "__main__.py"):
            continue
        source = path / "__init__.py" if path.is_dir() else path
        if path.is_dir() and not source.exists() or not path.is_dir() and path.suffix != ".py":
            continue
        name = path.stem if path.is_file() else path.name
        doc = ast.get_docstring(ast.parse(source.read_text(encoding="utf-8"))) or ""
        match = DECLARATION.search(doc)
        if match is None:
            rules[name] = set()  # undeclared: a failure below says so
            continue
        names = {n.strip() for n in match["names"].split(",")}
        rules[name] = None if names == {"any"} else set() if names == {"nothing"} else names
    return rules


def violations(package: Path) -> list[str]:
    """Every import against a declared rule, and every undeclared unit or unknown name in a rule."""
    modules = {module_name(p, package): p for p in sorted(package.rglob("*.py"))}
    rules = declared(package)
    problems = []
    for name, allowed in rules.items():
        source = package / name / "__init__.py" if (package / name).is_dir() else package / f"{name}.py"
        if allowed is not None and not allowed and not DECLARATION.search(
                ast.get_docstring(ast.parse(source.read_text(encoding="utf-8"))) or ""):
            problems.append(f"blocklab.{name} declares nothing: its docstring needs a 'May import: ...' line")
        for other in sorted(allowed or ()):
            if other not in rules:
                problems.append(f"blocklab.{name} may import {other!r}, which is no part of blocklab")
    for module, path in modules.items():
        allowed = rules[unit(module)]
        if allowed is None:
            continue
        for target in sorted(imports_of(path, module, set(modules))):
            if unit(target) != unit(module) and unit(target) not in allowed:
                problems.append(f"blocklab.{module} imports blocklab.{target}, but blocklab.{unit(module)} "
                                f"may import only: {', '.join(sorted(allowed)) or 'nothing'}")
    return problems


def loops(package: Path) -> list[list[str]]:
    """Import cycles between modules, and between units (a unit importing one that imports it back)."""
    modules = {module_name(p, package): p for p in sorted(package.rglob("*.py"))}
    graph = {m: imports_of(p, m, set(modules)) for m, p in modules.items()}
    units: dict[str, set[str]] = {}
    for m, deps in graph.items():
        units.setdefault(unit(m), set()).update(unit(d) for d in deps if unit(d) != unit(m))
    found: list[list[str]] = []
    # every unit, cli included; the top package only re-exports (nothing below may import it back)
    for edges in (graph, units):
        state: dict[str, int] = {}  # 1: on the current path, 2: done
        path: list[str] = []

        def visit(node: str, edges: dict[str, set[str]] = edges) -> None:
            state[node] = 1
            path.append(node)
            for dep in sorted(edges.get(node, ())):
                if state.get(dep) == 1:
                    found.append(path[path.index(dep):] + [dep])
                elif dep not in state:
                    visit(dep)
            path.pop()
            state[node] = 2

        for node in sorted(edges):
            if node not in state:
                visit(node)
    return found


def test_every_import_follows_its_units_declared_rule() -> None:
    problems = violations(PACKAGE)
    assert not problems, "\n".join(problems)


def test_no_import_loops() -> None:
    found = loops(PACKAGE)
    assert not found, "import loops: " + "; ".join(" -> ".join(loop) for loop in found)


def test_at_most_eight_modules_stay_at_the_top() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 8, top


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "blocklab"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    return root


GOOD = {
    "__init__.py": '"""Top.\n\nMay import: any.\n"""\nfrom .high import b\n',
    "errors.py": '"""Errors.\n\nMay import: nothing.\n"""\n',
    "low/__init__.py": '"""Low.\n\nMay import: errors.\n"""\n',
    "low/a.py": "from ..errors import x\n",
    "high/__init__.py": '"""High.\n\nMay import: errors, low.\n"""\n',
    "high/b.py": "def f():\n    from ..low.a import y\n",
}


def test_the_checker_passes_a_package_that_keeps_its_rules(tmp_path: Path) -> None:
    root = _package(tmp_path, GOOD)
    assert violations(root) == [] and loops(root) == []


@pytest.mark.parametrize("name, text, expected", [
    ("low/c.py", "from ..high.b import f\n", "blocklab.low.c imports blocklab.high.b"),  # upward
    ("low/c.py", "def g():\n    import blocklab.high.b\n", "blocklab.low.c imports blocklab.high.b"),  # lazy
    ("errors.py", '"""Errors.\n\nMay import: nothing.\n"""\nfrom .low import a\n', "blocklab.errors imports"),
    ("low/__init__.py", '"""Low, with no rule."""\n', "blocklab.low declares nothing"),
    ("low/__init__.py", '"""Low.\n\nMay import: errors, numpy.\n"""\n', "may import 'numpy'"),
])
def test_the_checker_fails_on_an_import_against_a_declared_rule(tmp_path: Path, name: str, text: str,
                                                                  expected: str) -> None:
    root = _package(tmp_path, {**GOOD, name: text})
    assert any(expected in p for p in violations(root)), violations(root)


def test_an_import_for_type_checkers_only_is_no_dependency(tmp_path: Path) -> None:
    guarded = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..high.b import f\n"
    root = _package(tmp_path, {**GOOD, "low/c.py": guarded})
    assert violations(root) == [] and loops(root) == []


def test_the_checker_finds_a_loop_inside_a_unit(tmp_path: Path) -> None:
    root = _package(tmp_path, {**GOOD, "low/a.py": "from .c import z\n", "low/c.py": "from .a import x\n"})
    assert ["low.a", "low.c", "low.a"] in loops(root)


def test_the_checker_finds_a_loop_through_the_cli(tmp_path: Path) -> None:
    """A library unit reaching back into the command line (cli -> explore -> cli) is a loop, even though
    cli may import anything."""
    planted = {
        **GOOD,
        "cli/__init__.py": '"""The command.\n\nMay import: any.\n"""\n',
        "cli/trace.py": "def subject():\n    pass\n",
        "cli/explore.py": "from ..explore.session import serve\n",
        "explore/__init__.py": '"""The app.\n\nMay import: errors, cli.\n"""\n',
        "explore/session.py": "from ..cli.trace import subject\n",
    }
    root = _package(tmp_path, planted)
    assert ["cli", "explore", "cli"] in loops(root), loops(root)
