"""The benchmark scripts' own machinery, which their printed ratios rest on (no timing here)."""

import importlib.util
from pathlib import Path

import pytest
import torch

import blocklab as bl
from blocklab.hooks import HookPoint

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"


def _load(name: str):  # noqa: ANN202
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("fields", [
    {"norm_position": "pre", "fused": True}, {"norm_position": "post", "fused": True},
    {"norm_position": "pre", "fused": False}, {"norm_position": "sandwich"},
])
@pytest.mark.parametrize("grad", [False, True])
def test_hooks_overhead_peer_touches_no_hook_point_and_agrees(fields, grad, monkeypatch) -> None:
    """benchmarks/hooks_overhead.py's peer: the same model whose forward never reaches a hook point
    (counted by wrapping every HookPoint entry), giving the hooked model's output exactly."""
    hooks_overhead = _load("hooks_overhead")
    config = bl.ModelConfig(vocab_size=20, max_seq_len=8, d_model=16, n_heads=2, n_layers=2, d_ff=32,
                            activation="gelu", **fields)
    torch.manual_seed(0)
    model = bl.Transformer(config).train(grad)
    plain = hooks_overhead.without_hooks(model)
    tokens = torch.randint(0, 20, (2, 8))
    calls = {"n": 0}
    for name in ("__call__", "see", "observe"):
        original = getattr(HookPoint, name)

        def counted(*args, _original=original, **kwargs):  # noqa: ANN002, ANN003, ANN202
            calls["n"] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(HookPoint, name, counted)
    with torch.set_grad_enabled(grad):
        expected = model(tokens)
        hooked_calls = calls["n"]
        calls["n"] = 0
        got = plain(tokens)
    assert hooked_calls > 0 and calls["n"] == 0
    assert torch.equal(got, expected)
    assert model.blocks[0].uses_lean_path == plain.blocks[0].uses_lean_path  # the same wiring ran
