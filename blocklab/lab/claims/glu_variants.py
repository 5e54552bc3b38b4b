"""glu-variants: GLU variants of the FFN (GEGLU, SwiGLU) beat ReLU and GELU at equal parameter count
(Shazeer 2020).

Character-level language modelling (the ``text`` task, every position scored, as the source's
perplexity), each FFN trained from the same seeds for the same fixed budget (no early stop); the
gated FFNs get 2/3 of the hidden width, so all four have the same parameters (within 0.2%). Each run's
lowest held-out loss (the source's one pass over C4 never overfits; a small text repeated does, and its
best point is the comparable one), paired by seed: each gated FFN beats each plain one, the margin the
seed noise of ReLU (a null arm).
"""

from __future__ import annotations

import math
from typing import Any

from matplotlib.figure import Figure

from ...nn.params import count_parameters
from ...nn.presets import preset
from ...tasks import get_task
from ..grid import RunSpec
from .base import Claim, Numbers, Results, Setup, Source, Verdict, from_tests, seed_count
from .shared import TRAIN_FULL, TRAIN_QUICK, arms_test, bars, null_margin, outcome, per_seed, seeded

NAME = "glu-variants"
PLAIN = ("relu", "gelu")
GATED = ("geglu", "swiglu")


def d_ff(p: dict[str, Any], activation: str) -> int:
    """4 d_model, or 2/3 of it for a gated FFN, whose third matrix would otherwise add half again (the
    source's 3072 -> 2048)."""
    width = 4 * p["d_model"]
    return 2 * width // 3 if activation in GATED else width


def runs(p: dict[str, Any], setup: Setup) -> list[RunSpec]:
    """The four FFNs on the text task, the same fixed budget, each seed."""
    arm = lambda act, null=False: seeded(
        NAME,
        setup,
        act,
        p,
        {"activation": act, "d_ff": d_ff(p, act)},
        null=null,
        task="text",
        target_accuracy=None,
    )
    return [spec for act in (*PLAIN, *GATED) for spec in arm(act)] + arm("relu", null=True)


def measure(p: dict[str, Any], setup: Setup, results: Results) -> Numbers:
    """Per FFN and seed: held-out loss at the budget (None: diverged), the lowest held-out loss of the run,
    the training loss at the budget; the FFN's parameters per block."""
    out: dict[str, Any] = {
        "arms": {act: outcome(per_seed(results, NAME, setup, act, p)) for act in (*PLAIN, *GATED)},
        "null": outcome(per_seed(results, NAME, setup, "relu", p, null=True)),
        "losses": {},
        "lowest": {},
        "train_losses": {},
        "ffn_parameters": {},
        "vocab_size": get_task("text").tokenizer.vocab_size,
    }
    for act in (*PLAIN, *GATED):
        rs = per_seed(results, NAME, setup, act, p)
        out["losses"][act] = [None if r["diverged"] else r["eval_loss"] for r in rs]
        out["lowest"][act] = [
            None if r["diverged"] else min(row["eval_loss"] for row in r["curve"] if "eval_loss" in row)
            for r in rs
        ]
        out["train_losses"][act] = [None if r["diverged"] else r["loss"] for r in rs]
        config = preset("listops-seed", **rs[0]["spec"]["model"])  # the FFN's count is the vocabulary's same
        out["ffn_parameters"][act] = count_parameters(config).per_layer["ffn"]
    return out


def _loss(x: float | None) -> float:
    return math.inf if x is None else x


def verdict(m: Numbers) -> Verdict:
    """m: {"arms": {act: arm}, "null": ReLU's null arm, "losses", "lowest", "ffn_parameters"}.

    Controls: the parameters are equal (within 1%: the claim's condition); every FFN learned (its lowest
    held-out loss below ln(vocabulary), a uniform guess, on most seeds). Tests: each gated FFN's lowest
    held-out loss beats each plain FFN's, paired by seed; the margin is ReLU's seed noise."""
    arms, params = m["arms"], m["ffn_parameters"]
    margin = null_margin(arms["relu"], m["null"], "loss", "ReLU's lowest held-out loss")
    tests = [
        arms_test(
            f"{gated}'s lowest held-out loss is below {plain}'s",
            "beats",
            arms[plain],
            arms[gated],
            "loss",
            "lower",
            margin,
        )
        for gated in GATED
        for plain in PLAIN
    ]
    spread = max(params.values()) / min(params.values()) - 1
    uniform = math.log(m["vocab_size"])
    learned = [
        (act, seed_count([x < uniform for x in arm["readings"]["loss"]["final"]]))
        for act, arm in arms.items()
    ]
    train = ", ".join(f"{act} {_median(xs):.3f}" for act, xs in m["train_losses"].items())
    return from_tests(
        tests,
        controls=[
            (
                f"the four FFNs have the same parameters within 1% (they differ by {spread:.2%})",
                spread < 0.01,
            ),
            (
                f"every FFN's lowest held-out loss is below a uniform guess's, ln(V) = {uniform:.2f} ("
                + ", ".join(f"{act}: {n}" for act, (_, n) in learned)
                + ")",
                all(ok for _, (ok, _) in learned),
            ),
        ],
        observations=[f"training loss at the budget (median over seeds): {train}"],
    )


