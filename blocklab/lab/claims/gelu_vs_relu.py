"""gelu-vs-relu: GELU matches or beats ReLU (Hendrycks and Gimpel 2016).

Steps to 99% held-out on listops within the same budget, ReLU and GELU from the same seeds (the
same initial weights and data order), paired by seed: GELU needs at most ReLU's steps (``at least``,
non-inferiority), the margin the seed noise of ReLU (a null arm), at least one evaluation. The extra
cost the tutorials call small is measured (the median forward+backward time of a GELU FFN over a ReLU
one, interleaved in one process) and shown, not scored: "small" states no number.
"""

from __future__ import annotations

from typing import Any

import torch
from matplotlib.figure import Figure

from ...nn.feedforward import FeedForward
from ..grid import RunSpec
from .base import Claim, Numbers, Results, Setup, Source, Verdict, from_tests, seed_count
from .shared import (
    TRAIN_FULL,
    TRAIN_QUICK,
    arms_test,
    median_seconds,
    null_margin,
    outcome,
    per_seed,
    reach_text,
    reached,
    seeded,
    steps_bars,
)

NAME = "gelu-vs-relu"
ACTIVATIONS = ("relu", "gelu")


def runs(p: dict[str, Any], setup: Setup) -> list[RunSpec]:
    """ReLU and GELU, same budget, each seed; ReLU from the null seeds."""
    arm = lambda act, null=False: seeded(NAME, setup, act, p, {"activation": act}, null=null)
    return [spec for act in ACTIVATIONS for spec in arm(act)] + arm("relu", null=True)


def ffn_time_ratio(d_model: int = 256, tokens: int = 512, reps: int = 20) -> float:
    """Median forward+backward time of a GELU FFN over a ReLU one, interleaved in one process."""
    torch.manual_seed(0)
    x = torch.randn(tokens, d_model)
    ffns = {act: FeedForward(d_model, 4 * d_model, act) for act in ACTIVATIONS}
    times = median_seconds(ffns, x, reps)
    return times["gelu"] / times["relu"]


def measure(p: dict[str, Any], setup: Setup, results: Results) -> Numbers:
    """Per activation and seed: final accuracy, steps to target; the FFN time ratio."""
    out: dict[str, Any] = {act: outcome(per_seed(results, NAME, setup, act, p)) for act in ACTIVATIONS}
    out["null"] = outcome(per_seed(results, NAME, setup, "relu", p, null=True))
    out["time_ratio"] = ffn_time_ratio(*p["timing"])
    return out


def verdict(m: Numbers) -> Verdict:
    """m: {"relu": arm, "gelu": arm, "null": ReLU's null arm, "time_ratio": gelu/relu} (``shared.outcome``).

    Control: at least one activation reaches the target on most seeds (else neither speed says anything).
    Test: GELU's steps to the target match or beat ReLU's (``at least``), paired by seed."""
    relu, gelu = m["relu"], m["gelu"]
    margin = null_margin(relu, m["null"], "steps", "ReLU's steps to the target")
    relu_ok, relu_n = seed_count(reached(relu))
    gelu_ok, gelu_n = seed_count(reached(gelu))
    return from_tests(
        [
            arms_test(
                "GELU reaches the target in no more steps than ReLU",
                "at least",
                relu,
                gelu,
                "steps",
                "lower",
                margin,
            )
        ],
        controls=[(f"ReLU ({relu_n}) or GELU ({gelu_n}) reaches the target", relu_ok or gelu_ok)],
        observations=[
            f"GELU's FFN forward+backward costs {m['time_ratio']:.2f}x ReLU's: the tutorials' 'small "
            "extra cost' states no number, so it is shown, not scored"
        ],
    )


def headline(m: Numbers) -> str:
    """Seeds reaching the target and median steps for each activation; the time ratio."""
    return f"ReLU {reach_text(m['relu'])}, GELU {reach_text(m['gelu'])}, GELU time {m['time_ratio']:.2f}x"


def plot(m: Numbers, fig: Figure) -> None:
    """Steps to target per seed, ReLU next to GELU (a missing bar: not reached within the budget)."""
    ax = fig.subplots()
    steps_bars(ax, {"ReLU": m["relu"], "GELU": m["gelu"]})
    ax.set(title=f"ReLU vs GELU (GELU FFN step time {m['time_ratio']:.2f}x ReLU's)")


SOURCE = Setup(
    "torch-init",
    "source",
    "blocklab's listops model with its default init (PyTorch's nn.Linear variance): the source does not "
    "restate one",
)

CLAIM = Claim.of(
    __name__,
    name=NAME,
    kind="training",
    statement="GELU matches or beats ReLU.",
    source=Source(
        "Hendrycks and Gimpel 2016, 'Gaussian Error Linear Units (GELUs)'",
        "section 3 (experiments)",
        "Across the tasks tried (MNIST, TIMIT, CIFAR-10/100, Twitter POS tagging) GELU matched or beat ReLU "
        "and ELU; tutorials add that the extra cost is small.",
        "'matched or beat', read as non-inferiority (at least): GELU's steps to 99% held-out are no more "
        "than "
        "ReLU's beyond the seed noise, paired by seed; the cost, 'small' with no number, is shown, not "
        "scored",
        {
            "depth": "e.g. 8-layer fully connected networks on MNIST",
            "width": "e.g. 128 units (MNIST)",
            "init": "not restated here",
            "positions": "none",
            "lr": "Adam, tuned per task",
            "warmup": "none",
            "steps": "tens of epochs",
        },
    ),
    method="Steps to 99% held-out on listops within the same 600-step budget (a run that does not reach it "
    "counts one evaluation past the budget), ReLU and GELU from the same 5 seeds (the same initial weights "
    "and data order), paired by seed with a 95% t interval; the margin the seed noise of ReLU (5 other "
    "seeds), at least one evaluation (25 steps). The cost, the median forward+backward time of a GELU FFN "
    "over a ReLU one interleaved in one process, is an observation.",
    setups=(
        SOURCE,
        SOURCE.but("xavier", "Xavier block weights instead of blocklab's default", init="xavier"),
    ),
    # timing: the FFN the cost is measured on (d_model, tokens, interleaved repetitions)
    quick={**TRAIN_QUICK, "timing": [256, 512, 20]},
    full={**TRAIN_FULL, "timing": [256, 512, 20]},
    notes=(
        "Both reach 99% held-out on 5 of 5 seeds in both setups, so the comparison is the steps each "
        "needs, read every 25 steps. With blocklab's init (the source setup) GELU needs 125 steps where "
        "ReLU needs 100 (medians; paired +15, interval -2 .. +32): the interval reaches beyond the "
        "one-evaluation margin of 25, so 'at least as fast' is neither shown nor refuted: inconclusive "
        "(at twice the margin it holds). With Xavier weights both need 125 (paired -5) and the seed noise "
        "is larger (margin 74): holds. GELU is not shown to train better or worse here; its FFN costs "
        "about 5% more per forward and backward, shown as an observation because the tutorials give no "
        "number for 'small'."
    ),
)
