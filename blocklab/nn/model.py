"""The stack (docs/concepts.md#the-stack): embeddings, positions, N blocks, final norm, LM head, loss.

    x0 = tok + pos                         tok = scale * E[tokens], pos = PE[positions] (embedding.py;
                                           rotary positions and ALiBi add nothing here: attention
                                           rotates q, k / biases its scores by distance)
    x_{l+1} = Block_l(x_l)                 l = 0..N-1
    logits = ln_f(x_N) @ W_vocab^T         ln_f for pre-norm; head optionally tied to Embed
    loss = cross_entropy(logits, targets)  targets of -100 (padding) are ignored

The calling conventions of TransformerLens and ``transformers`` work beside blocklab's: the input may be
text (``model("The cat")``, a list of texts, a ``BatchEncoding``), ``return_type`` picks "logits",
"loss" (next-token loss when no targets are given), "both" or None, and ``output_hidden_states`` /
``output_attentions`` return a ``ModelOutput`` with ``transformers``' fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import tl_generate
from .alibi import check_alibi_positions
from .attention import KVCache
from .block import TransformerBlock, deepnorm_beta
from .circuits import ModelWeights, Unembed
from .config import ModelConfig
from .embedding import build_positions, build_token_embedding, init_embeddings
from .hooked import HookedModule
from .hooks import HookPoint, name_hook_points
from .init_schemes import INIT_SCHEMES
from .norms import NoNorm, build_norm
from .position_kinds import POSITION_KINDS
from .rotary import Rotary
from .tl_config import TransformerLensConfig
from .tl_model import TransformerLensModel, alias_hook_points
from .tokens import (
    AS_TOKENIZED,
    BatchEncoding,
    PrependBos,
    TextTokenizer,
    bos_to_prepend,
    encode_texts,
    positions_from_mask,
    to_str_tokens,
    to_string,
)

IGNORE_INDEX = -100  # targets at padding / unscored positions
RETURN_TYPES = ("logits", "loss", "both", None)  # TransformerLens' return_type
Input = Tensor | str | Sequence[str] | BatchEncoding  # token ids (B, T), or text to tokenize


@dataclass
class ModelOutput:
    """What ``transformers`` returns with ``output_hidden_states`` / ``output_attentions``: ``logits``
    (B, T, vocab), ``loss`` (with targets), ``hidden_states`` (x0, every block's output, the final
    hidden state: n_layers + 1 of (B, T, d)), ``attentions`` (each block's weights (B, h, T, T)).
    Indexing works as on ``transformers``' outputs: by name, or by position over the fields set."""

    logits: Tensor
    loss: Tensor | None = None
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None

    def to_tuple(self) -> tuple[object, ...]:
        return tuple(v for f in fields(self) if (v := getattr(self, f.name)) is not None)

    def __getitem__(self, key: int | str) -> object:
        return getattr(self, key) if isinstance(key, str) else self.to_tuple()[key]


class Transformer(HookedModule, ModelWeights, TransformerLensModel):
    """Keys: ``embed.weight``, ``pos.weight`` (learned), ``token_type.weight``, ``embed_ln.*``,
    ``blocks.{i}.*``, ``ln_f.*`` (when final_norm), ``head.weight`` (absent from the parameters
    when tied to ``embed``). Stages, in forward order (``STAGES``; ``blocks``: each block's, in its
    order): ``tok`` (the token part of x0, after its scale), ``pos`` (the position part), ``embed``
    (x0), ``blocks.{i}.*``, ``ln_f``, ``logits``, ``probs``, ``loss``.

    ``tokenizer``: the model's tokenizer (``blocklab.nn.tokens.TextTokenizer``) or None; the loaders
    set it, ``to_tokens`` / ``to_str_tokens`` / ``to_string`` use it.

    TransformerLens' object model beside blocklab's (``nn/tl_model.py``): ``hook_dict``, ``mod_dict``,
    ``unembed`` (``head``), ``ln_final`` (``ln_f``), ``pos_embed`` (``pos``), the ``set_use_*`` switches.
    """

    tokenizer: TextTokenizer | None
    STAGES = ("tok", "pos", "embed", "blocks", "ln_f", "logits", "probs", "loss")

    @property
    def cfg(self) -> TransformerLensConfig:
        """TransformerLens' ``model.cfg``: its config fields for this model (``nn/tl_config.py``), read by
        TransformerLens code such as its ``patching`` module."""
        tokenizer = self.tokenizer
        return TransformerLensConfig(
            self.config, self.head.weight.device, self.head.weight.dtype,
            getattr(tokenizer, "default_prepend_bos", True),
            None if tokenizer is None or getattr(tokenizer, "bos_id", None) is None
            else bos_to_prepend(tokenizer) is None, "fold_ln" in getattr(self, "weights_processed", ()),
            self.use_attn_result)

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        c = self.config = config
        self.embed = build_token_embedding(c)
        self.pos = build_positions(c)
        rotary = POSITION_KINDS[c.pos_encoding].rotary
        rotation = lambda base, scaling: Rotary(c.d_head, c.rotary_fraction, base, c.rotary_style, scaling)
        self.rotary = rotation(c.rotary_base, c.rope_scaling) if rotary else None
        # Gemma 3's local layers rotate by a base of their own; ModelConfig.rotary_of says each layer's
        self.rotary_local = rotation(c.local_rotary_base, None) \
            if rotary and c.local_rotary_base is not None else None
        self._block_rotary = [self.rotary_local if c.rotary_of(i) != (c.rotary_base, c.rope_scaling)
                              else self.rotary for i in range(c.n_layers)]  # (plain list: not registered)
        self.token_type = nn.Embedding(c.type_vocab_size, c.d_model) if c.type_vocab_size else None
        norm = lambda: build_norm(c.norm, c.d_model, c.eps, c.bias, fused=c.components_fused)
        self.embed_ln = norm() if c.embed_norm else NoNorm()
        self.drop = nn.Dropout(c.dropout) if c.dropout > 0 else nn.Identity()
        self.blocks = nn.ModuleList(TransformerBlock(c, i) for i in range(c.n_layers))
        self.ln_f = norm() if c.final_norm else NoNorm()
        self.head = Unembed(c.d_model, c.vocab_size, bias=c.head_bias, softcap=c.logit_softcap)
        if c.tie_embeddings:
            self.head.weight = self.embed.weight
        for stage in self.STAGES:
            if stage != "blocks":
                setattr(self, f"hook_{stage}", HookPoint())
        self.tokenizer = None  # a plain attribute: not a module, not in the state dict
        self.weights_processed: list[str] = []  # fold_ln, ... (circuits.py): an analysis view, not for saving
        init_weights(self)
        name_hook_points(self)
        alias_hook_points(self)  # model.blocks[0].attn.hook_pattern: TransformerLens' attribute names

    def hook_names(self) -> list[str]:
        """Every stage name, in the order a forward pass reaches them."""
        order: list[str] = []
        norms = {"embed": "embed_ln", "ln_f": "ln_f"}  # a norm's own stages (scale) come before its output
        for stage in self.STAGES:
            if stage == "blocks":
                order += [f"blocks.{i}.{s}" for i, b in enumerate(self.blocks) for s in b.hook_names()]
                continue
            if stage in norms:
                order += [f"{norms[stage]}.{s}" for s in getattr(self, norms[stage]).STAGES]
            if stage == "logits" and self.head.hook_uncapped is not None:  # a soft-capped head's logits
                order.append("head.uncapped")
            order.append(stage)
        return order

    def _check_tokens(self, tokens: Tensor, past: int = 0, position_ids: Tensor | None = None) -> None:
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be (batch, seq) integers, got shape {tuple(tokens.shape)}")
        if position_ids is not None:
            self._check_position_ids(tokens, position_ids)
        else:
            T = past + tokens.shape[1]
            if T > self.config.max_seq_len:
                raise ValueError(f"sequence length {T} exceeds max_seq_len={self.config.max_seq_len}")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.config.vocab_size):
            raise ValueError(
                f"token ids must be in [0, {self.config.vocab_size}); got min {int(tokens.min())}, "
                f"max {int(tokens.max())}"
            )

    def _check_position_ids(self, tokens: Tensor, position_ids: Tensor) -> None:
        if position_ids.shape != tokens.shape or position_ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(
                f"position_ids must be (batch, seq) integers like tokens {tuple(tokens.shape)}, got "
                f"{position_ids.dtype} of shape {tuple(position_ids.shape)}"
            )
        if position_ids.numel() and (int(position_ids.min()) < 0
                                     or int(position_ids.max()) >= self.config.max_seq_len):
            raise ValueError(
                f"position_ids must be in [0, {self.config.max_seq_len}) (max_seq_len); got min "
                f"{int(position_ids.min())}, max {int(position_ids.max())}"
            )

    def _embed(
        self, tokens: Tensor, past: int, position_ids: Tensor | None, token_type_ids: Tensor | None,
        pad: Tensor | None,
    ) -> Tensor:
        """x0 = tok + pos (+ token type), then embed_ln (``pad`` (B, T): True at padding) and dropout:
        the ``embed`` stage (B, T, d_model)."""
        x = self.hook_tok(self.embed(tokens))  # (B, T, d_model), after the factor
        if self.pos is not None:
            pos = self.pos(tokens.shape[1], past, position_ids)  # (T, d_model) or (B, T, d_model)
            x = x + self.hook_pos(pos.expand_as(x))
        if self.token_type is not None:
            types = token_type_ids if token_type_ids is not None else torch.zeros_like(tokens)
            x = x + self.token_type(types)
        return self.hook_embed(self.drop(self.embed_ln(x, pad)))

    def encode(
        self,
        tokens: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        kv_cache: list[KVCache] | None = None,
        position_ids: Tensor | None = None,
        stop_at_layer: int | None = None,
    ) -> Tensor:
        """Last hidden states (B, T, d_model), after the final norm where there is one; with
        ``stop_at_layer`` k, the residual stream entering block k (blocks[:k] run, as a Python slice:
        -1 runs all but the last; TransformerLens' ``stop_at_layer``), no final norm.

        attention_mask: (B, T), 1 for real tokens and 0 for padding (Hugging Face convention).
        kv_cache: one KVCache per block (generation): tokens are the positions after the cached ones.
        position_ids: (B, T) position of each token (default past, past+1, ...); left-padded batches
        give each row's real tokens positions 0, 1, ... whatever the padding before them.
        """
        past = kv_cache[0].length if kv_cache is not None else 0
        self._check_tokens(tokens, past, position_ids)
        key_padding_mask = attention_mask == 0 if attention_mask is not None else None  # True at padding
        pad = key_padding_mask[:, past:] if key_padding_mask is not None else None  # these tokens' own
        if position_ids is not None and POSITION_KINDS[self.config.pos_encoding].alibi:
            check_alibi_positions(position_ids, pad)
        x = self._embed(tokens, past, position_ids, token_type_ids, pad)
        angles = dict.fromkeys(self._block_rotary)  # each rotation's cos and sin, computed once
        if self.rotary is not None:  # each token's position in its own sequence: past, past + 1, ...
            positions = position_ids if position_ids is not None else \
                torch.arange(past, past + tokens.shape[1], device=tokens.device)
            angles = {rotary: rotary.angles(positions, x.dtype) for rotary in angles}
        caches = kv_cache if kv_cache is not None else [None] * len(self.blocks)
        layers = list(zip(self.blocks, caches, self._block_rotary, strict=True))
        for block, cache, rotary in layers[:stop_at_layer]:
            x = block(x, key_padding_mask, cache, angles[rotary])
        if stop_at_layer is not None:
            return x  # (B, T, d_model): the stream entering block stop_at_layer
        return self.hook_ln_f(self.ln_f(x, pad))

    def forward(
        self,
        tokens: Input,
        targets: Tensor | None = None,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        *,
        return_type: str | None = "default",
        loss_per_token: bool = False,
        prepend_bos: bool | None = None,
        padding_side: str = "right",
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        stop_at_layer: int | None = None,
    ) -> Tensor | tuple[Tensor, Tensor] | ModelOutput | None:
        """Logits (B, T, vocab); with targets (B, T), also the mean cross-entropy over targets != -100.

        ``tokens`` may be text (a str or a list: tokenized with ``prepend_bos`` and ``padding_side``,
        as ``to_tokens``) or a ``BatchEncoding``. TransformerLens' ``return_type``: "logits", "loss"
        (with no targets, each token predicting the next: mean over scored positions, or per token
        (B, T - 1) with ``loss_per_token``), "both" (logits, loss), None (nothing). With
        ``output_hidden_states`` or ``output_attentions``, a ``ModelOutput`` as ``transformers`` returns.
        ``stop_at_layer`` k: TransformerLens' early stop, the residual stream entering block k (B, T, d).
        """
        if return_type not in (*RETURN_TYPES, "default"):
            raise ValueError(f"return_type={return_type!r} is not one of: logits, loss, both, None")
        tokens, attention_mask = self._ids(tokens, attention_mask, prepend_bos, padding_side)
        position_ids = self._positions(attention_mask, position_ids, padding_side)
        if stop_at_layer is not None:
            return self._stopped(tokens, targets, attention_mask, token_type_ids, position_ids, stop_at_layer,
                                 return_type, loss_per_token or output_hidden_states or output_attentions)
        if output_hidden_states or output_attentions:
            if return_type != "default" or loss_per_token:
                raise ValueError("output_hidden_states / output_attentions return a ModelOutput; "
                                 "drop return_type and loss_per_token")
            return self._model_output(tokens, targets, attention_mask, token_type_ids, position_ids,
                                      output_hidden_states, output_attentions)
        hidden = self.encode(tokens, attention_mask, token_type_ids, position_ids=position_ids)
        logits = self.hook_logits(self.head(hidden))
        full = logits if logits.dtype == torch.float64 else logits.float()  # softmax/CE never in bf16
        if self.hook_probs.active:  # softmax only when someone looks at it
            self.hook_probs(torch.softmax(full, dim=-1))
        wants_loss = return_type in ("loss", "both") or (return_type == "default" and targets is not None)
        if not wants_loss:
            return None if return_type is None else logits  # TransformerLens' None: no output
        if targets is None:  # each token predicts the next: TransformerLens' language-model loss
            targets = tokens[:, 1:].masked_fill(attention_mask[:, 1:] == 0, IGNORE_INDEX) \
                if attention_mask is not None else tokens[:, 1:]
            full = full[:, :-1]
        if loss_per_token:  # (B, T'): 0 where a target is not scored
            loss = F.cross_entropy(full.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX,
                                   reduction="none").view(targets.shape)
        else:
            loss = self.hook_loss(F.cross_entropy(full.flatten(0, 1), targets.flatten(),
                                                  ignore_index=IGNORE_INDEX))
        if return_type == "loss":
            return loss
        return logits, loss

    def _stopped(
        self, tokens: Tensor, targets: Tensor | None, attention_mask: Tensor | None,
        token_type_ids: Tensor | None, position_ids: Tensor | None, stop_at_layer: int,
        return_type: str | None, other_outputs: bool,
    ) -> Tensor:
        """``forward(..., stop_at_layer=k)``: the stream entering block k (B, T, d), as TransformerLens
        returns it; what asks for more than that stream (a loss, targets, other outputs) is refused."""
        if targets is not None or return_type in ("loss", "both") or other_outputs:
            raise ValueError(f"stop_at_layer={stop_at_layer} returns the residual stream entering block "
                             f"{stop_at_layer}: there are no logits, loss or hidden states to return (drop "
                             "targets, return_type, loss_per_token, output_hidden_states, output_attentions)")
        return self.encode(tokens, attention_mask, token_type_ids, position_ids=position_ids,
                           stop_at_layer=stop_at_layer)

    def _model_output(
        self, tokens: Tensor, targets: Tensor | None, attention_mask: Tensor | None,
        token_type_ids: Tensor | None, position_ids: Tensor | None, hidden_states: bool, attentions: bool,
    ) -> ModelOutput:
        """``forward`` with ``transformers``' hidden states and attention weights, read through the cache."""
        names = [*(["embed", *(f"blocks.{i}.{b.layout.output}" for i, b in enumerate(self.blocks)), "ln_f"]
                   if hidden_states else []),
                 *([f"blocks.{i}.attn.weights" for i in range(len(self.blocks))] if attentions else [])]
        out, cache = self.run_with_cache(tokens, targets, attention_mask, token_type_ids, position_ids,
                                         names=names, detach=False)  # gradients flow, as in transformers
        logits, loss = out if isinstance(out, tuple) else (out, None)
        return ModelOutput(
            logits, loss, tuple(cache.hidden_states) if hidden_states else None,
            tuple(cache[f"blocks.{i}.attn.weights"] for i in range(len(self.blocks))) if attentions else None)

    def _positions(self, attention_mask: Tensor | None, position_ids: Tensor | None, padding_side: str
                   ) -> Tensor | None:
        """Text padded on the left (TransformerLens' padding_side), or any mask of a model whose config says
        ``positions_from_mask`` (OPT's): each row's positions count from its first real token, as the same
        row alone has them (learned and sinusoidal tables too)."""
        by_mask = padding_side == "left" or self.config.positions_from_mask
        if position_ids is None and attention_mask is not None and by_mask:
            return positions_from_mask(attention_mask)
        return position_ids

    def _ids(self, tokens: Input, attention_mask: Tensor | None, prepend_bos: bool | None, padding_side: str
             ) -> tuple[Tensor, Tensor | None]:
        """Token ids and the attention mask for any input ``forward`` takes."""
        if isinstance(tokens, BatchEncoding):
            if attention_mask is not None:
                raise ValueError("a BatchEncoding carries its attention_mask: pass one or the other")
            return tokens.ids, tokens.attention_mask
        if isinstance(tokens, str) or (isinstance(tokens, Sequence) and not isinstance(tokens, Tensor)):
            if attention_mask is not None:
                raise ValueError("text is tokenized with its own attention mask: pass ids to give a mask")
            batch = self.tokenize(tokens, prepend_bos=prepend_bos, padding=padding_side)
            mask = batch.attention_mask if not bool(batch.attention_mask.all()) else None
            return batch.ids, mask
        if prepend_bos:
            raise ValueError("prepend_bos applies to text; these are token ids already")
        return tokens, attention_mask

    def require_tokenizer(self) -> TextTokenizer:
        """The model's tokenizer; a ValueError saying how to attach one when there is none."""
        if self.tokenizer is None:
            raise ValueError(
                "this model has no tokenizer: set model.tokenizer (a task's, e.g. "
                "blocklab.tasks.get_task('tiny-lm').tokenizer), or load the model with "
                "blocklab.load(path), which attaches the tokenizer stored with it"
            )
        return self.tokenizer

    def tokenize(self, texts: str | Sequence[str], prepend_bos: PrependBos = AS_TOKENIZED,
                 padding: str = "right") -> BatchEncoding:
        """Texts -> (ids (B, T), attention_mask (B, T)) on the model's device, padded on the ``padding``
        side: "right" (encoders, scoring) or "left" (generation: every row ends in the last column).
        By default the tokenizer's own ids, as ``transformers`` gives them; ``prepend_bos`` True, False
        or None as TransformerLens' ``to_tokens`` (``tokens.encode_texts``): the BOS first, none, or the
        model's default (``to_tokens``, and text given to ``forward`` or ``generate``)."""
        batch = encode_texts(self.require_tokenizer(), texts, prepend_bos, padding)
        device = self.head.weight.device
        return BatchEncoding(batch.ids.to(device), batch.attention_mask.to(device))

    def to_tokens(self, input: str | Sequence[str], prepend_bos: bool | None = None,
                  padding_side: str = "right") -> Tensor:
        """TransformerLens' ``to_tokens``: text -> ids (B, T) on the model's device (a list padded on
        ``padding_side`` with the pad id; ``tokenize`` also gives the attention mask)."""
        return self.tokenize(input, prepend_bos, padding_side).ids

    def to_single_token(self, string: str) -> int:
        """The id of a text that is one token (TransformerLens' ``to_single_token``); a ValueError
        naming the tokens otherwise."""
        ids = self.tokenize(string, prepend_bos=False).ids[0].tolist()
        if len(ids) != 1:
            raise ValueError(f"{string!r} is {len(ids)} tokens, not one: {self.to_str_tokens(string, False)}")
        return ids[0]

    def to_str_tokens(
        self, inputs: str | Sequence[str] | Sequence[int] | Tensor, prepend_bos: bool | None = None
    ) -> list[str] | list[list[str]]:
        """Each token as text: a text or 1-D ids -> list[str]; texts or (B, T) ids -> a list per row.
        Texts get the BOS token first as ``to_tokens`` says (``prepend_bos``, TransformerLens' default)."""
        return to_str_tokens(self.require_tokenizer(), inputs, prepend_bos)

    def generate(self, input: Tensor | str | list[str], max_new_tokens: int | None = None, **settings: object
                 ) -> Tensor | str | list[str]:
        """TransformerLens' ``model.generate``: ``blocklab.nn.generate.generate(self, input, ...)`` (text in,
        text out; ids in, ids out; ``settings`` are GenerationConfig's fields, ``attention_mask``, and
        TransformerLens' keywords with its meaning: stop_at_eos, eos_token_id, use_past_kv_cache,
        freq_penalty, temperature=0.0, return_type, verbose, padding_side; ``nn.tl_generate``)."""
        return tl_generate.generate(self, input, max_new_tokens, settings)

    def to_string(self, ids: Sequence[int] | Tensor, attention_mask: Tensor | None = None) -> str | list[str]:
        """Ids -> text: 1-D -> str, (B, T) -> a str per row (positions where attention_mask is 0 left out;
        special tokens kept, as TransformerLens' ``to_string``)."""
        return to_string(self.require_tokenizer(), ids.cpu() if isinstance(ids, Tensor) else ids,
                         attention_mask.cpu() if attention_mask is not None else None)


