"""What hook points cost when no hook is attached: forward time vs the same model without them.

The peer is built from the same model: every method that touches a hook point is recompiled
from its source with ``self.hook_x(expr)`` replaced by ``expr`` and every "is a hook
attached?" test by ``False`` (an AST rewrite), so both forwards run the same code minus the
hooks. Both are timed interleaved in one run, with a third, identical copy of the hooked
model as a control for the noise; the ratio is what to read.

    .venv/bin/python benchmarks/hooks_overhead.py [--rounds 400]
"""

from __future__ import annotations

import argparse
import ast
import copy
import inspect
import statistics
import textwrap
import time
import timeit
from collections.abc import Callable

import torch
from torch import nn

import blocklab as bl
from blocklab.nn import block as block_module
from blocklab.nn.attention import MultiHeadAttention
from blocklab.nn.block import TransformerBlock
from blocklab.nn.feedforward import FeedForward
from blocklab.nn.hooks import HookPoint, hook_points
from blocklab.nn.model import Transformer
from blocklab.nn.norms import LayerNorm

HOOK_CHECKS = ("any_attached", "any_intervention")  # blocklab.nn.hooks' "is a hook attached?" functions


class _StripHooks(ast.NodeTransformer):
    """``self.hook_x(e)`` (also ``block.hook_x(e)`` and ``getattr(block, f"hook_{...}")(e)``) -> ``e``;
    ``self.hook_x.observe(...)`` and ``self.hook_x.see(...)`` (a stage shown to observers only) ->
    ``None``; ``self.hook_x.active`` and ``.intervened``, ``any_attached(...)``, ``any_intervention(...)`` and
    ``any(... p.fns ...)`` (is a hook attached?) -> ``False``."""

    @staticmethod
    def _is_hook(node: ast.AST) -> bool:
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            return node.attr.startswith("hook_")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
                and len(node.args) == 2 and isinstance(node.args[1], ast.JoinedStr):
            head = node.args[1].values[0]
            return isinstance(head, ast.Constant) and str(head.value).startswith("hook_")
        return False

    def visit_Call(self, node: ast.Call) -> ast.AST:
        if self._is_hook(node.func) and len(node.args) == 1 and not node.keywords:
            return self.visit(node.args[0])
        if isinstance(node.func, ast.Attribute) and node.func.attr in ("observe", "see") \
                and self._is_hook(node.func.value):
            return ast.copy_location(ast.Constant(None), node)
        if self._asks_for_hooks(node):
            return ast.copy_location(ast.Constant(False), node)
        return self.generic_visit(node)

    @staticmethod
    def _asks_for_hooks(node: ast.Call) -> bool:
        name = node.func.id if isinstance(node.func, ast.Name) else ""
        reads_fns = any(isinstance(n, ast.Attribute) and n.attr == "fns" for n in ast.walk(node))
        return name in HOOK_CHECKS or (name == "any" and reads_fns)

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if node.attr in ("active", "intervened") and self._is_hook(node.value):
            return ast.copy_location(ast.Constant(False), node)
        return self.generic_visit(node)


def _strip(where: str, name: str, fn: Callable, names: dict | None = None) -> Callable:
    """``fn`` (a method or function) recompiled from its source without hooks, its global ``names``
    replaced; ``fn`` itself when it touches none."""
    source = inspect.getsource(fn)
    if not any(word in source for word in ("hook_", ".fns", *HOOK_CHECKS)):
        return fn
    tree = _StripHooks().visit(ast.parse(textwrap.dedent(source)))
    tree.body[0].decorator_list = []  # @property: re-applied by the caller
    namespace: dict = {}
    exec(compile(ast.fix_missing_locations(tree), f"<{where}.{name} without hooks>", "exec"),
         {**fn.__globals__, **(names or {})}, namespace)
    return namespace[name]


