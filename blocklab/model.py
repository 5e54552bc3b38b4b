"""The stack (docs/concepts.md#the-stack): embeddings, positions, N blocks, final norm, LM head, loss.

    x0 = Embed(tokens) + PE                PE: sinusoidal (fixed) or learned
    x_{l+1} = Block_l(x_l)                 l = 0..N-1
    logits = ln_f(x_N) @ W_vocab^T         ln_f for pre-norm; head optionally tied to Embed
    loss = cross_entropy(logits, targets)  targets of -100 (padding) are ignored
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import KVCache
from .block import TransformerBlock, deepnorm_beta
from .cache import HookedModule
from .config import ModelConfig
from .hooks import HookPoint, name_hook_points
from .norms import NoNorm, build_norm
from .tokenizer import BatchEncoding, TextTokenizer, to_str_tokens, to_string

IGNORE_INDEX = -100  # targets at padding / unscored positions


def sinusoidal_table(max_seq_len: int, d_model: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(p / 10000^(2i/d)); (max_seq_len, d)."""
    pos = torch.arange(max_seq_len, dtype=torch.float64)[:, None]  # (P, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (ceil(d/2),)
    angle = pos / torch.pow(10000.0, two_i / d_model)  # (P, ceil(d/2))
    pe = torch.zeros(max_seq_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return pe.to(dtype)


class SinusoidalPositions(nn.Module):
    """Fixed positional encoding; a non-persistent buffer, so it adds no state-dict key."""

    def __init__(self, max_seq_len: int, d_model: int) -> None:
        super().__init__()
        self.max_seq_len, self.d_model = max_seq_len, d_model
        self.register_buffer("pe", sinusoidal_table(max_seq_len, d_model), persistent=False)

    def _apply(self, fn, recurse=True):  # noqa: ANN001, ANN202 - nn.Module's signature
        # .double() etc. would cast the float32 table; rebuild it from float64 at the new dtype
        super()._apply(fn, recurse)
        table = sinusoidal_table(self.max_seq_len, self.d_model, torch.float64)
        self.pe = table.to(self.pe.device, self.pe.dtype)
        return self

    def forward(self, seq_len: int, start: int = 0) -> Tensor:  # (T, d_model), positions start..start+T
        return self.pe[start : start + seq_len]


class LearnedPositions(nn.Embedding):
    """Learned positional embedding; key ``pos.weight (max_seq_len, d_model)``."""

    def forward(self, seq_len: int, start: int = 0) -> Tensor:  # (T, d_model), positions start..start+T
        return self.weight[start : start + seq_len]


def build_positions(config: ModelConfig) -> nn.Module | None:
    """The positional encoding a config names (None for "none")."""
    table = {
        "sinusoidal": lambda: SinusoidalPositions(config.max_seq_len, config.d_model),
        "learned": lambda: LearnedPositions(config.max_seq_len, config.d_model),
        "none": lambda: None,
    }
    return table[config.pos_encoding]()


class Transformer(HookedModule):
    """Keys: ``embed.weight``, ``pos.weight`` (learned), ``token_type.weight``, ``embed_ln.*``,
    ``blocks.{i}.*``, ``ln_f.*`` (when final_norm), ``head.weight`` (absent from the parameters
    when tied to ``embed``). Stages, in forward order (``STAGES``; ``blocks``: each block's, in its
    order): ``embed``, ``blocks.{i}.*``, ``ln_f``, ``logits``, ``probs``, ``loss``.

    ``tokenizer``: the model's tokenizer (``blocklab.tokenizer.TextTokenizer``) or None; the loaders
    set it, ``to_tokens`` / ``to_str_tokens`` / ``to_string`` use it.
    """

    tokenizer: TextTokenizer | None
    STAGES = ("embed", "blocks", "ln_f", "logits", "probs", "loss")

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        c = self.config = config
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        self.pos = build_positions(c)
        self.token_type = nn.Embedding(c.type_vocab_size, c.d_model) if c.type_vocab_size else None
        norm = lambda: build_norm(c.norm, c.d_model, c.eps, c.bias, fused=c.components_fused)  # noqa: E731
        self.embed_ln = norm() if c.embed_norm else NoNorm()
        self.drop = nn.Dropout(c.dropout) if c.dropout > 0 else nn.Identity()
        self.blocks = nn.ModuleList(TransformerBlock(c) for _ in range(c.n_layers))
        self.ln_f = norm() if c.final_norm else NoNorm()
        self.head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.head.weight = self.embed.weight
        for stage in self.STAGES:
            if stage != "blocks":
                setattr(self, f"hook_{stage}", HookPoint())
        self.tokenizer = None  # a plain attribute: not a module, not in the state dict
        init_weights(self)
        name_hook_points(self)

    def hook_names(self) -> list[str]:
        """Every stage name, in the order a forward pass reaches them."""
        order: list[str] = []
        for stage in self.STAGES:
            if stage == "blocks":
                order += [f"blocks.{i}.{s}" for i, b in enumerate(self.blocks) for s in b.hook_names()]
            else:
                order.append(stage)
        return order

    def _check_tokens(self, tokens: Tensor, past: int = 0) -> None:
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be (batch, seq) integers, got shape {tuple(tokens.shape)}")
        T = past + tokens.shape[1]
        if T > self.config.max_seq_len:
            raise ValueError(f"sequence length {T} exceeds max_seq_len={self.config.max_seq_len}")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.config.vocab_size):
            raise ValueError(
                f"token ids must be in [0, {self.config.vocab_size}); got min {int(tokens.min())}, "
                f"max {int(tokens.max())}"
            )

    def encode(
        self,
        tokens: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        kv_cache: list[KVCache] | None = None,
        position_ids: Tensor | None = None,
    ) -> Tensor:
        """Last hidden states (B, T, d_model), after the final norm where there is one.

        attention_mask: (B, T), 1 for real tokens and 0 for padding (Hugging Face convention).
        kv_cache: one KVCache per block (generation): tokens are the positions after the cached ones.
        position_ids: (B, T) position of each token (default past, past+1, ...).
        """
        past = kv_cache[0].length if kv_cache is not None else 0
        self._check_tokens(tokens, past)
        key_padding_mask = attention_mask == 0 if attention_mask is not None else None  # True at padding
        pad = key_padding_mask[:, past:] if key_padding_mask is not None else None  # these tokens' own
        T = tokens.shape[1]
        x = self.embed(tokens)  # (B, T, d_model)
        if self.pos is not None:  # (T, d) or, with position_ids, (B, T, d)
            table = self.pos(self.config.max_seq_len)  # (max_seq_len, d)
            x = x + (self.pos(T, past) if position_ids is None else table[position_ids])
        if self.token_type is not None:
            types = token_type_ids if token_type_ids is not None else torch.zeros_like(tokens)
            x = x + self.token_type(types)
        x = self.hook_embed(self.drop(self.embed_ln(x, pad)))
        if kv_cache is None:
            for block in self.blocks:
                x = block(x, key_padding_mask)
        else:
            for block, cache in zip(self.blocks, kv_cache, strict=True):
                x = block(x, key_padding_mask, cache)
        return self.hook_ln_f(self.ln_f(x, pad))

    def forward(
        self,
        tokens: Tensor,
        targets: Tensor | None = None,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Logits (B, T, vocab); with targets (B, T), also the mean cross-entropy over targets != -100."""
        logits = self.hook_logits(self.head(self.encode(tokens, attention_mask, token_type_ids)))
        full = logits if logits.dtype == torch.float64 else logits.float()  # softmax/CE never in bf16
        if self.hook_probs.active:  # softmax only when someone looks at it
            self.hook_probs(torch.softmax(full, dim=-1))
        if targets is None:
            return logits
        loss = F.cross_entropy(full.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)
        return logits, self.hook_loss(loss)

    def require_tokenizer(self) -> TextTokenizer:
        """The model's tokenizer; a ValueError saying how to attach one when there is none."""
        if self.tokenizer is None:
            raise ValueError(
                "this model has no tokenizer: set model.tokenizer (a task's, e.g. "
                "blocklab.tasks.get_task('tiny-lm').tokenizer), or load the model with "
                "blocklab.load(path), which attaches the tokenizer stored with it"
            )
        return self.tokenizer

    def to_tokens(self, texts: str | Sequence[str], padding: str = "right") -> BatchEncoding:
        """Texts -> (ids (B, T), attention_mask (B, T)) on the model's device, padded on the ``padding``
        side: "right" (encoders, scoring) or "left" (generation: every row ends in the last column)."""
        batch = self.require_tokenizer().encode_batch([texts] if isinstance(texts, str) else texts, padding)
        device = self.head.weight.device
        return BatchEncoding(batch.ids.to(device), batch.attention_mask.to(device))

    def to_str_tokens(
        self, inputs: str | Sequence[str] | Sequence[int] | Tensor
    ) -> list[str] | list[list[str]]:
        """Each token as text: a text or 1-D ids -> list[str]; texts or (B, T) ids -> a list per row."""
        return to_str_tokens(self.require_tokenizer(), inputs)

    def to_string(self, ids: Sequence[int] | Tensor, attention_mask: Tensor | None = None) -> str | list[str]:
        """Ids -> text: 1-D -> str, (B, T) -> a str per row (positions where attention_mask is 0 left out)."""
        return to_string(self.require_tokenizer(), ids.cpu() if isinstance(ids, Tensor) else ids,
                         attention_mask.cpu() if attention_mask is not None else None)


def init_weights(model: Transformer) -> None:
    """GPT-style init: linears and embeddings N(0, 0.02), biases 0, norms gamma 1 beta 0.

    DeepNorm re-initialises each block's v, o and FFN weights with Xavier-normal gain beta.
    """
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
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
