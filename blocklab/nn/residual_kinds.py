"""Each residual kind (``ModelConfig.residual``) as one record: how its sum reads in a block's formula and
title, and whether the stream's identity path survives it. Torch-free: the config, the tracer and explore
read it; ``block.Residual`` computes it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ResidualKind:
    """One ``ModelConfig.residual`` value."""

    name: str  # the ModelConfig.residual value
    label: str  # the kind in a block's title ("" for the plain sum every layout's title assumes)
    sum: str  # the sum in a block's formula, of the stream {x} and the branches {f}
    node: str  # the sum's node in explore's diagram
    identity_path: bool = True  # x reaches the sum's output (False: the branch replaces the stream)


RESIDUAL_KINDS: dict[str, ResidualKind] = {
    kind.name: kind for kind in (
        ResidualKind("add", "", "{x} + {f}", "+"),
        ResidualKind("rezero", "ReZero", "{x} + α·({f})", "+α"),  # a learned α per sum, from 0
        ResidualKind("deepnorm", "DeepNorm", "α·{x} + {f}", "α+"),  # α = (2N)^(1/4)
        ResidualKind("none", "no residual", "{f}", "=", identity_path=False),
    )
}
