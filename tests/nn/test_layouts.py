"""Tests for blocklab.nn.layouts: the table every layout is one row of, and what is derived from it.

The block built from each row is checked against a float64 hand forward in tests/nn/test_hooks.py
(every stage, every layout); here: the table's own rules and the lean registry that keys on it.
"""

from __future__ import annotations

import copy
import re

import pytest
import torch

from blocklab.nn.block import LEAN_PATHS
from blocklab.nn.config import LEAN_NORM_POSITIONS, NORM_POSITIONS, ModelConfig
from blocklab.nn.layouts import LAYOUTS, Layout, Norm, Sublayer, Sum
from blocklab.nn.model import Transformer


def test_every_layout_marked_lean_has_a_registered_lean_path_and_no_other_does() -> None:
    assert set(LEAN_PATHS) == {name for name, layout in LAYOUTS.items() if layout.lean}
    assert set(LEAN_NORM_POSITIONS) == set(LEAN_PATHS)


def test_the_config_takes_its_layout_names_and_final_norm_rule_from_the_table() -> None:
    assert NORM_POSITIONS == tuple(LAYOUTS)
    for name, layout in LAYOUTS.items():
        assert ModelConfig(norm_position=name).final_norm is layout.final_norm
        assert ModelConfig(norm_position=name, norm="none").final_norm is False


def test_only_a_layout_that_normalises_the_stream_takes_deepnorm() -> None:
    assert [name for name, layout in LAYOUTS.items() if layout.norm_on_stream] == ["post", "simplified"]
    ModelConfig(residual="deepnorm", norm_position="post")
    ModelConfig(residual="deepnorm", norm_position="simplified")
    for name in ("pre", "sandwich", "parallel", "parallel_shared"):
        with pytest.raises(ValueError, match=f"norm_position='{name}' must be one that does: 'post', "
                                             "'simplified'"):
            ModelConfig(residual="deepnorm", norm_position=name)


def test_connections_say_which_stage_each_sublayer_adds_to_which_stream() -> None:
    post, parallel = LAYOUTS["post"].connections, LAYOUTS["parallel"].connections
    assert (post["ffn"].x, post["ffn"].branch, post["ffn"].out) == ("ln1", "ffn.out", "resid_post")
    assert LAYOUTS["sandwich"].connections["attn"].branch == "ln1_out"  # through its output norm
    assert parallel["attn"].x == parallel["ffn"].x == "resid_pre"
    assert parallel["attn"].out == parallel["ffn"].out == "resid_post"
    assert parallel["attn"].others == ("ffn.out",) and parallel["ffn"].others == ("attn.out",)
    assert LAYOUTS["parallel_shared"].norms == ("ln1",)
    assert LAYOUTS["parallel_shared"].sublayer("ffn").reads == "ln1"
    assert LAYOUTS["parallel"].residuals == ("res1",) and LAYOUTS["pre"].residuals == ("res1", "res2")
    # the simplified block: attention feeds the FFN, whose one sum carries both; attention has no sum itself
    simplified = LAYOUTS["simplified"].connections
    assert list(simplified) == ["ffn"] and simplified["ffn"].x == "resid_pre"
    assert (simplified["ffn"].branch, simplified["ffn"].out) == ("ffn.out", "resid_post")


def test_the_output_is_the_last_steps_stage() -> None:
    assert {name: layout.output for name, layout in LAYOUTS.items()} == {
        "post": "ln2", "pre": "resid_post", "sandwich": "resid_post", "parallel": "resid_post",
        "parallel_shared": "resid_post", "res_post": "resid_post", "simplified": "ln1"}


@pytest.mark.parametrize("steps, unknown", [
    ((Sublayer("attn", "ln1"), Norm("ln1", "resid_pre")), "['ln1']"),  # read before it is computed
    ((Norm("ln1", "resid_pre"), Sublayer("attn", "ln1"), Sum("out", "resid_pre", ("ffn.out",), "res1")),
     "['ffn.out']"),
])
def test_a_row_that_reads_a_stage_no_earlier_step_computes_is_refused(steps: tuple, unknown: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"reads {unknown}, not computed before it")):
        Layout("broken", "", "broken: ?", steps, final_norm=True)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_a_copied_block_runs_its_own_modules(name: str) -> None:
    """The module path's steps are functions of the block they are given, not closures over the block
    that built them: a deep copy, changed, computes with its own weights (and dtype)."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(norm_position=name, d_model=16, n_heads=2, d_ff=32)).eval()
    tokens = torch.randint(0, 18, (2, 8))
    twin = copy.deepcopy(model).double()
    with torch.no_grad():
        torch.testing.assert_close(twin(tokens), model(tokens).double(), rtol=1e-5, atol=1e-5)
        for p in twin.blocks.parameters():
            p.mul_(1.5)
        assert not torch.allclose(twin(tokens), model(tokens).double(), atol=1e-3)


# ---- the block as it is: layout, residual kind and norm kind (issue 40 item 3) --------------------------

# The formulas the docs and the tutorials write by hand, typed here: what the steps must give back
WRITTEN = {
    "post": "post-norm: y = LN1(x + MHA(x)), z = LN2(y + FFN(y))",
    "pre": "pre-norm: y = x + MHA(LN1(x)), z = y + FFN(LN2(y))",
    "sandwich": "sandwich: y = x + LN1_out(MHA(LN1(x))), z = y + LN2_out(FFN(LN2(y)))",
    "res_post": "res-post: y = x + LN1_out(MHA(x)), z = y + LN2_out(FFN(y))",
    "parallel": "parallel: z = x + MHA(LN1(x)) + FFN(LN2(x))",
    "parallel_shared": "parallel, one norm: z = x + MHA(LN1(x)) + FFN(LN1(x))",
    "simplified": "simplified: z = LN1(x + FFN(MHA(x)))",
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_each_layouts_formula_is_built_from_its_steps(name):
    assert LAYOUTS[name].formula == WRITTEN[name] == ModelConfig(norm_position=name).block_formula


@pytest.mark.parametrize(("fields", "formula"), [
    ({"norm_position": "post", "residual": "none"},
     "post-norm, no residual: y = LN1(MHA(x)), z = LN2(FFN(y))"),
    ({"norm_position": "pre", "residual": "rezero", "norm": "none"},
     "no norm, ReZero: y = x + α·(MHA(x)), z = y + α·(FFN(y))"),
    ({"norm_position": "post", "residual": "deepnorm"},
     "post-norm, DeepNorm: y = LN1(α·x + MHA(x)), z = LN2(α·y + FFN(y))"),
    ({"norm_position": "pre", "norm": "rms"},
     "pre-norm, RMSNorm: y = x + MHA(RMS1(x)), z = y + FFN(RMS2(y))"),
    ({"norm_position": "parallel", "residual": "none"},
     "parallel, no residual: z = MHA(LN1(x)) + FFN(LN2(x))"),
    ({"norm_position": "simplified", "residual": "none"}, "simplified, no residual: z = LN1(FFN(MHA(x)))"),
])
def test_a_blocks_title_and_formula_say_its_residual_and_norm_kinds(fields, formula):
    """Issue 40: trace --residual none printed the post-norm formula with its sums, as if x were added."""
    assert ModelConfig(**fields).block_formula == formula
