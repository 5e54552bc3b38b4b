"""The exact claims the tutorials' statements became (issue 36): each measurement against an independent
oracle (hand arithmetic, torch), and the verdict it gives."""

import numpy as np
import pytest
import torch

from blocklab.lab.claims import (
    attention_overwrite,
    ffn_share,
    gamma_beta_undo,
    identity_block,
    layernorm_invariance,
    residual_formula,
)


def _exact_setup(claim):
    return claim.CLAIM.setups[0]


def test_ffn_share_of_gpt2_small_is_the_published_arithmetic():
    # GPT-2 small: 12 blocks of an FFN 768 -> 3072 -> 768 with biases, of 124,439,808 parameters in all
    ffn = 12 * (2 * 768 * 3072 + 3072 + 768)
    blocks = 12 * (ffn // 12 + 4 * 768 * 768 + 4 * 768 + 4 * 768)
    m = ffn_share.measure({}, _exact_setup(ffn_share), {})
    assert m["presets"]["gpt2"]["of_all"] == pytest.approx(ffn / 124_439_808, rel=1e-12)
    assert m["presets"]["gpt2"]["of_blocks"] == pytest.approx(ffn / blocks, rel=1e-12)
    v = ffn_share.verdict(m)
    assert v.verdict == "fails" and v.checks[0]["outcome"] == "fails"  # 45.5% does not round to 60%


def test_ffn_share_holds_for_a_share_that_rounds_to_sixty_percent():
    m = {
        "presets": {
            "gpt2": {"of_all": 0.5501, "of_blocks": 0.6},
            "gpt3-175b": {"of_all": 0.6499, "of_blocks": 0.6},
        },
        "tested": ["gpt2", "gpt3-175b"],
    }
    assert ffn_share.verdict(m).verdict == "holds"
    m["presets"]["gpt2"]["of_all"] = 0.549
    assert ffn_share.verdict(m).verdict == "fails"


def test_residual_formula_two_layers_by_hand():
    """x2 = (I + W1)(I + W0) x0, so the Jacobian is (I + W1)(I + W0) = I + W0 + W1 + W1 W0, not I + W1 W0."""
    m = residual_formula.measure({"d": 3, "depths": [1, 2]}, _exact_setup(residual_formula), {})
    one, two = m["rows"]
    assert one["tutorials_error"] < 1e-12 and one["product_error"] < 1e-12  # one layer: both are I + W
    assert two["product_error"] < 1e-12 and two["tutorials_error"] > 0.01
    assert residual_formula.verdict(m).verdict == "fails"


def test_identity_block_pre_norm_passes_its_input_and_post_norm_does_not():
    m = identity_block.measure({"d_model": 16, "batch": 4}, _exact_setup(identity_block), {})
    assert m["pre"] == [0.0] * len(m["pre"])  # torch: x + 0 + 0 is x exactly
    assert m["post"][0] > 0.1  # the first norm after a sum still acts (later ones see normalized input)
    assert identity_block.verdict(m).verdict == "holds"


def test_gamma_beta_undo_one_position_but_not_positions_with_their_own_scales():
    x = torch.tensor([[1.0, 2.0, 4.0]], dtype=torch.float64)
    assert gamma_beta_undo.undo_error(x) < 1e-9  # one position: gamma_j, beta_j can hit each value
    # positions with their own means and scales: the best per-feature gamma and beta by numpy's own least
    # squares (LAPACK gelsd), an independent solver, leave the same error
    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 8, dtype=torch.float64, generator=g) * torch.rand(
        32, 1, dtype=torch.float64, generator=g
    )
    x = x + 3 * torch.randn(32, 1, dtype=torch.float64, generator=g)
    z = ((x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-12)).numpy()
    back = np.empty_like(z)
    for j in range(z.shape[1]):
        design = np.stack([z[:, j], np.ones(len(z))], axis=1)
        back[:, j] = design @ np.linalg.lstsq(design, x[:, j].numpy(), rcond=None)[0]
    expected = np.linalg.norm(back - x.numpy()) / np.linalg.norm(x.numpy())
    assert gamma_beta_undo.undo_error(x) == pytest.approx(expected, rel=1e-9) and expected > 0.05
    m = gamma_beta_undo.measure({"positions": 64, "d_model": 16}, _exact_setup(gamma_beta_undo), {})
    assert gamma_beta_undo.verdict(m).verdict == "fails"


def test_attention_overwrite_erases_the_component_along_u():
    m = attention_overwrite.measure(
        {"d_model": 8, "tokens": 3, "draws": 3}, _exact_setup(attention_overwrite), {}
    )
    for row in m["rows"]:
        assert (
            abs(row["along_after"]) < 1e-12 and abs(row["along_before"]) > 1e-3 and row["rest_change"] < 1e-12
        )
    assert attention_overwrite.verdict(m).verdict == "fails"


def test_layernorm_invariance_against_its_tolerance(threshold):
    numbers = lambda batch: {
        "standard": {"batch_change": batch, "mode_change": 0.0},
        "batch": {"batch_change": 0.5, "mode_change": 0.5},
    }
    threshold(layernorm_invariance.verdict, numbers(1e-5), numbers(1.1e-5), 0)
    m = layernorm_invariance.measure({"d_model": 16, "batch": 4}, _exact_setup(layernorm_invariance), {})
    assert m["standard"]["batch_change"] < 1e-5 and m["batch"]["batch_change"] > 1e-3
    assert layernorm_invariance.verdict(m).verdict == "holds"
