"""Generation speed: blocklab's KV-cached ``generate`` vs ``transformers``' ``generate``, on the shapes of
GPT-2 small (124M) and SmolLM2-135M (a Llama: 30 layers, 576 wide, 9 query and 3 key/value heads).

Each shape is a randomly initialised ``transformers`` model, imported into blocklab through a Hugging
Face folder, so both run the same weights on the same prompts with the same settings: greedy, or sampled
(temperature 0.8, top-k 50, top-p 0.95) from generators seeded alike, for the same number of new tokens,
at batch 1 and 8 (``--ragged``: the batch's prompts of different lengths, left-padded with a mask). The
two are timed interleaved in one process and the best of ``--repeats`` is kept; the speed-up (blocklab's
tokens/s over transformers') is what to read, absolute tokens/s move with the machine's load. Each row
also says whether both produced the same tokens. At batch 1 blocklab's steps read packed copies of the
weights (nn/packed.py), made once by the first call (the untimed warm-up, which transformers gets too);
their size is printed per shape.

    .venv/bin/python benchmarks/generate.py [--shapes gpt2-small,smollm2-135m] [--batches 1,8]
        [--decodings greedy,sampled] [--prompt 32 --new 64 --repeats 3 --threads 1 --ragged] [--tiny]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from blocklab.nn.generate import GenerationConfig, generate
from blocklab.nn.packed import packed_bytes
from blocklab.nn.tokens import pad_batch
from blocklab.weights import load_pretrained

SAMPLING = {"temperature": 0.8, "top_k": 50, "top_p": 0.95}
TINY = {"gpt2-small": {"n_layer": 1, "n_embd": 64, "n_head": 2, "vocab_size": 100},
        "smollm2-135m": {"num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 128,
                         "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 100}}


def build(shape: str, tiny: bool) -> Any:
    """The transformers model of a shape (random weights, seeded)."""
    import transformers

    torch.manual_seed(0)
    if shape == "gpt2-small":
        fields = {"vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12}
        config = transformers.GPT2Config(**{**fields, **(TINY[shape] if tiny else {})}, bos_token_id=0,
                                         eos_token_id=0)
        return transformers.GPT2LMHeadModel(config).eval()
    fields = {"vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
              "num_attention_heads": 9, "num_key_value_heads": 3, "max_position_embeddings": 2048,
              "rope_theta": 100000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": True}
    config = transformers.LlamaConfig(**{**fields, **(TINY[shape] if tiny else {})}, bos_token_id=0,
                                      eos_token_id=0)
    return transformers.LlamaForCausalLM(config).eval()


def _timed(fn: Callable[[], object], times: list[float], device: torch.device) -> None:
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # the time of the work, not of its launch
    times.append(time.perf_counter() - start)


def compare(hf: Any, model: Any, batch: int, sampled: bool, args: argparse.Namespace) -> dict[str, Any]:
    """Both generators on one setting: tokens/s of each (best of the repeats) and whether they agree."""
    vocab, device = hf.config.vocab_size, torch.device(getattr(args, "device", "cpu"))
    lengths = torch.linspace(args.prompt, max(1, args.prompt // 2), batch).round().long().tolist() \
        if args.ragged else [args.prompt] * batch
    g = torch.Generator().manual_seed(batch)
    rows = [torch.randint(1, vocab, (n,), generator=g).tolist() for n in lengths]
    prompt, mask = (t.to(device) for t in pad_batch(rows, 0, "left"))
    sampling = SAMPLING if sampled else {}
    settings = GenerationConfig(max_new_tokens=args.new, do_sample=sampled, seed=0 if sampled else None,
                                **sampling)

    def ours() -> torch.Tensor:
        return generate(model, prompt, config=settings, attention_mask=mask)

    def theirs() -> torch.Tensor:
        torch.manual_seed(0)  # transformers samples from the global generator
        with torch.inference_mode():
            return hf.generate(prompt, attention_mask=mask, max_new_tokens=args.new, min_new_tokens=args.new,
                               do_sample=sampled, eos_token_id=None, pad_token_id=0, **sampling)

    same = torch.equal(ours(), theirs())  # also the warm-up
    times: dict[str, list[float]] = {"blocklab": [], "transformers": []}
    for _ in range(args.repeats):  # interleaved, so both see the same machine load
        _timed(ours, times["blocklab"], device)
        _timed(theirs, times["transformers"], device)
    rate = {name: batch * args.new / min(t) for name, t in times.items()}
    return {"rate": rate, "same": same}


def models(shape: str, tiny: bool, device: str = "cpu") -> tuple[Any, Any]:
    """(transformers' model, blocklab's import of it through a Hugging Face folder), on ``device``."""
    hf = build(shape, tiny)
    with tempfile.TemporaryDirectory() as folder:
        hf.save_pretrained(folder)
        model, _ = load_pretrained(folder)
    return hf.to(device), model.to(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="gpt2-small,smollm2-135m")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--decodings", default="greedy,sampled")
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens")
    parser.add_argument("--new", type=int, default=64, help="new tokens per sequence")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--ragged", action="store_true", help="prompts of different lengths, left-padded")
    parser.add_argument("--tiny", action="store_true", help="each shape at 1 layer, width 64 (a smoke run)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shapes, batches = args.shapes.split(","), [int(b) for b in args.batches.split(",")]
    decodings = args.decodings.split(",")
    print(f"generate: prompt {args.prompt}{' (ragged, left-padded)' if args.ragged else ''}, {args.new} new "
          f"tokens, float32, {args.threads} thread(s), best of {args.repeats} interleaved; sampled: "
          f"{', '.join(f'{k} {v}' for k, v in SAMPLING.items())}; load average {os.getloadavg()[0]:.1f}")
    print(f"{'shape':<14}{'batch':>6}  {'decoding':<9}{'blocklab tok/s':>16}{'transformers tok/s':>20}"
          f"{'speed-up':>10}  same tokens")
    for shape in shapes:
        hf, model = models(shape, args.tiny)
        for batch in batches:
            for decoding in decodings:
                row = compare(hf, model, batch, decoding == "sampled", args)
                ours, theirs = row["rate"]["blocklab"], row["rate"]["transformers"]
                print(f"{shape:<14}{batch:>6}  {decoding:<9}{ours:>16.1f}{theirs:>20.1f}"
                      f"{ours / theirs:>9.2f}x  {row['same']}")
        print(f"{shape}: packed copies for batch 1 {packed_bytes(model) / 2**20:.0f} MiB beside "
              f"{sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20:.0f} MiB of weights")
    print("speed-up: blocklab's tokens/s over transformers' (above 1: blocklab is faster)")


if __name__ == "__main__":
    main()
