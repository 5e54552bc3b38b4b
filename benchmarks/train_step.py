"""A whole language-model training step against peers, at the shapes people train (issue 38 item 5).

Two shapes, each blocklab's preset against a peer with the same shapes, data and optimizer:

- ``gpt2`` (GPT-2 small: 12 layers, 768 wide, 12 heads, vocabulary 50257, learned positions, tied head):
  ``preset("gpt2")`` against a nanoGPT-style plain model written below (``PlainGPT``: one qkv Linear,
  SDPA causal, tanh-GELU MLP, pre-norm, final LayerNorm, tied head: the textbook module code).
- ``smollm2-135m`` (a Llama: 30 layers, 576 wide, 9 query and 3 key/value heads, SwiGLU, RMSNorm, rotary):
  ``preset("smollm2-135m")`` against ``transformers``' ``LlamaForCausalLM`` built from the same config
  (its SDPA attention).

One step: forward on (batch, seq) tokens, cross-entropy against the next tokens, backward, AdamW step
(lr 3e-4, weight decay 0.1, the same for both), gradients dropped. Timed in interleaved rounds (the order
rotating); each figure is the median within-round ratio, the peer's step time over blocklab's (above 1:
blocklab is faster), with its 95% bootstrap interval, beside each one's tokens/s. ``--dtype bfloat16``
trains under autocast with float32 weights and optimizer state (mixed precision, as nanoGPT and
``blocklab train --dtype bfloat16`` do); ``--device cuda`` is what ``scripts/gpu-check.sh`` runs.

    .venv/bin/python benchmarks/train_step.py [--shapes gpt2,smollm2-135m] [--batch 4] [--seq 256]
        [--rounds 5] [--layers N] [--vocab N] [--device cpu|cuda] [--dtype float32|bfloat16] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from blocklab import ModelConfig, Transformer
from blocklab.bench.stats import Bootstrap, median_ratio, time_rounds, within_round_ratios
from blocklab.nn.presets import preset

SHAPES = ("gpt2", "smollm2-135m")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# ---- the nanoGPT-style peer: plain modules, as a tutorial writes them --------------------------------


class PlainBlock(nn.Module):
    def __init__(self, d: int, heads: int, d_ff: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.attn_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, d_ff), nn.Linear(d_ff, d)

    def forward(self, x: Tensor) -> Tensor:  # (B, T, d)
        B, T, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)  # (B, T, d) each
        q, k, v = (t.view(B, T, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))  # (B,H,T,dh)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, d)
        x = x + self.attn_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class PlainGPT(nn.Module):
    """GPT-2 as nanoGPT writes it, at a ModelConfig's sizes."""

    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(c.vocab_size, c.d_model), nn.Embedding(c.max_seq_len, c.d_model)
        self.blocks = nn.ModuleList(PlainBlock(c.d_model, c.n_heads, c.d_ff) for _ in range(c.n_layers))
        self.ln_f = nn.LayerNorm(c.d_model)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as GPT-2

    def loss(self, tokens: Tensor, targets: Tensor) -> Tensor:
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))  # (B, T, d)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, vocab)
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


# ---- the models of a shape --------------------------------------------------------------------------


def shape_config(shape: str, layers: int | None, seq: int, vocab: int | None = None) -> ModelConfig:
    c = preset(shape)
    return c.replace(n_layers=layers or c.n_layers, max_seq_len=max(seq, min(c.max_seq_len, 2048)),
                     vocab_size=vocab or c.vocab_size)


def _hf_llama(c: ModelConfig) -> nn.Module:
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.d_ff,
        num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads, num_key_value_heads=c.n_kv_heads,
        max_position_embeddings=c.max_seq_len,
        rope_theta=c.rotary_base, rms_norm_eps=c.eps, tie_word_embeddings=c.tie_embeddings,
        attn_implementation="sdpa", bos_token_id=0, eos_token_id=0,
    )
    model = transformers.LlamaForCausalLM(config)

    def loss(tokens: Tensor, targets: Tensor) -> Tensor:
        logits = model(input_ids=tokens).logits  # (B, T, vocab)
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    model.loss = loss
    return model


@dataclass
class Contender:
    name: str
    module: nn.Module
    loss: Callable[[Tensor, Tensor], Tensor]


