"""Memory of ``run_with_cache`` with every hook: blocklab against TransformerLens' HookedTransformer on the
same GPT-2 weights, each measured in its own fresh processes (alternating, so a drift of the machine hits
both alike).

Two numbers per side:

    kept      bytes of every distinct tensor the cache holds, plus the logits returned (exact: the same
              in every process). blocklab derives what TransformerLens does not cache (each head's result,
              the probabilities, a norm's output after gamma and beta) when first read, so reading one of
              those later adds its size then.
    peak      the process's resident set at its highest during the call, above where it was just before
              (Linux's VmHWM, reset through /proc/self/clear_refs): what the first call on a freshly loaded
              model needs on top of the model, the cache and the logits included. The children run with
              glibc mapping each block of 64 KiB or more on its own (MALLOC_MMAP_THRESHOLD_), and trim
              the heap before measuring, so the resident set follows the tensors alive.

    .venv/bin/python benchmarks/cache_memory.py [--shape LAYERS,D_MODEL,HEADS,VOCAB] [--batch 4 --seq 128]
        [--processes 3]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

SIDES = ("blocklab", "TransformerLens")
# glibc maps every block of 64 KiB or more on its own and unmaps it when freed, so the resident set follows
# the tensors alive (its default raises the threshold as blocks are freed, keeping freed memory resident)
EXACT_RSS = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(64 * 1024)}


def build_folder(args: argparse.Namespace, folder: Path) -> None:
    """A random GPT-2 of the asked shape saved as a transformers folder (the weights both sides load)."""
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=args.vocab,
        n_positions=max(args.seq, 8),
        n_embd=args.d_model,
        n_layer=args.layers,
        n_head=args.heads,
    )
    transformers.GPT2LMHeadModel(config).save_pretrained(str(folder))


def load(side: str, folder: Path) -> torch.nn.Module:
    if side == "blocklab":
        import blocklab as bl

        return bl.load(folder).model.eval()
    import transformers
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights

    hf = transformers.GPT2LMHeadModel.from_pretrained(str(folder))
    c = hf.config
    cfg = HookedTransformerConfig(
        n_layers=c.n_layer,
        d_model=c.n_embd,
        d_head=c.n_embd // c.n_head,
        n_heads=c.n_head,
        d_mlp=4 * c.n_embd,
        d_vocab=c.vocab_size,
        n_ctx=c.n_positions,
        act_fn="gelu_new",
        normalization_type="LN",
        eps=c.layer_norm_epsilon,
        positional_embedding_type="standard",
        device="cpu",
    )
    model = HookedTransformer(cfg)
    model.load_and_process_state_dict(
        convert_gpt2_weights(hf, cfg),
        fold_ln=False,
        center_writing_weights=False,
        center_unembed=False,
        fold_value_biases=False,
    )
    del hf
    return model.eval()


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def kept_bytes(cache: Any, logits: torch.Tensor) -> int:
    """Bytes of the distinct storages the cache holds now, and the logits'."""
    held = cache._stages.kept().values() if hasattr(cache, "_stages") else cache.values()
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in [*held, logits]}
    return sum(storages.values())


def child(side: str, folder: Path, batch: int, seq: int, vocab: int) -> dict[str, float]:
    import gc

    torch.set_num_threads(1)
    model = load(side, folder)
    tokens = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # what loading freed goes back: RSS is what is in use
        before = _status_kib("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from here
        logits, cache = model.run_with_cache(tokens)
        peak = _status_kib("VmHWM")
    return {"kept": kept_bytes(cache, logits), "peak": (peak - before) * 1024.0, "stages": len(list(cache))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="12,768,12,50257", help="layers,d_model,heads,vocab (GPT-2 small)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--processes", type=int, default=3, help="fresh processes per side")
    parser.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.layers, args.d_model, args.heads, args.vocab = (int(n) for n in args.shape.split(","))
    if args.child:
        print(json.dumps(child(args.child, args.folder, args.batch, args.seq, args.vocab)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "gpt2"
        build_folder(args, folder)
        shape = ["--batch", str(args.batch), "--seq", str(args.seq), "--shape", args.shape]
        found: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
        for i in range(args.processes):
            for side in SIDES if i % 2 == 0 else SIDES[::-1]:
                done = subprocess.run(
                    [sys.executable, __file__, "--child", side, "--folder", str(folder), *shape],
                    capture_output=True,
                    text=True,
                    check=True,
                    env=EXACT_RSS,
                )
                found[side].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(
        f"run_with_cache with every hook, GPT-2 shape ({args.layers} layers, d {args.d_model}, "
        f"{args.heads} heads, vocab {args.vocab}), batch {args.batch} x {args.seq} tokens, float32, "
        f"{args.processes} fresh processes per side"
    )
    mib = 2.0**20
    print(f"{'':28}{'blocklab':>12}{'TransformerLens':>18}{'blocklab / TransformerLens':>30}")
    for key, what in (("kept", "kept by the cache (MiB)"), ("peak", "peak above before (MiB)")):
        ours = statistics.median(r[key] for r in found["blocklab"])
        theirs = statistics.median(r[key] for r in found["TransformerLens"])
        ratio = f"{ours / theirs:>29.2f}x" if theirs > 0 else f"{'(no new pages)':>30}"
        print(f"{what:28}{ours / mib:>12.1f}{theirs / mib:>18.1f}{ratio}")
    stages = (found["blocklab"][0]["stages"], found["TransformerLens"][0]["stages"])
    print(f"stages listed: blocklab {stages[0]}, TransformerLens {stages[1]} (peak: median over processes)")


if __name__ == "__main__":
    main()
