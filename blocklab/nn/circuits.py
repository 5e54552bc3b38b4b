"""The weights as TransformerLens reads them (and Elhage et al. 2021's circuits), and the processing
that folds the norms into them. Views of the model's own parameters, in TransformerLens' shapes:

    W_E (vocab, d) [after the embedding's factor]  W_pos (n_ctx, d)      W_U (d, vocab), b_U (vocab)
    W_Q, W_K, W_V (n_layers, h, d, d_head)         b_Q, b_K, b_V (n_layers, h, d_head)
    W_O (n_layers, h, d_head, d)                   b_O (n_layers, d)
    W_in, W_gate (n_layers, d, d_ff)               b_in (n_layers, d_ff)
    W_out (n_layers, d_ff, d)                      b_out (n_layers, d)
    QK = W_Q W_K^T, OV = W_V W_O (n_layers, h, d, d), as factored matrices

q = x W_Q[l, h] + b_Q[l, h] for the normalised input x, and so on. Grouped-query models show W_K, W_V,
b_K, b_V per query head (each key/value head repeated for its group, as TransformerLens shows them);
``_W_K`` and ``_W_V`` hold the key/value heads themselves. A gated FFN's gate is W_gate (w1) and its
linear half W_in (w3). Per block, ``model.blocks[l].attn.W_Q`` is a view: writing into it writes the
model's weight; the model's stacked ``W_Q`` is a copy.

Processing (in place; each keeps the output distribution, TransformerLens' ``process_weights_``):

- ``fold_ln``: a norm whose output only feeds linear layers (pre-norm, the parallel blocks, the final
  norm) is folded into them: W <- diag(gamma) W, b <- b + beta W, then the weights reading it are
  centred over d (LayerNorm's output has mean 0, so this changes nothing); the norm keeps only its
  normalisation (gamma 1, beta 0). RMSNorm folds gamma only. Logits unchanged (float rounding).
- ``center_writing_weights``: every weight writing to the residual stream (W_E, W_pos, W_O, b_O,
  W_out, b_out) loses its mean over d; every reader normalises with LayerNorm, which subtracts it.
- ``center_unembed``: W_U and b_U lose their mean over the vocabulary: each position's logits shift
  by one constant, the probabilities do not change.
- ``fold_value_biases``: b_V moves into b_O (b_O + sum_h b_V[h] W_O[h]): attention weights sum to 1.

A layout where a norm sits on the stream (post-norm, sandwich) cannot fold; centring the writers
needs LayerNorm (not RMSNorm): both are refused with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from .factored import FactoredMatrix
from .hooks import HookPoint
from .layouts import LAYOUTS, Norm, Sublayer
from .norm_kinds import NORM_KINDS
from .packed import packed_linear, packing
from .position_kinds import POSITION_KINDS

# the norm kinds that subtract the mean: centring the writers is free (the record says which)
CENTRING_NORMS = tuple(name for name, kind in NORM_KINDS.items() if kind.per_position and kind.centres)


# ---- one block's views -------------------------------------------------------------------------


class AttentionWeights:
    """TransformerLens' attention weight views, for ``MultiHeadAttention`` (mixin)."""

    q: nn.Linear
    k: nn.Linear
    v: nn.Linear
    o: nn.Linear
    n_heads: int
    n_kv_heads: int
    d_k: int
    d_model: int

    def _in(self, linear: nn.Linear) -> Tensor:  # (heads, d_model, d_head), a view
        return linear.weight.view(-1, self.d_k, self.d_model).transpose(1, 2)

    def _bias(self, linear: nn.Linear) -> Tensor:  # (heads, d_head)
        if linear.bias is None:
            return torch.zeros(linear.weight.shape[0] // self.d_k, self.d_k, dtype=linear.weight.dtype,
                               device=linear.weight.device)
        return linear.bias.view(-1, self.d_k)

    def _per_query_head(self, per_kv_head: Tensor) -> Tensor:  # (h_kv, ...) -> (h, ...)
        groups = self.n_heads // self.n_kv_heads
        return per_kv_head if groups == 1 else per_kv_head.repeat_interleave(groups, dim=0)

    @property
    def W_Q(self) -> Tensor:
        return self._in(self.q)

    @property
    def _W_K(self) -> Tensor:
        return self._in(self.k)

    @property
    def _W_V(self) -> Tensor:
        return self._in(self.v)

    @property
    def W_K(self) -> Tensor:
        return self._per_query_head(self._W_K)

    @property
    def W_V(self) -> Tensor:
        return self._per_query_head(self._W_V)

    @property
    def W_O(self) -> Tensor:  # (h, d_head, d_model), a view
        return self.o.weight.view(self.d_model, self.n_heads, self.d_k).permute(1, 2, 0)

    @property
    def b_Q(self) -> Tensor:
        return self._bias(self.q)

    @property
    def b_K(self) -> Tensor:
        return self._per_query_head(self._bias(self.k))

    @property
    def b_V(self) -> Tensor:
        return self._per_query_head(self._bias(self.v))

    @property
    def b_O(self) -> Tensor:
        if self.o.bias is None:
            return torch.zeros(self.d_model, dtype=self.o.weight.dtype, device=self.o.weight.device)
        return self.o.bias


