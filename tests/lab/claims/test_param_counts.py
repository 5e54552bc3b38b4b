"""param-counts: every count equal three ways, and the measurement."""

from blocklab.lab.claims import param_counts as claim


def numbers(built=128):
    return {"items": [{"name": "LayerNorm", "expected": 128, "built": built, "analytic": 128}]}


def test_equal_three_ways(threshold):
    threshold(claim.verdict, numbers(128), numbers(129), 0)


def test_the_worked_examples_hold():
    m = claim.measure({}, claim.CLAIM.setups[0], {})
    assert [r["expected"] for r in m["items"]] == [128, 33_088, 16_384, 124_439_808]
    assert claim.verdict(m).verdict == "holds"