def init_weights(model: Transformer) -> None:
    """Embeddings as the config says (``embedding.init_embeddings``); then every linear layer of the
    blocks by the config's init scheme (``init_schemes.INIT_SCHEMES``; default: PyTorch's), the head
    as ``nn.Linear`` starts, whatever the scheme (a head tied to the embedding keeps the embedding's
    init); biases 0; norms gamma 1, beta 0. DeepNorm re-initialises each block's v, o and FFN weights
    with Xavier-normal gain beta.
    """
    init_embeddings(model.config, model.embed, model.pos, model.token_type)
    in_blocks = {id(m) for m in model.blocks.modules() if isinstance(m, nn.Linear)}
    scheme, head = INIT_SCHEMES[model.config.init], INIT_SCHEMES["torch"]
    for module in model.modules():
        if isinstance(module, nn.Linear) and module.weight is not model.embed.weight:
            (scheme if id(module) in in_blocks else head)(module.weight)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
    if model.config.residual == "deepnorm":
        beta = deepnorm_beta(model.config.n_layers)
        for block in model.blocks:
            for linear in (block.attn.q, block.attn.k):
                nn.init.xavier_normal_(linear.weight, gain=1.0)
            branch = [block.attn.v, block.attn.o, block.ffn.w1, block.ffn.w2]
            for linear in branch + ([block.ffn.w3] if block.ffn.w3 is not None else []):
                nn.init.xavier_normal_(linear.weight, gain=beta)
