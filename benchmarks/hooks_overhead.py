"""What hook points cost when no hook is attached: forward time vs the same model without them.

The peer is built from the same model: every method that touches a hook point is recompiled
from its source with ``self.hook_x(expr)`` replaced by ``expr`` and every "is a hook
attached?" test by ``False`` (an AST rewrite), so both forwards run the same code minus the
hooks. Both are timed interleaved in one run, with a third, identical copy of the hooked
model as a control for the noise; the ratio is what to read.

    .venv/bin/python benchmarks/hooks_overhead.py [--rounds 150]
"""

from __future__ import annotations

import argparse
import ast
import copy
import inspect
import textwrap
import time

import torch
from torch import nn

import blocklab as bl
from blocklab.attention import MultiHeadAttention
from blocklab.block import TransformerBlock
from blocklab.feedforward import FeedForward
from blocklab.model import Transformer


class _StripHooks(ast.NodeTransformer):
    """``self.hook_x(e)`` -> ``e``; ``self.hook_x.active``, ``any_attached(...)`` and
    ``any(... p.fns ...)`` (is a hook attached?) -> ``False``."""

    @staticmethod
    def _is_hook(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id == "self" and node.attr.startswith("hook_"))

    def visit_Call(self, node: ast.Call) -> ast.AST:
        if self._is_hook(node.func) and len(node.args) == 1 and not node.keywords:
            return self.visit(node.args[0])
        if self._asks_for_hooks(node):
            return ast.copy_location(ast.Constant(False), node)
        return self.generic_visit(node)

    @staticmethod
    def _asks_for_hooks(node: ast.Call) -> bool:
        name = node.func.id if isinstance(node.func, ast.Name) else ""
        reads_fns = any(isinstance(n, ast.Attribute) and n.attr == "fns" for n in ast.walk(node))
        return name == "any_attached" or (name == "any" and reads_fns)

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if node.attr == "active" and self._is_hook(node.value):
            return ast.copy_location(ast.Constant(False), node)
        return self.generic_visit(node)


def _without_hooks(cls: type) -> type:
    """A subclass of ``cls`` whose methods that call hook points are recompiled without them."""
    methods = {}
    for name, fn in vars(cls).items():
        if not inspect.isfunction(fn) or name == "__init__":
            continue
        source = inspect.getsource(fn)
        if not any(word in source for word in ("hook_", ".fns", "any_attached")):
            continue
        tree = _StripHooks().visit(ast.parse(textwrap.dedent(source)))
        namespace: dict = {}
        exec(compile(ast.fix_missing_locations(tree), f"<{cls.__name__}.{name} without hooks>", "exec"),
             fn.__globals__, namespace)
        methods[name] = namespace[name]
    return type(f"{cls.__name__}WithoutHooks", (cls,), methods)


PLAIN = {cls: _without_hooks(cls) for cls in (Transformer, TransformerBlock, MultiHeadAttention, FeedForward)}


def without_hooks(model: Transformer) -> Transformer:
    """A copy of ``model`` (same weights) whose forward never touches a hook point."""
    plain = copy.deepcopy(model)
    for module in plain.modules():
        if type(module) in PLAIN:
            module.__class__ = PLAIN[type(module)]
        if isinstance(module, TransformerBlock):  # re-bind the variant chosen at construction
            module._forward = getattr(module, module._forward.__func__.__name__)
    return plain


def _time(model: nn.Module, tokens: torch.Tensor, reps: int) -> float:
    # CPU time of this thread (torch runs on it alone, see --threads): time spent descheduled
    # while other processes run does not count, which keeps a shared machine's noise out.
    start = time.thread_time()
    for _ in range(reps):
        model(tokens)
    return (time.thread_time() - start) / reps


def measure(config: bl.ModelConfig, batch: int, rounds: int, budget_s: float = 8.0) -> dict[str, float]:
    """Best-of-``rounds`` forward seconds of the hooked model, its hook-free peer and an
    identical copy of the hooked model (the control: its ratio shows the timing noise).

    The three are timed in short (10 ms), interleaved bursts, rotating the order each round; the
    minimum over rounds is the estimate least disturbed by other processes. Large shapes get
    fewer rounds so that each shape takes about ``budget_s``.
    """
    torch.manual_seed(0)
    original = Transformer(config).eval()
    # all three are deep copies, so their tensors are allocated the same way
    hooked = copy.deepcopy(original)
    models = {"hooked": hooked, "plain": without_hooks(original), "copy": copy.deepcopy(original)}
    tokens = torch.randint(0, config.vocab_size, (batch, config.max_seq_len))
    best = dict.fromkeys(models, float("inf"))
    with torch.no_grad():
        assert torch.equal(hooked(tokens), models["plain"](tokens)), "the peer must compute the same logits"
        once = max(_time(hooked, tokens, 3), 1e-6)
        reps = max(1, int(0.01 / once))  # bursts of about 10 ms
        rounds = max(5, min(rounds, int(budget_s / (3 * reps * once))))
        names = list(models)
        for i in range(rounds):
            for name in names[i % 3:] + names[: i % 3]:
                best[name] = min(best[name], _time(models[name], tokens, reps))
    return best


SHAPES = [  # (label, config, batch)
    ("listops-seed, batch 1 (overhead-bound)", bl.preset("listops-seed"), 1),
    ("listops-seed, batch 64", bl.preset("listops-seed"), 64),
    ("pre-norm GELU d256 x4 layers, T 64, batch 8",
     bl.ModelConfig(vocab_size=256, max_seq_len=64, d_model=256, n_heads=8, n_layers=4, d_ff=1024,
                    activation="gelu", norm_position="pre"), 8),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=150, help="interleaved timing rounds per shape")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (keep 1: the timer counts this thread's CPU time only)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"forward, no hooks attached: with hook points vs the same model without them "
          f"(best of up to {args.rounds} interleaved bursts, {args.threads} thread)")
    print(f"{'shape':46s} {'with hooks':>11s} {'without':>11s} {'ratio':>6s} {'control':>8s}")
    for label, config, batch in SHAPES:
        t = measure(config, batch, args.rounds)
        print(f"{label:46s} {t['hooked'] * 1e6:9.1f}us {t['plain'] * 1e6:9.1f}us "
              f"{t['hooked'] / t['plain']:6.3f} {t['copy'] / t['hooked']:8.3f}")
    print("ratio = with / without (1.000 = free); control = an identical copy / with hooks (noise)")


if __name__ == "__main__":
    main()