def _median(xs: list[float | None]) -> float:
    return sorted(_loss(x) for x in xs)[len(xs) // 2]


def headline(m: Numbers) -> str:
    """Median lowest held-out loss over seeds per FFN."""
    return "lowest held-out loss (median): " + ", ".join(
        f"{act} {_median(xs):.4f}" for act, xs in m["lowest"].items()
    )


def plot(m: Numbers, fig: Figure) -> None:
    """The lowest held-out loss per seed for each FFN."""
    ax = fig.subplots()
    seeds = [f"seed {i}" for i in range(len(m["lowest"]["relu"]))]
    bars(ax, seeds, {act: m["lowest"][act] for act in m["lowest"]}, "lowest held-out loss of the run")
    low = min(_loss(x) for xs in m["lowest"].values() for x in xs)
    if math.isfinite(low):
        ax.set_ylim(bottom=0.95 * low)
    ax.set(title="FFN variants at equal parameter count (lower is better)")


SOURCE = Setup(
    "text-lm",
    "source",
    "a causal character-level language model (the text task: every position scored, as the source's "
    "perplexity) with blocklab's default init; the source does not restate one (T5's)",
)

CLAIM = Claim.of(
    __name__,
    name=NAME,
    kind="training",
    statement="GLU variants of the FFN (GEGLU, SwiGLU) beat ReLU and GELU at equal parameter count.",
    source=Source(
        "Shazeer 2020, 'GLU Variants Improve Transformer'",
        "sections 2-3 (Table 1: T5 pre-training perplexity)",
        "With d_ff reduced to 2048 (from 3072) to keep the parameter count and computation constant, the "
        "GEGLU and SwiGLU variants produce the best perplexities, below the ReLU and GELU FFNs.",
        "'the best perplexities, below the ReLU and GELU FFNs', read as: each gated FFN's lowest held-out "
        "loss beats each plain FFN's, paired by seed, beyond ReLU's seed noise",
        {
            "depth": "T5 base (12 encoder and 12 decoder layers)",
            "width": "d_model 768, d_ff 3072 (2048 for the GLU variants)",
            "init": "T5's (not restated in the paper)",
            "positions": "T5's relative position biases",
            "lr": "Adafactor, inverse square-root schedule",
            "warmup": "the schedule's first 10,000 steps constant",
            "steps": "65,536 steps of span-filling on C4",
        },
    ),
    method="Character-level language modelling on the text task (Coriolanus, 64-character windows, every "
    "position scored) with ReLU, GELU, GEGLU and SwiGLU FFNs, the gated ones at 2/3 of the hidden width so "
    "all have the same parameters, from the same 5 seeds for the same 600 steps (swept: 200 and 1,200; no "
    "early stop); each run's lowest held-out loss, paired by seed with a 95% t interval; the margin the seed "
    "noise of ReLU (5 other seeds). Scaled down: d_model 64, 2 layers, a 50 KB text instead of T5 base on "
    "C4.",
    setups=(
        SOURCE,
        SOURCE.but("xavier", "Xavier block weights instead of blocklab's default", init="xavier"),
        SOURCE.but(
            "short-budget",
            "a third of the steps (200), about three passes over the text: the budget the claim names no "
            "number for, swept",
            role="sweep",
            train={"steps": 200},
        ),
        SOURCE.but(
            "long-budget",
            "2x the steps (1,200): the source trained 65,536, and a gated FFN may start slower",
            role="sweep",
            train={"steps": 1200},
        ),
    ),
    quick={**TRAIN_QUICK, "batch_size": 32},
    full={**TRAIN_FULL, "batch_size": 32},
    notes=(
        "On the text language model (the source setup: the paper's comparison at equal parameter count, "
        "scaled down) GEGLU and SwiGLU end with a higher lowest held-out loss than ReLU and GELU, not a "
        "lower one: 2.099 and 2.099 against 2.054 and 2.055 (medians; paired +0.037 to +0.040 nats, every "
        "interval above zero). The rule for 'beats' fails, robust, and so it does with Xavier weights "
        "(+0.047 to +0.055) and at the long budget (three of four fail, SwiGLU against ReLU "
        "inconclusive). At the short budget all four are within 0.004 nats of each other, inside the seed "
        "noise (0.033): no difference worth the word, which the rule also counts as failing 'beats'. What "
        "the gated FFNs do better here is fit the training text: their training loss at the budget is "
        "1.32 against 1.51 (source setup), 0.50 against 0.86 at the long budget; on held-out text that is "
        "overfitting at this size. The earlier record's 'holds' rested on the short budget alone."
    ),
)
