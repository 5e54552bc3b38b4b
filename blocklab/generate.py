"""Text generation for causal models: greedy decoding and top-k sampling, with a KV cache.

The prompt runs through the model once (filling each layer's ``KVCache``); every later step
feeds only the newest token, whose query attends to the cached keys and values. Without the
cache (``use_cache=False``) each step re-runs the whole sequence; both give the same tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .attention import KVCache
from .model import Transformer


def new_kv_cache(model: Transformer, batch: int, max_len: int) -> list[KVCache]:
    """One empty KVCache per block, for ``batch`` sequences of up to ``max_len`` positions."""
    c, weight = model.config, model.embed.weight
    shape = (batch, c.n_heads, max_len, c.d_head)
    return [KVCache(*shape, weight.dtype, weight.device) for _ in range(c.n_layers)]


def next_token(
    logits: Tensor, top_k: int | None, temperature: float, generator: torch.Generator | None
) -> Tensor:
    """(B, vocab) logits -> (B,) ids: argmax, or a sample from the top-k softmax(logits / temperature)."""
    if top_k is None:
        return logits.argmax(-1)
    values, indices = torch.topk(logits.float() / temperature, min(top_k, logits.shape[-1]), dim=-1)  # (B, k)
    choice = torch.multinomial(torch.softmax(values, dim=-1), 1, generator=generator)  # (B, 1)
    return indices.gather(-1, choice).squeeze(-1)


def _check(
    model: Transformer, tokens: Tensor, max_new_tokens: int, top_k: int | None, temperature: float
) -> None:
    if not model.config.causal:
        raise ValueError("generate needs a causal model (ModelConfig.causal=true); this one sees the future")
    if tokens.dim() != 2 or tokens.shape[1] < 1:
        raise ValueError(f"prompt must be (batch, seq) with seq >= 1, got shape {tuple(tokens.shape)}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 0")
    total, limit = tokens.shape[1] + max_new_tokens, model.config.max_seq_len
    if total > limit:
        raise ValueError(f"prompt ({tokens.shape[1]} tokens) + max_new_tokens ({max_new_tokens}) = {total} "
                         f"exceeds the model's max_seq_len={limit}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k={top_k} must be >= 1")
    if not temperature > 0:
        raise ValueError(f"temperature={temperature} must be > 0")


@torch.inference_mode()
def generate(
    model: Transformer,
    tokens: Tensor,
    max_new_tokens: int,
    top_k: int | None = None,
    temperature: float = 1.0,
    seed: int | None = None,
    eos_id: int | None = None,
    use_cache: bool = True,
) -> Tensor:
    """Extend ``tokens`` (B, T) by up to ``max_new_tokens``: greedy when ``top_k`` is None, else sampled
    from the ``top_k`` most likely tokens. A row that produced ``eos_id`` is padded with it; when every
    row has, generation stops. Returns (B, T + generated)."""
    _check(model, tokens, max_new_tokens, top_k, temperature)
    was_training = model.training
    model.eval()
    generator = None
    if top_k is not None:
        generator = torch.Generator(device=tokens.device)
        generator.manual_seed(seed if seed is not None else torch.seed())
    out = tokens
    cache = new_kv_cache(model, tokens.shape[0], tokens.shape[1] + max_new_tokens) if use_cache else None
    step_input = tokens
    done = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
    try:
        for _ in range(max_new_tokens):
            hidden = model.encode(step_input if use_cache else out, kv_cache=cache)  # (B, T_step, d)
            logits = model.head(hidden[:, -1])  # only the last position predicts: (B, vocab)
            new = next_token(logits, top_k, temperature, generator)  # (B,)
            if eos_id is not None:
                new = new.masked_fill(done, eos_id)
                done = done | (new == eos_id)
            out = torch.cat([out, new[:, None]], dim=1)
            step_input = new[:, None]
            if eos_id is not None and bool(done.all()):
                break
    finally:
        model.train(was_training)
    return out
