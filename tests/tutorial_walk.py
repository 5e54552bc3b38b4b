"""The tutorials' worked model by hand (the tutorial walk's tests, terminal and browser): its weights by
stage and every step of its forward pass in float64 with plain torch ops, no blocklab code."""

from __future__ import annotations

import math

import torch

SENTENCE = "<BOS> I like transformers <EOS>"
TOKENS = SENTENCE.split()
IDS = [1, 3, 4, 5, 2]  # tiny-lm's vocabulary: <PAD> <BOS> <EOS> I like transformers
D, H, DK, DFF, V, EPS = 16, 2, 8, 64, 6, 1e-5
DECIMALS = 6


def weights(seed: int = 7) -> dict[str, torch.Tensor]:
    """The tutorial model's weights by stage, float32 values (what the model holds) as float64."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape: int, scale: float = 0.5) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).float().double()

    w = {"embedding": r(V, D, scale=1.0), "W_vocab": r(V, D), "blocks.0.attn.bo": r(D),
         "blocks.0.ffn.W1": r(DFF, D), "blocks.0.ffn.b1": r(DFF), "blocks.0.ffn.W2": r(D, DFF, scale=0.2),
         "blocks.0.ffn.b2": r(D)}
    for m in "qkv":
        for h in range(H):
            w[f"blocks.0.attn.W{m}.h{h}"], w[f"blocks.0.attn.b{m}.h{h}"] = r(DK, D, scale=0.25), r(DK)
    for h in range(H):
        w[f"blocks.0.attn.Wo.h{h}"] = r(D, DK)
    for ln in ("ln1", "ln2"):
        w[f"blocks.0.{ln}.gamma"], w[f"blocks.0.{ln}.beta"] = 1 + r(D, scale=0.1), r(D, scale=0.1)
    return w


def layer_norm(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, name: str,
               out: dict) -> torch.Tensor:
    mu = x.sum(-1) / D
    var = ((x - mu[:, None]) ** 2).sum(-1) / D
    denom = torch.sqrt(var + EPS)
    z_hat = (x - mu[:, None]) / denom[:, None]
    y = gamma * z_hat + beta
    out.update({f"{name}: input": x, f"{name}: mu": mu[:, None], f"{name}: var": var[:, None],
                f"{name}: sqrt(var+eps)": denom[:, None],
                f"{name}: z_hat": z_hat, f"{name}: gamma": gamma[None], f"{name}: beta": beta[None],
                f"{name}: output": y})
    return y


def hand_walk(w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every step of the walk by hand, float64, by its title."""
    out: dict[str, torch.Tensor] = {}
    tok = w["embedding"][IDS]
    pe = torch.zeros(5, D, dtype=torch.float64)
    for p in range(5):
        for i in range(D // 2):
            pe[p, 2 * i] = math.sin(p / 10000 ** (2 * i / D))
            pe[p, 2 * i + 1] = math.cos(p / 10000 ** (2 * i / D))
    x = tok + pe
    out.update({"token embeddings": tok, "positions": pe, "x0": x})
    qkv = {m: [x @ w[f"blocks.0.attn.W{m}.h{h}"].T + w[f"blocks.0.attn.b{m}.h{h}"] for h in range(H)]
           for m in "qkv"}
    mask = torch.triu(torch.ones(5, 5, dtype=torch.bool), diagonal=1)
    heads = []
    for h in range(H):
        for m in "qkv":
            out[f"block 0: {m.upper()}, head {h}"] = qkv[m][h]
        s = qkv["q"][h] @ qkv["k"][h].T
        scaled = s / math.sqrt(DK)
        masked = scaled.masked_fill(mask, float("-inf"))
        e = torch.exp(masked)
        sums = e.sum(-1)
        a = e / sums[:, None]
        heads.append(a @ qkv["v"][h])
        out.update({f"block 0: head {h}: QK^T": s, f"block 0: head {h}: scaled": scaled,
                    f"block 0: head {h}: masked": masked, f"block 0: head {h}: exp": e,
                    f"block 0: head {h}: row sums": sums[:, None], f"block 0: head {h}: weights": a,
                    f"block 0: head {h}: weights @ V": heads[h]})
    concat = torch.cat(heads, dim=1)
    wo = torch.cat([w["blocks.0.attn.Wo.h0"], w["blocks.0.attn.Wo.h1"]], dim=1)
    attn = concat @ wo.T + w["blocks.0.attn.bo"]
    r1 = x + attn
    out.update({"block 0: concatenation": concat, "block 0: Wo": attn, "block 0: residual sum resid_mid": r1})
    y = layer_norm(r1, w["blocks.0.ln1.gamma"], w["blocks.0.ln1.beta"], "block 0: ln1", out)
    hidden = y @ w["blocks.0.ffn.W1"].T + w["blocks.0.ffn.b1"]
    act = torch.clamp(hidden, min=0)
    f = act @ w["blocks.0.ffn.W2"].T + w["blocks.0.ffn.b2"]
    r2 = y + f
    out.update({"block 0: W1 x + b1": hidden, "block 0: activation": act, "block 0: W2": f,
                "block 0: residual sum resid_post": r2})
    z = layer_norm(r2, w["blocks.0.ln2.gamma"], w["blocks.0.ln2.beta"], "block 0: ln2", out)
    logits = z @ w["W_vocab"].T
    probs = torch.exp(logits) / torch.exp(logits).sum(-1, keepdim=True)
    out.update({"logits": logits, "probabilities": probs})
    return out
