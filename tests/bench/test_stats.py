"""blocklab/bench/stats.py: the timing rounds, and how they are read (median ratio, bootstrap interval,
decision), against hand computations on made-up numbers. No timed assertions."""

import pytest

from blocklab.bench.stats import (
    MET,
    NOT_MET,
    UNDECIDED,
    Bootstrap,
    decide,
    median_ratio,
    percentile_interval,
    time_rounds,
    within_round_ratios,
)


def test_time_rounds_runs_every_step_in_rotating_order() -> None:
    calls: list[str] = []
    steps = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "c")}
    times = time_rounds(steps, rounds=3, min_seconds=0.0, warmup=1, before_round=lambda: calls.append("|"))
    assert {name: len(t) for name, t in times.items()} == {"a": 3, "b": 3, "c": 3}
    # after warmup + calibration (6 calls): no step always runs first
    assert calls[6:] == ["|", "a", "b", "c", "|", "b", "c", "a", "|", "c", "a", "b"]


def test_within_round_ratios_and_their_median() -> None:
    assert within_round_ratios([2.0, 4.0, 9.0], [1.0, 1.0, 3.0]) == [2.0, 4.0, 3.0]
    assert median_ratio([2.0, 4.0, 9.0], [1.0, 1.0, 3.0]) == 3.0
    assert median_ratio([2.0, 4.0, 9.0, 1.0], [1.0, 1.0, 3.0, 1.0]) == 2.5  # even: mean of the middle two
    with pytest.raises(ValueError):
        within_round_ratios([1.0, 2.0], [1.0])  # rounds must pair up


def test_percentile_interval_by_hand() -> None:
    # 5 values, 80%: quantiles 0.1 and 0.9 sit at positions 0.4 and 3.6 of the sorted values
    assert percentile_interval([30.0, 10.0, 50.0, 20.0, 40.0], 0.8) == pytest.approx((14.0, 46.0), abs=1e-12)
    # 1..11, 90%: positions 0.5 and 9.5
    assert percentile_interval([float(v) for v in range(1, 12)], 0.9) == pytest.approx((1.5, 10.5), abs=1e-12)


def test_bootstrap_of_three_ratios_matches_its_exact_distribution() -> None:
    # Resampling 3 values a < b < c: the median is a when at least two draws are a,
    # P = 3 (1/3)^2 (2/3) + (1/3)^3 = 7/27; c likewise 7/27; b the rest, 13/27.
    bootstrap = Bootstrap(confidence=0.95, resamples=20_000, seed=0)
    medians = bootstrap.medians([1.2, 0.9, 1.0])
    assert set(medians.tolist()) == {0.9, 1.0, 1.2}
    for value, p in ((0.9, 7 / 27), (1.0, 13 / 27), (1.2, 7 / 27)):
        assert (medians == value).mean() == pytest.approx(p, abs=0.015)  # 4.5 standard errors
    # 95%: the 2.5% and 97.5% quantiles fall inside the masses of a and c
    assert bootstrap.interval([1.2, 0.9, 1.0]) == (0.9, 1.2)
    # 40%: the 30% and 70% quantiles both fall inside b's mass (7/27 = 0.26 < 0.3, 0.7 < 20/27 = 0.74)
    assert Bootstrap(confidence=0.4, resamples=20_000).interval([1.2, 0.9, 1.0]) == (1.0, 1.0)


def test_bootstrap_of_five_ratios_matches_its_exact_quantiles() -> None:
    # Resampling 5 values x1 < ... < x5: the median is <= x_k when at least 3 of 5 draws are, with
    # p = k/5 per draw: P(<= x1) = 10 p^3 q^2 + 5 p^4 q + p^5 = 0.058 (p = 0.2), P(<= x2) = 0.317,
    # P(<= x4) = 0.942. 80%: the 10% quantile is x2, the 90% one x4; 95%: x1 and x5.
    ratios = [1.03, 0.95, 1.10, 0.98, 1.00]
    assert Bootstrap(confidence=0.8, resamples=20_000).interval(ratios) == (0.98, 1.03)
    assert Bootstrap(confidence=0.95, resamples=20_000).interval(ratios) == (0.95, 1.10)


def test_bootstrap_is_seeded_and_validated() -> None:
    ratios = [1.0 + 0.01 * ((7 * r) % 13) for r in range(30)]
    assert Bootstrap(seed=3).interval(ratios) == Bootstrap(seed=3).interval(ratios)
    low, high = Bootstrap().interval(ratios)
    assert min(ratios) <= low <= median_ratio(ratios, [1.0] * 30) <= high <= max(ratios)
    with pytest.raises(ValueError, match=r"Bootstrap.confidence=1 must be between 0 and 1"):
        Bootstrap(confidence=1)
    with pytest.raises(ValueError, match=r"Bootstrap.resamples=0 must be at least 1"):
        Bootstrap(resamples=0)


@pytest.mark.parametrize(("low", "high", "decision"), [
    (1.01, 1.05, MET),
    (1.00, 1.05, MET),  # at the target counts: the target is ">="
    (0.97, 0.99, NOT_MET),
    (0.99, 1.02, UNDECIDED),  # straddles the target
    (0.95, 1.00, UNDECIDED),  # its top is at the target
])
def test_decide_reads_the_whole_interval(low, high, decision) -> None:
    assert decide(low, high, target=1.00) == decision