# The block's module path runs its layout's steps through block_module.STEPS, and its lean path is one of
# block_module.LEAN_PATHS: functions of the block, stripped here like its methods.
PLAIN_STEPS = {kind: _strip("block", fn.__name__, fn) for kind, fn in block_module.STEPS.items()}
PLAIN_LEAN = {layout: _strip("block", fn.__name__, fn) for layout, fn in block_module.LEAN_PATHS.items()}


def _without_hooks(cls: type) -> type:
    """A subclass of ``cls`` whose methods and properties that touch hook points are recompiled
    without them."""
    methods: dict = {}
    for name, member in vars(cls).items():
        if inspect.isfunction(member) and name != "__init__":
            methods[name] = _strip(cls.__name__, name, member, {"STEPS": PLAIN_STEPS})
        elif isinstance(member, property) and member.fset is None:
            methods[name] = property(_strip(cls.__name__, name, member.fget))
    return type(f"{cls.__name__}WithoutHooks", (cls,), methods)


PLAIN = {cls: _without_hooks(cls)
         for cls in (Transformer, TransformerBlock, MultiHeadAttention, FeedForward, LayerNorm)}


def without_hooks(model: Transformer) -> Transformer:
    """A copy of ``model`` (same weights) whose forward never touches a hook point."""
    plain = copy.deepcopy(model)
    for module in plain.modules():
        if type(module) in PLAIN:
            module.__class__ = PLAIN[type(module)]
        if isinstance(module, TransformerBlock) and module._lean_path is not None:  # chosen at construction
            module._lean_path = PLAIN_LEAN[module.config.norm_position]
    return plain


def _time(model: nn.Module, tokens: torch.Tensor, reps: int) -> float:
    # CPU time of this thread (torch runs on it alone, see --threads): time spent descheduled
    # while other processes run does not count, which keeps a shared machine's noise out.
    start = time.thread_time()
    for _ in range(reps):
        model(tokens)
    return (time.thread_time() - start) / reps


def measure(config: bl.ModelConfig, batch: int, rounds: int, budget_s: float = 8.0) -> dict[str, float]:
    """Forward seconds of the hooked model, its hook-free peer and an identical copy of the
    hooked model (the control), and the medians over rounds of the paired ratios.

    Each round times the three in short (about 3 ms) bursts back to back, rotating the order;
    a ratio within a round compares runs made moments apart, and the median over rounds drops
    the rounds another process disturbed. Large shapes get fewer rounds (about ``budget_s``).
    """
    torch.manual_seed(0)
    original = Transformer(config).eval()
    # all three are deep copies, so their tensors are allocated the same way
    models = {"hooked": copy.deepcopy(original), "plain": without_hooks(original),
              "copy": copy.deepcopy(original)}
    tokens = torch.randint(0, config.vocab_size, (batch, config.max_seq_len))
    times: dict[str, list[float]] = {name: [] for name in models}
    with torch.no_grad():
        assert torch.equal(models["hooked"](tokens), models["plain"](tokens)), "the peer must agree"
        once = max(_time(models["hooked"], tokens, 3), 1e-6)
        reps = max(1, int(0.003 / once))
        rounds = max(7, min(rounds, int(budget_s / (3 * reps * once))))
        names = list(models)
        for i in range(rounds):
            for name in names[i % 3:] + names[: i % 3]:
                times[name].append(_time(models[name], tokens, reps))
    h, p, c = (times[n] for n in names)
    return {
        "hooked": statistics.median(h), "plain": statistics.median(p),
        "ratio": statistics.median(a / b for a, b in zip(h, p, strict=True)),
        "control": statistics.median(a / b for a, b in zip(c, h, strict=True)),
    }