class FeedForwardWeights:
    """TransformerLens' MLP weight views, for ``FeedForward`` (mixin): W_in (d, d_ff) is the linear half
    of a gated FFN (w3) and the only input weight of a plain one (w1); W_gate is a gated FFN's gate (w1)."""

    w1: nn.Linear
    w2: nn.Linear
    w3: nn.Linear | None

    @property
    def W_in(self) -> Tensor:
        return (self.w3 if self.w3 is not None else self.w1).weight.T

    @property
    def W_gate(self) -> Tensor:
        if self.w3 is None:
            raise AttributeError("W_gate: this FFN is not gated (its activation has no gate)")
        return self.w1.weight.T

    @property
    def b_in(self) -> Tensor:
        linear = self.w3 if self.w3 is not None else self.w1
        return linear.bias if linear.bias is not None else torch.zeros_like(linear.weight[:, 0])

    @property
    def W_out(self) -> Tensor:
        return self.w2.weight.T

    @property
    def b_out(self) -> Tensor:
        return self.w2.bias if self.w2.bias is not None else torch.zeros_like(self.w2.weight[:, 0])


class Unembed(nn.Linear):
    """The LM head, ``nn.Linear(d, vocab)``, with TransformerLens' names for its weights
    (``model.unembed.W_U``); ``softcap``: the logits capped at +-softcap, cap tanh(logits / cap) (Gemma 2)."""

    def __init__(self, d_model: int, vocab_size: int, bias: bool = True, softcap: float | None = None,
                 **factory: Any) -> None:
        super().__init__(d_model, vocab_size, bias=bias, **factory)
        self.softcap = softcap
        # the logits before the cap (TransformerLens' unembed.hook_out on a capped model): stage head.uncapped
        self.hook_uncapped = HookPoint() if softcap is not None else None

    def forward(self, x: Tensor) -> Tensor:  # (..., d) -> (..., vocab)
        """The logits; one row while decoding reads the head's packed (d, vocab) copy (nn/packed.py)."""
        logits = packed_linear(self, "head", x, (self.weight,), (self.bias,)) if packing(x) \
            else super().forward(x)
        if self.softcap is None:
            return logits
        return torch.tanh(self.hook_uncapped(logits) / self.softcap) * self.softcap

    @property
    def W_U(self) -> Tensor:  # (d, vocab)
        return self.weight.T

    @property
    def b_U(self) -> Tensor:  # (vocab,): zeros where the head has no bias
        return self.bias if self.bias is not None else torch.zeros_like(self.weight[:, 0])


# ---- the model's views and processing ------------------------------------------------------------


def _stacked(name: str, where: Callable[[nn.Module], nn.Module]) -> property:
    def get(self: Any) -> Tensor:
        return torch.stack([getattr(where(block), name) for block in self.blocks])

    get.__doc__ = f"{name} of every block, stacked: (n_layers, ...)."
    return property(get)


