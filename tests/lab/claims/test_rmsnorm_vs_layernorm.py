"""rmsnorm-vs-layernorm's rule over seeds (RMSNorm no later than one evaluation after LayerNorm), the
cost check, inconclusive when LayerNorm does not train, and the two norms written out against torch's."""

import torch
import torch.nn.functional as F

from blocklab.lab.claims import rmsnorm_vs_layernorm as claim


def numbers(arm, ln=(100, 100, 125), rms=(100, 125, 150), written=0.8):
    acc = lambda steps: [0.5 if s is None else 0.995 for s in steps]
    return {"standard": arm(acc(ln), list(ln)), "rms": arm(acc(rms), list(rms)),
            "cost": {"written": written, "blocklab": 1.3}, "eval_every": 25}  # fmt: skip


def test_like_means_no_later_than_one_evaluation_on_most_seeds(arm, threshold):
    threshold(claim.verdict, numbers(arm, rms=(125, 125, 200)), numbers(arm, rms=(125, 150, 200)), 0)
    assert not claim.verdict(numbers(arm, rms=(None, None, 100))).checks[0]["ok"]  # not reached: later


def test_lower_cost_written_alike(arm, threshold):
    threshold(claim.verdict, numbers(arm, written=0.99), numbers(arm, written=1.0), 1)
    assert "1.30x" in claim.verdict(numbers(arm)).observations[0]  # blocklab's kernels: beside the verdict


def test_inconclusive_when_layernorm_does_not_reach_the_target(arm):
    assert claim.verdict(numbers(arm, ln=(None, None, 100))).verdict == "inconclusive"


def test_the_written_norms_are_torchs():
    x, w, b = (
        torch.randn(5, 16, dtype=torch.float64),
        torch.rand(16, dtype=torch.float64),
        torch.randn(16, dtype=torch.float64),
    )
    torch.testing.assert_close(claim._layer_norm(x, w, b), F.layer_norm(x, (16,), w, b, claim.EPS))
    torch.testing.assert_close(claim._rms_norm(x, w, b), F.rms_norm(x, (16,), w, claim.EPS))


def test_costs_are_ratios_of_measured_times():
    cost = claim.norm_costs(16, 32, 3)
    assert set(cost) == {"written", "blocklab"} and all(0 < v < 100 for v in cost.values())
