"""The package's architecture: imports go down the floors below, never up, never in a loop.

Every import of a blocklab module counts, also the ones inside functions (a lazy import is still
a dependency). The floors are STYLE.md's data flow: config -> components -> block -> model ->
(hooks, trace, train, experiments, interop, cli). A module may import its own floor and the ones
below; a new module must be given a floor here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "blocklab"

# Lowest first. Names are modules or packages (a package covers everything under it).
FLOORS: list[tuple[str, ...]] = [
    ("version", "errors", "activations", "measure", "distributed", "device", "trainconfig"),  # errors only
    ("kernels",),  # tensors in, tensors out; its table of LayerNorm variants is the one list of them
    ("config", "hooks"),
    ("batchnorm", "norms", "feedforward", "attention", "embedding", "tokenizer"),  # the components
    ("cache",),  # the activation cache and HookedModule: what blocks and models return from run_with_cache
    ("block",),
    ("model",),
    ("params", "resources", "nonfinite", "checkpoint", "tasks", "generate", "embed"),  # what uses a model
    ("train", "trainstate", "runfolder", "runfiles", "diagnostics", "trace", "report"),  # workflows
    ("experiments", "interop", "load", "bench", "bench_blocks", "bench_report"),  # applications
    ("cli", "__main__", "__init__"),  # the command and the public API re-exports
]


def module_name(path: Path) -> str:
    """``blocklab/trace/collect.py`` -> ``trace.collect``; a package's ``__init__.py`` -> the package."""
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def floor_of(module: str) -> int:
    """The floor of a module: the floor naming it or the nearest package above it."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        for level, names in enumerate(FLOORS):
            if prefix in names:
                return level
    raise AssertionError(f"blocklab.{module} has no floor in tests/test_layers.py FLOORS; add it")


def imports_of(module: str) -> set[str]:
    """The blocklab modules ``module`` imports (relative and absolute, at any depth of the file)."""
    path = MODULES[module]
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    if module == "__init__":
        package = []
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
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
            is_module = [s.removeprefix("blocklab.") in MODULES for s in submodules]
            # `from . import x` of submodules imports them, not their package's other contents
            targets = submodules if node.module is None and all(is_module) else [stem, *submodules]
        for target in targets:
            if target == "blocklab" or target.startswith("blocklab."):
                name = target.removeprefix("blocklab").removeprefix(".") or "__init__"
                if name in MODULES:
                    found.add(name)
    found.discard(module)
    return found


GRAPH = {m: imports_of(m) for m in MODULES}


def test_every_module_has_a_floor() -> None:
    for module in MODULES:
        floor_of(module)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_imports_a_higher_floor(module: str) -> None:
    mine = floor_of(module)
    upward = sorted(m for m in GRAPH[module] if floor_of(m) > mine)
    assert not upward, (
        f"blocklab.{module} (floor {mine}: {FLOORS[mine]}) imports higher floors: "
        + ", ".join(f"{m} (floor {floor_of(m)})" for m in upward)
    )


def test_no_import_loops() -> None:
    loops: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for dep in sorted(GRAPH[module]):
            if state.get(dep) == 1:
                loops.append(path[path.index(dep):] + [dep])
            elif dep not in state:
                visit(dep)
        path.pop()
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module)
    assert not loops, "import loops: " + "; ".join(" -> ".join(loop) for loop in loops)


def test_the_walker_sees_lazy_and_relative_imports() -> None:
    # the checks above are only as good as the import walker: pin it on imports we know are there
    assert "trace.collect" in GRAPH["cli.trace"]  # `from ..trace.collect import ...` inside a package
    assert "load" in GRAPH["cli.weights"]  # imported inside a function
    assert {"experiments", "__init__"} <= set(MODULES)