class ModelWeights:
    """TransformerLens' weight views, circuits and weight processing, for ``Transformer`` (mixin)."""

    blocks: nn.ModuleList
    embed: Any
    pos: Any
    head: Unembed
    ln_f: nn.Module
    config: Any

    W_Q = _stacked("W_Q", lambda b: b.attn)
    W_K = _stacked("W_K", lambda b: b.attn)
    W_V = _stacked("W_V", lambda b: b.attn)
    W_O = _stacked("W_O", lambda b: b.attn)
    b_Q = _stacked("b_Q", lambda b: b.attn)
    b_K = _stacked("b_K", lambda b: b.attn)
    b_V = _stacked("b_V", lambda b: b.attn)
    b_O = _stacked("b_O", lambda b: b.attn)
    W_in = _stacked("W_in", lambda b: b.ffn)
    b_in = _stacked("b_in", lambda b: b.ffn)
    W_out = _stacked("W_out", lambda b: b.ffn)
    b_out = _stacked("b_out", lambda b: b.ffn)

    @property
    def W_gate(self) -> Tensor | None:
        """Every block's FFN gate (w1), stacked: (n_layers, d, d_ff); None where the FFN is not gated
        (TransformerLens' ``model.W_gate``; a block's own ``ffn.W_gate`` is an AttributeError there)."""
        return torch.stack([b.ffn.W_gate for b in self.blocks]) if self.blocks[0].ffn.w3 is not None else None

    @property
    def W_E(self) -> Tensor:
        """(vocab, d): what x0 adds for each token (the embedding rows times their factor)."""
        return self.embed.W_E

    @property
    def W_pos(self) -> Tensor:
        """(n_ctx, d): what x0 adds at each position (learned or sinusoidal)."""
        if self.pos is None:
            raise AttributeError(f"W_pos: pos_encoding={self.config.pos_encoding!r} adds no position table "
                                 "to x0")
        return self.pos.W_pos  # learned, or sinusoidal

    @property
    def W_U(self) -> Tensor:
        return self.head.W_U

    @property
    def b_U(self) -> Tensor:
        return self.head.b_U

    @property
    def QK(self) -> FactoredMatrix:
        """W_Q W_K^T per layer and head: (n_layers, h, d, d)."""
        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    @property
    def OV(self) -> FactoredMatrix:
        """W_V W_O per layer and head: (n_layers, h, d, d)."""
        return FactoredMatrix(self.W_V, self.W_O)

    def all_composition_scores(self, mode: str) -> Tensor:
        """How much each head's output is read by each later head (Elhage et al. 2021), as TransformerLens'
        ``all_composition_scores``: (n_layers, h, n_layers, h), zero unless the reader's layer is later.
        mode "Q", "K" or "V": the reader's query (QK), key (QK^T) or value (OV) side."""
        readers = {"Q": lambda: self.QK, "K": lambda: self.QK.T, "V": lambda: self.OV}
        if mode not in readers:
            raise ValueError(f"mode={mode!r}: the composition is one of 'Q', 'K', 'V'")
        scores = composition_scores(self.OV, readers[mode]())  # (L, h, L, h)
        layers = torch.arange(len(self.blocks), device=scores.device)
        later = layers[:, None, None, None] < layers[None, None, :, None]
        return torch.where(later, scores, torch.zeros_like(scores))

    # -- processing ------------------------------------------------------------------------------

    def _untie(self) -> None:
        """Give the head its own copy of a tied embedding: processing changes W_U and W_E differently
        (TransformerLens keeps them apart too). The model is then no longer what its config says: a
        processed model is for analysis (saving one is refused: ``weights_processed`` says why)."""
        if self.head.weight is self.embed.weight:
            self.head.weight = nn.Parameter(self.embed.weight.detach().clone())

    def process_weights_(self, fold_ln: bool = True, center_writing_weights: bool = True,
                         center_unembed: bool = True, fold_value_biases: bool = True,
                         refactor_factored_attn_matrices: bool = False) -> None:
        """TransformerLens' ``process_weights_``: the chosen processing steps, in its order."""
        if fold_ln:
            self.fold_ln()
        if center_writing_weights:
            self.center_writing_weights()
        if center_unembed:
            self.center_unembed()
        if fold_value_biases:
            self.fold_value_biases()
        if refactor_factored_attn_matrices:
            self.refactor_factored_attn_matrices()

    @torch.no_grad()
    def fold_ln(self) -> None:
        """Fold every norm into the linear layers that read it (module docstring)."""
        layout = LAYOUTS[self.config.norm_position]
        _check_foldable(self.config, layout)
        self._untie()
        centre = self.config.norm in CENTRING_NORMS
        for block in self.blocks:
            for step in layout.steps:
                if not isinstance(step, Norm):
                    continue
                readers = [s.name for s in layout.steps if isinstance(s, Sublayer) and s.reads == step.name]
                norm = getattr(block, step.name)
                linears = [lin for r in readers for lin in _reading_linears(getattr(block, r))]
                _fold(norm, linears, centre)
        if not isinstance(self.ln_f, nn.Identity) and hasattr(self.ln_f, "weight"):
            if self.head.bias is None and getattr(self.ln_f, "bias", None) is not None:
                self.head.bias = nn.Parameter(torch.zeros_like(self.head.weight[:, 0]))
            _fold(self.ln_f, [self.head], centre)
        self.weights_processed = [*getattr(self, "weights_processed", []), "fold_ln"]

    @torch.no_grad()
    def center_writing_weights(self) -> None:
        """Subtract from every weight writing to the stream its mean over d (module docstring)."""
        if self.config.norm not in CENTRING_NORMS:
            raise ValueError(f"center_writing_weights needs every reader of the stream to subtract the mean "
                             f"(LayerNorm); norm={self.config.norm!r} does not")
        self._untie()
        self.embed.weight -= self.embed.weight.mean(-1, keepdim=True)
        if self.pos is not None and hasattr(self.pos, "weight"):
            self.pos.weight -= self.pos.weight.mean(-1, keepdim=True)
        for block in self.blocks:
            for linear in (block.attn.o, block.ffn.w2):  # (d, in): the mean over d of each column
                linear.weight -= linear.weight.mean(0, keepdim=True)
                if linear.bias is not None:
                    linear.bias -= linear.bias.mean()
        self.weights_processed = [*getattr(self, "weights_processed", []), "center_writing_weights"]

    @torch.no_grad()
    def center_unembed(self) -> None:
        """Subtract W_U's and b_U's means over the vocabulary (probabilities unchanged)."""
        self._untie()
        self.head.weight -= self.head.weight.mean(0, keepdim=True)
        if self.head.bias is not None:
            self.head.bias -= self.head.bias.mean()
        self.weights_processed = [*getattr(self, "weights_processed", []), "center_unembed"]

    @torch.no_grad()
    def fold_value_biases(self) -> None:
        """b_O <- b_O + sum_h b_V[h] W_O[h]; b_V <- 0."""
        for block in self.blocks:
            attn = block.attn
            if attn.v.bias is None:
                continue
            folded = (attn.b_V[:, :, None] * attn.W_O).sum((0, 1))  # (d,): per query head
            if attn.o.bias is None:  # GPT-J's o (its v has one after fold_ln): as TransformerLens' b_O
                attn.o.bias = nn.Parameter(torch.zeros_like(attn.o.weight[:, 0]))
            attn.o.bias += folded
            attn.v.bias.zero_()
        self.weights_processed = [*getattr(self, "weights_processed", []), "fold_value_biases"]

    @torch.no_grad()
    def refactor_factored_attn_matrices(self) -> None:
        """Re-factor each head's circuits (TransformerLens' option of the same name): with
        OV = U diag(S) V^T, W_V <- U diag(S) and W_O <- V^T (W_O a rotation; b_V folded into b_O first);
        QK with the biases as one more input row, [W_Q; b_Q] [W_K; b_K]^T = U diag(S) V^T, gives
        [W_Q; b_Q] <- U sqrt(S) and [W_K; b_K] <- V sqrt(S). Every head computes the same scores and
        output. Refused where QK is not one matrix: rotary positions (QK depends on the positions), QK-norm
        (normalised after W_Q), shared key/value heads (a query head's W_K is not its own)."""
        config = self.config
        refusals = {
            "pos_encoding='rotary' makes QK depend on the query's and key's positions":
                POSITION_KINDS[config.pos_encoding].rotary,
            f"qk_norm={config.qk_norm!r} normalises q and k after W_Q and W_K": config.qk_norm != "none",
            f"n_kv_heads={config.kv_heads} < n_heads={config.n_heads}: key and value heads are shared, so "
            "a query head's W_K and W_V are not its own": config.kv_heads != config.n_heads}
        for reason, refused in refusals.items():
            if refused:
                raise ValueError(f"refactor_factored_attn_matrices: {reason}")
        self.fold_value_biases()
        for block in self.blocks:
            attn = block.attn
            q_side = torch.cat([attn.W_Q, attn.b_Q[:, None, :]], dim=1)  # (h, d + 1, d_head): biases as a row
            k_side = torch.cat([attn.W_K, attn.b_K[:, None, :]], dim=1)
            q_even, k_even_t = FactoredMatrix(q_side, k_side.transpose(-2, -1)).make_even().pair
            k_even = k_even_t.transpose(-2, -1)
            for linear, even in ((attn.q, q_even), (attn.k, k_even)):
                weight, bias = even[:, :-1, :], even[:, -1, :]  # (h, d, d_head), (h, d_head)
                attn._in(linear).copy_(weight)
                if linear.bias is not None:
                    linear.bias.view(-1, attn.d_k).copy_(bias)  # else the bias row was 0: stays 0
            ov = FactoredMatrix(attn.W_V, attn.W_O)
            attn._in(attn.v).copy_(ov.collapse_r().to(attn.v.weight.dtype))
            attn.W_O.copy_(ov.Vh.transpose(-2, -1))
        self.weights_processed = [*getattr(self, "weights_processed", []), "refactor_factored_attn_matrices"]


