"""Sentence embeddings from an encoder, the way sentence-transformers uses all-MiniLM-L6-v2:

    e = normalize( sum_t mask_t h_t / sum_t mask_t )       h = last hidden states (B, T, d)

mean pooling over the real tokens (padding excluded), then L2 normalization, so the cosine
similarity of two sentences is the dot product of their embeddings.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..nn.model import Transformer
from ..nn.tokens import TextTokenizer


def mean_pool(hidden: Tensor, attention_mask: Tensor) -> Tensor:
    """(B, T, d) hidden states, (B, T) mask -> (B, d) mean over the positions where mask is 1."""
    weights = attention_mask.to(hidden.dtype)[..., None]  # (B, T, 1)
    return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)


@torch.inference_mode()
def sentence_embeddings(
    model: Transformer, tokenizer: TextTokenizer, texts: Sequence[str], normalize: bool = True
) -> Tensor:
    """(N, d_model) embeddings of ``texts``: mean-pooled last hidden states, L2-normalized."""
    tokens, mask = tokenizer.encode_batch(texts, padding="right")
    hidden = model.eval().encode(tokens, attention_mask=mask)
    pooled = mean_pool(hidden, mask)
    return F.normalize(pooled, p=2, dim=-1) if normalize else pooled


def cosine_similarities(embeddings: Tensor) -> Tensor:
    """(N, d) -> (N, N) cosine similarity of every pair."""
    unit = F.normalize(embeddings, p=2, dim=-1)
    return unit @ unit.T


def format_embeddings(
    texts: Sequence[str], n_tokens: Sequence[int], emb: Tensor, cos: Tensor, dims: int
) -> str:
    """Each input's first ``dims`` embedding values, then the cosine-similarity matrix (text report)."""
    lines = [f"{emb.shape[1]}-dim embeddings (mean pooling over tokens, L2-normalized):"]
    for i, text in enumerate(texts):
        shown = " ".join(f"{v:+.4f}" for v in emb[i, :dims].tolist())
        lines.append(f"[{i}] {text!r} ({n_tokens[i]} tokens): {shown} ...")
    if len(texts) > 1:
        lines.append("cosine similarity:")
        lines.append("     " + " ".join(f"{f'[{j}]':>7}" for j in range(len(texts))))
        for i, row in enumerate(cos.tolist()):
            lines.append(f"{f'[{i}]':>4} " + " ".join(f"{v:7.4f}" for v in row))
    return "\n".join(lines)
