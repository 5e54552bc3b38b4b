"""Each position kind (``ModelConfig.pos_encoding``) as one record: where it acts (added to x0, or inside
attention: rotating q and k, or biasing the scores), whether it is learned, and TransformerLens' name for
it. Torch-free: the config, the model, the parameter count, the memory ledger, the tracer and the
TransformerLens view read it; embedding.py, rotary.py and alibi.py compute it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PositionKind:
    """One ``ModelConfig.pos_encoding`` value."""

    name: str  # the ModelConfig.pos_encoding value
    summary: str  # one line for --help and the docs
    adds_to_x0: bool  # x0 = E[t] + PE[p] (a ``pos`` stage); False: nothing is added to the embedding
    learned: bool = False  # a (max_seq_len, d_model) table of parameters (counted; pos_std draws it)
    in_attention: str = ""  # "rotary": rotates q and k; "alibi": adds -m_h |i - j| to the scores
    transformerlens: str | None = None  # TL's positional_embedding_type (None: TL has none)
    part: str = ""  # x0's position part in the tracer's words (a kind that adds to x0)
    explains: str = ""  # what the ``pos`` stage holds, in the tracer's words ({n}: sqrt(d_model / 2))

    @property
    def rotary(self) -> bool:
        return self.in_attention == "rotary"

    @property
    def alibi(self) -> bool:
        return self.in_attention == "alibi"


POSITION_KINDS: dict[str, PositionKind] = {
    kind.name: kind for kind in (
        PositionKind("sinusoidal", "the fixed sinusoidal code added to x0 (Vaswani et al.)", adds_to_x0=True,
                     part="sinusoidal position code",
                     explains="the fixed sinusoidal code PE[p] (entries in [-1, 1], norm sqrt(d/2) = {n})"),
        PositionKind("learned", "a learned table added to x0 (GPT-2, BERT)", adds_to_x0=True, learned=True,
                     transformerlens="standard", part="learned positions",
                     explains="the learned position embedding, row p of pos.weight"),
        PositionKind("rotary", "q and k rotated by position inside attention (RoPE: Llama, GPT-NeoX)",
                     adds_to_x0=False, in_attention="rotary", transformerlens="rotary"),
        PositionKind("alibi", "a distance penalty -m_h |i - j| on the scores (ALiBi: BLOOM)",
                     adds_to_x0=False, in_attention="alibi"),
        PositionKind("none", "no positions (a causal model can still infer them)", adds_to_x0=False),
    )
}