def composition_scores(left: FactoredMatrix, right: FactoredMatrix) -> Tensor:
    """||L R||_F / (||L||_F ||R||_F) for every pair of a writer's OV (left) and a reader's circuit (right):
    leading dims (...left, ...right). Computed on the factors: L = Ul diag(Sl) Vl^T, R = Ur diag(Sr) Vr^T;
    the orthogonal outer factors do not change a Frobenius norm, so only diag(Sl) Vl^T Ur diag(Sr) counts."""
    left_leading, right_leading = left.ndim - 2, right.ndim - 2
    for _ in range(right_leading):  # (...left, 1.., m, n) against (1.., ...right, m, n)
        left = left.unsqueeze(left.ndim - 2)
    for _ in range(left_leading):
        right = right.unsqueeze(0)
    inner_left, inner_right = left.collapse_l(), right.collapse_r()  # (..., k, d), (..., d, k)
    both = (inner_left @ inner_right).norm(dim=(-2, -1))
    return both / inner_left.norm(dim=(-2, -1)) / inner_right.norm(dim=(-2, -1))


def _check_foldable(config: Any, layout: Any) -> None:
    if not NORM_KINDS[config.norm].per_position:
        raise ValueError(f"fold_ln folds LayerNorm or RMSNorm; norm={config.norm!r} has no affine to fold")
    if config.embed_norm:
        raise ValueError("fold_ln: the embedding norm (embed_ln) feeds the stream, not a linear layer")
    for step in layout.steps:
        if isinstance(step, Norm):
            readers = [s for s in layout.steps if getattr(s, "reads", None) == step.name or
                       getattr(s, "x", None) == step.name or step.name in getattr(s, "branches", ())]
            if not readers or not all(isinstance(s, Sublayer) for s in readers) or step.name == layout.output:
                raise ValueError(f"fold_ln: in the {layout.title} block {step.name} feeds the residual "
                                 "stream, not only linear layers, so it cannot fold into them")


def _reading_linears(sublayer: nn.Module) -> list[nn.Linear]:
    """The linear layers that read a sublayer's input: q, k, v; or w1 (and w3, gated)."""
    if hasattr(sublayer, "q"):
        return [sublayer.q, sublayer.k, sublayer.v]
    return [sublayer.w1] + ([sublayer.w3] if sublayer.w3 is not None else [])


def _fold(norm: nn.Module, linears: list[nn.Linear], centre: bool) -> None:
    """Fold ``norm``'s gamma and beta into ``linears`` (weights (out, d)), then centre their inputs."""
    gamma, beta = norm.gamma, getattr(norm, "bias", None)  # gamma: offset + weight (None: the kind has none)
    for linear in linears:
        if beta is not None:
            if linear.bias is None:  # GPT-J's q, k, v: beta becomes their bias, as TransformerLens' b_Q
                linear.bias = nn.Parameter(torch.zeros_like(linear.weight[:, 0]))
            linear.bias += linear.weight @ beta  # with the unfolded weight
        if gamma is not None:
            linear.weight *= gamma  # scales column j by gamma_j
        if centre:
            linear.weight -= linear.weight.mean(-1, keepdim=True)  # centred over the d inputs
    norm.set_identity_affine_()