def hook_work_per_forward(config: bl.ModelConfig, batch: int) -> tuple[dict[str, int], dict[str, float]]:
    """How often one unused forward calls a hook point (``__call__``, or ``see``/``observe`` on the
    lean path), reads ``.active`` and asks ``any_attached``/``any_intervention`` (counted by wrapping
    them for one forward), and what each costs alone (timeit, seconds)."""
    torch.manual_seed(0)
    model = Transformer(config).eval()
    tokens = torch.randint(0, config.vocab_size, (batch, config.max_seq_len))
    counts = {"call": 0, "see": 0, "observe": 0, "active": 0, "any_attached": 0, "any_intervention": 0}
    call, see, observe, active = HookPoint.__call__, HookPoint.see, HookPoint.observe, HookPoint.active
    asked, intervened = block_module.any_attached, block_module.any_intervention

    def counted(name: str, fn):
        def wrapper(*args):
            counts[name] += 1
            return fn(*args)
        return wrapper

    HookPoint.__call__, HookPoint.see, HookPoint.observe = counted("call", call), counted("see", see), \
        counted("observe", observe)
    HookPoint.active = property(counted("active", active.fget))
    block_module.any_attached = counted("any_attached", asked)
    block_module.any_intervention = counted("any_intervention", intervened)
    try:
        with torch.no_grad():
            model(tokens)
    finally:
        HookPoint.__call__, HookPoint.see, HookPoint.observe, HookPoint.active = call, see, observe, active
        block_module.any_attached, block_module.any_intervention = asked, intervened
    point, x, points = HookPoint(), torch.zeros(1), list(hook_points(model.blocks[0]).values())
    n = 200_000
    cost = {
        "call": timeit.timeit(lambda: point(x), number=n) / n,
        "see": timeit.timeit(lambda: point.see(x), number=n) / n,
        "observe": timeit.timeit(lambda: point.observe(lambda: x), number=n) / n,
        "active": timeit.timeit(lambda: point.active, number=n) / n,
        "any_attached": timeit.timeit(lambda: asked(points), number=n) / n,
        "any_intervention": timeit.timeit(lambda: intervened(points), number=n) / n,
    }
    empty = timeit.timeit(lambda: None, number=n) / n  # the lambda's own call
    return counts, {k: max(v - empty, 0.0) for k, v in cost.items()}


SHAPES = [  # (label, config, batch)
    ("listops-seed, batch 1 (overhead-bound)", bl.preset("listops-seed"), 1),
    ("listops-seed, batch 64", bl.preset("listops-seed"), 64),
    ("pre-norm GELU d256 x4 layers, T 64, batch 8",
     bl.ModelConfig(vocab_size=256, max_seq_len=64, d_model=256, n_heads=8, n_layers=4, d_ff=1024,
                    activation="gelu", norm_position="pre"), 8),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=400, help="interleaved timing rounds per shape")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (keep 1: the timer counts this thread's CPU time only)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"forward, no hooks attached: with hook points vs the same model without them "
          f"(up to {args.rounds} interleaved rounds, {args.threads} thread, CPU time of the thread)")
    print(f"{'shape':46s} {'with hooks':>11s} {'without':>11s} {'ratio':>6s} {'control':>8s}")
    estimates = []
    for label, config, batch in SHAPES:
        t = measure(config, batch, args.rounds)
        print(f"{label:46s} {t['hooked'] * 1e6:9.1f}us {t['plain'] * 1e6:9.1f}us "
              f"{t['ratio']:6.3f} {t['control']:8.3f}")
        counts, cost = hook_work_per_forward(config, batch)
        spent = sum(counts[k] * cost[k] for k in counts)
        shown, asked = counts["see"] + counts["observe"], counts["any_attached"] + counts["any_intervention"]
        estimates.append(f"{label:46s} {counts['call']:3d} calls, {shown:2d} see/observe, {counts['active']} "
                         f".active, {asked} any_* = {spent * 1e6:5.2f}us = {100 * spent / t['plain']:.2f}% "
                         "of the forward")
    print("ratio = with / without (1.000 = free); control = an identical copy / with hooks (the noise);")
    print("both are medians of ratios within a round; times are medians")
    print("\nthe hook work of one forward, counted, each kind timed alone:")
    print("\n".join(estimates))


if __name__ == "__main__":
    main()
