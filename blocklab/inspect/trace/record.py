"""What a trace holds: the ``Trace`` of one input and its ``Stage``s (numbers and words).

``collect.py`` fills them in (``operands.py`` the ``Operands``), ``explain.py`` adds the words, ``text.py``
and ``html.py`` show them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from ...nn.config import ModelConfig
from ...nn.embedding import EmbeddingParts

MAX_COLUMNS = 512  # a page shows at most this many features of a stage (vocabularies can be 50k wide)
STAT_NAMES: tuple[str, ...] = ("mean", "var", "std", "min", "max", "l2")
# stages whose features are heads side by side: a row is head 0's d_k (or d_model) values, then head 1's, ...
PER_HEAD_KINDS: tuple[str, ...] = ("attn.q", "attn.k", "attn.v", "attn.z", "attn.result")


@dataclass
class NormNumbers:
    """What a LayerNorm computed, one row per position of its stage: its input x (P, d); mu, var, denom
    (P,); z_hat (P, d) before gamma/beta; the measured mean and variance of z_hat and the variance it must
    have, var / denom^2 (= var / (var + eps) for the standard variant); gamma and beta (d,), None where the
    norm has none."""

    variant: str
    eps: float
    input_l2: Tensor
    mu: Tensor
    var: Tensor
    denom: Tensor
    z_hat: Tensor
    z_hat_mean: Tensor
    z_hat_var: Tensor
    expected_var: Tensor
    x: Tensor | None = None
    gamma: Tensor | None = None
    beta: Tensor | None = None


@dataclass
class Operands:
    """How a stage's numbers were computed: ``kind`` (sum, act, gated, softmax, dot, qk, mix, head_dot) and
    the stages it reads, in the formula's order. ``function``: the activation (act) or the gate (gated).

    gated: ``gate`` (P, F) gate(hidden), which is no stage. The products (dot, qk, mix) are sums of ``n``
    terms a_i b_i: per number the ``TERMS`` largest terms' ``index`` i, ``x`` a_i and ``w`` b_i (..., K)
    and ``rest`` the other terms' sum. dot (P, C, K): a_i the input's feature i, b_i = W[j, i];
    ``weight`` and ``bias`` name the matrix and the bias; ``columns`` the output features covered (None:
    all); ``bias_values`` (C,) or None. qk (h, P, T, K): q_i k_i of one head, the sum divided by
    ``scale`` = sqrt(d_k). mix (P, h d_k, K): i is a key, a_i its weight, b_i v's feature there. head_dot
    (P, C, K), a head's result: i is a feature of head h, a_i = z[t, h d_k + i], b_i = Wo[j, h d_k + i]."""

    kind: str
    reads: list[str]
    function: str = ""
    gate: Tensor | None = None
    weight: str = ""
    bias: str = ""
    columns: list[int] | None = None
    n: int = 0
    index: Tensor | None = None
    x: Tensor | None = None
    w: Tensor | None = None
    rest: Tensor | None = None
    bias_values: Tensor | None = None
    scale: float = 0.0


@dataclass
class Stage:
    """One stage of the trace. ``rows`` (P, F) holds the vector at each position in
    ``positions``; ``stats[name]`` (P,) the statistics over its F features (non-finite
    entries, such as masked attention scores, left out and counted in ``masked``)."""

    name: str
    kind: str
    block: int | None
    shape: tuple[int, ...]
    positions: list[int]
    rows: Tensor
    stats: dict[str, Tensor]
    columns: list[str] | None = None  # labels of the F features when they mean something (vocab)
    norm: NormNumbers | None = None
    norm_module: str = ""  # the norm's class and variant ("" when the stage is no norm)
    frac_le_zero: Tensor | None = None  # FFN stages: fraction of units <= 0 per position
    heads: Tensor | None = None  # attention scores/weights: (h, P, T), one query row per position
    parts: EmbeddingParts | None = None  # the embed stage: ||tok||, ||pos|| and the token share (P,)
    masked: Tensor | None = None  # (P,) entries left out of the statistics (-inf scores)
    operands: Operands | None = None  # how its numbers were computed from other stages (operands.py)
    explanation: str = ""

    @property
    def short(self) -> str:
        """The stage name within its block: ``blocks.0.attn.q`` -> ``attn.q``."""
        return self.name.split(".", 2)[2] if self.block is not None else self.name


@dataclass
class TopK:
    """The k most likely next tokens read from one vector: ``stage`` (``logits`` for the model's own
    prediction; a stream stage for the logit lens, read through the final norm and the head) at
    ``position``; ids, tokens as text, probabilities and logits, most likely first. With a target,
    its rank (1 = most likely) and probability there."""

    stage: str
    position: int
    ids: list[int]
    tokens: list[str]
    probs: list[float]
    logits: list[float]
    target_rank: int | None = None
    target_prob: float | None = None


@dataclass
class Trace:
    """A whole walk: where the model came from, the input, and the stages in order."""

    source: str
    config: ModelConfig
    ids: list[int]
    tokens: list[str]
    positions: list[int]
    text: str | None = None
    target: dict | None = None  # {"position", "id", "token"} when a loss was computed
    stages: list[Stage] = field(default_factory=list)
    predictions: list[TopK] = field(default_factory=list)  # the model's top k at each shown position
    lens: list[TopK] = field(default_factory=list)  # the logit lens at the last shown position, per stage
    # what a reader must know before the numbers, in plain sentences: random weights, no next-token head
    notes: list[str] = field(default_factory=list)

    def stage(self, name: str) -> Stage:
        """The stage called ``name``; KeyError listing the names otherwise."""
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(f"no stage {name!r}; stages: {', '.join(s.name for s in self.stages)}")

    def label(self, position: int) -> str:
        """``7 ')'``: a position and its token."""
        return f"{position} {self.tokens[position]!r}"
