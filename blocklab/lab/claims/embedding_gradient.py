"""embedding-gradient: post-norm gives the embeddings a stronger gradient signal than pre-norm (the block
tutorials).

At initialization, per seed, the same weights in a post-norm and a pre-norm stack (``stack``), causal,
every position scored: log10 of the token embedding's gradient norm, post over pre, beats 0; the margin is
the seed noise of the post-norm stack (null seeds).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from matplotlib.figure import Figure

from ...nn.model import Transformer
from .base import Claim, Numbers, Results, Setup, Source, Verdict, from_tests
from .rules import compare, noise
from .shared import NULL_SEED, every_token_batch, fresh_model, g2


def stack(p: dict[str, Any], setup: Setup, seed: int, position: str) -> Transformer:
    """A causal stack with the norms at ``position`` and the pre-norm stack's weights of ``seed`` (a post-norm
    stack has the same parameters but the final norm, which at init is the identity), so the two positions
    of one seed differ only in where the norms sit."""
    drawn = fresh_model(p, setup, seed, causal=True, n_layers=p["depth"], norm_position="pre")
    model = fresh_model(p, setup, seed, causal=True, n_layers=p["depth"], norm_position=position)
    own = model.state_dict()
    model.load_state_dict({k: v for k, v in drawn.state_dict().items() if k in own})
    return model


def embedding_grad(p: dict[str, Any], setup: Setup, seed: int, position: str) -> float:
    """||dL/dE|| of the token embedding of ``stack`` at init, every position scored."""
    model = stack(p, setup, seed, position)
    inputs, targets = every_token_batch(p["batch"])
    logits = model(inputs)  # (B, T, vocab)
    F.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()
    return float(model.embed.weight.grad.norm())


def measure(p: dict[str, Any], setup: Setup, results: Results) -> Numbers:
    """log10 of the embedding's gradient norm per seed for both positions, and post-norm's from the null
    seeds."""
    log = lambda seed, pos: math.log10(embedding_grad(p, setup, seed, pos))
    with torch.enable_grad():
        return {
            "depth": p["depth"],
            "post": [log(s, "post") for s in range(p["seeds"])],
            "pre": [log(s, "pre") for s in range(p["seeds"])],
            "null": [log(NULL_SEED + s, "post") for s in range(p["seeds"])],
        }


def verdict(m: Numbers) -> Verdict:
    """The embedding's log10 gradient norm is higher with post-norm than with pre-norm, paired by seed."""
    margin = noise(
        m["post"],
        m["null"],
        "log10 ||dL/dE|| of the post-norm stack",
        floor=0.01,
        floor_words="a hundredth of a decade",
    )
    return from_tests(
        [
            compare(
                f"post-norm's token embedding gets a larger gradient than pre-norm's ({m['depth']} blocks)",
                "beats",
                (m["pre"], m["post"]),
                "higher",
                margin,
            )
        ]
    )


def headline(m: Numbers) -> str:
    """The median ratio post/pre."""
    ratios = sorted(a - b for a, b in zip(m["post"], m["pre"], strict=True))
    return f"||dL/dE|| post / pre: x{g2(10 ** ratios[len(ratios) // 2])} (median over seeds)"


def plot(m: Numbers, fig: Figure) -> None:
    """The gradient norm per seed, both positions."""
    ax = fig.subplots()
    seeds = range(len(m["post"]))
    ax.plot(seeds, [10**v for v in m["post"]], "o", label="post-norm")
    ax.plot(seeds, [10**v for v in m["pre"]], "x", label="pre-norm")
    ax.set(yscale="log", xlabel="seed", ylabel="||dL/dE||", title="the token embedding's gradient at init")
    ax.legend(fontsize="small")


SOURCE = Setup(
    "torch-init", "source", "blocklab's listops model with its default init: the tutorials state none"
)

CLAIM = Claim.of(
    __name__,
    name="embedding-gradient",
    kind="init",
    statement="Post-norm gives a stronger gradient signal to the embeddings than pre-norm.",
    source=Source(
        "the block tutorials this project implements (the pre-norm / post-norm tutorial)",
        "post-norm's advantages",
        "Post-norm: stronger gradient signal to the embeddings.",
        "'stronger gradient signal', read as: the token embedding's gradient norm at initialization is "
        "larger "
        "with post-norm than with pre-norm, paired by seed (the same weights), beyond the seed noise (log10)",
    ),
    method="At initialization, 5 seeds, a 6-block causal listops model with every position scored on 64 "
    "sequences, the same weights placed post-norm and pre-norm: log10 of ||dL/dE||, post minus pre, with a "
    "95% t interval; the margin the seed noise of post-norm (5 other seeds).",
    setups=(
        SOURCE,
        SOURCE.but("xavier", "Xavier block weights", init="xavier"),
        SOURCE.but("default-init", "GPT-2's N(0, 0.02) block weights", init="default"),
    ),
    quick={"d_model": 32, "batch": 16, "depth": 2, "seeds": 2},
    full={"d_model": 64, "batch": 64, "depth": 6, "seeds": 5},
    notes=(
        "The token embedding's gradient norm is the same in post-norm and pre-norm stacks of 6 blocks "
        "with PyTorch's init and with GPT-2's (ratio 1.00; paired log ratios +0.0009 and +0.0003 against "
        "margins of 0.07 and 0.08), and smaller in post-norm with Xavier weights (0.76). Nothing here "
        "gives post-norm's embeddings a stronger signal: the tutorial's sentence fails in all three "
        "setups."
    ),
)