def contenders(shape: str, c: ModelConfig) -> list[Contender]:
    """blocklab's model of the shape, then its peer, seeded alike."""
    torch.manual_seed(0)
    ours = Transformer(c)
    torch.manual_seed(0)
    if shape == "gpt2":
        plain = PlainGPT(c)
        peer = Contender("nanoGPT-style", plain, plain.loss)
    else:
        hf = _hf_llama(c)
        peer = Contender("transformers Llama", hf, hf.loss)
    return [Contender("blocklab", ours, lambda x, y: ours(x, targets=y)[1]), peer]


def step_fn(contender: Contender, tokens: Tensor, device: torch.device,
            dtype: torch.dtype) -> Callable[[], None]:
    """One training step: forward and loss (under autocast below float32), backward, AdamW, grads dropped."""
    optimizer = torch.optim.AdamW(contender.module.parameters(), lr=3e-4, weight_decay=0.1)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    mixed = torch.autocast(device.type, dtype=dtype) if dtype != torch.float32 else contextlib.nullcontext()
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def step() -> None:
        with mixed:
            loss = contender.loss(inputs, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize()  # the time of the work, not of its launch

    return step


def model_flops(c: ModelConfig, params: int, tokens: int, seq: int) -> float:
    """Training FLOPs of ``tokens`` tokens (PaLM's count, as nanoGPT's MFU): 6 per parameter per token plus
    attention's 12 L d T per token (not halved for the causal mask)."""
    return tokens * (6 * params + 12 * c.n_layers * c.d_model * seq)


def measure(shape: str, args: argparse.Namespace) -> dict[str, Any]:
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    c = shape_config(shape, args.layers, args.seq, args.vocab)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, c.vocab_size, (args.batch, args.seq + 1), generator=gen).to(device)
    pair = contenders(shape, c)
    steps = {}
    for contender in pair:
        contender.module.to(device).train()
        steps[contender.name] = step_fn(contender, tokens, device, dtype)
    times = time_rounds(steps, args.rounds, min_seconds=0.0)
    ours, peer = pair[0].name, pair[1].name
    ratios = within_round_ratios(times[peer], times[ours])
    low, high = Bootstrap().interval(ratios)
    trained = args.batch * args.seq
    params = sum(p.numel() for p in pair[0].module.parameters())
    rate = {name: trained / sorted(t)[len(t) // 2] for name, t in times.items()}
    return {"shape": shape, "layers": c.n_layers, "peer": peer, "batch": args.batch, "seq": args.seq,
            "speedup": median_ratio(times[peer], times[ours]), "interval": [low, high],
            "tokens_per_s": rate, "params": params,
            "model_flops_per_s": {n: r * model_flops(c, params, 1, args.seq) for n, r in rate.items()}}


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--layers", type=int, default=None,
                        help="blocks of each model (default: the shape's)")
    parser.add_argument("--vocab", type=int, default=None,
                        help="vocabulary size (default: the shape's; smaller for a smoke run)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=list(DTYPES))
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    parser.add_argument("--json", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"train step: batch {args.batch} x seq {args.seq}, AdamW, {args.device}, {args.dtype}"
          f"{' autocast (float32 weights)' if args.dtype != 'float32' else ''}, {torch.get_num_threads()} "
          f"thread(s), median of {args.rounds} interleaved rounds; load average {os.getloadavg()[0]:.1f}")
    print(f"{'shape':<14}{'layers':>7}  {'peer':<20}{'blocklab tok/s':>15}{'peer tok/s':>12}"
          f"{'speed-up':>10}  95% interval")
    rows = []
    for shape in args.shapes.split(","):
        row = measure(shape, args)
        rows.append(row)
        ours, theirs = row["tokens_per_s"]["blocklab"], row["tokens_per_s"][row["peer"]]
        print(f"{shape:<14}{row['layers']:>7}  {row['peer']:<20}{ours:>15.0f}{theirs:>12.0f}"
              f"{row['speedup']:>9.2f}x  [{row['interval'][0]:.2f}, {row['interval'][1]:.2f}]", flush=True)
    print("speed-up: the peer's step time over blocklab's (above 1: blocklab is faster); "
          f"load average {os.getloadavg()[0]:.1f} at the end")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": args.device, "dtype": args.dtype, "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
