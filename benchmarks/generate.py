"""Generation speed: blocklab's KV-cached ``generate`` vs ``transformers``' GPT-2 ``generate``.

Both run the same randomly initialised GPT-2 (default: GPT-2 small's shape, 124M parameters),
imported into blocklab through a Hugging Face folder, on the same prompts with the same settings
(greedy, or with ``--sample`` temperature / top-k / top-p drawn from generators seeded alike), for
the same number of new tokens. ``--ragged`` gives the batch's prompts different lengths (half to all
of ``--prompt``), left-padded with an attention mask. The two are timed interleaved in one run and
the best of ``--repeats`` is kept; the ratio is what to read (absolute tokens/s are noisy on a shared
machine). Also reports whether both produced the same tokens.

    .venv/bin/python benchmarks/generate.py [--layers 12 --d-model 768 --heads 12]
        [--prompt 32 --new 64 --batch 1 --ragged --repeats 3]
        [--sample --temperature 0.8 --top-k 50 --top-p 0.95 --seed 0]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from blocklab.nn.generate import GenerationConfig, generate
from blocklab.nn.tokens import pad_batch
from blocklab.weights import load_pretrained


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    """Build the model, time both generators interleaved, print tokens/s and the ratio."""
    from transformers import GPT2Config, GPT2LMHeadModel

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens")
    parser.add_argument("--new", type=int, default=64, help="new tokens per sequence")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--ragged", action="store_true", help="prompts of different lengths, left-padded")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sample", action="store_true", help="sample instead of greedy")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    sampling = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p) if args.sample else {}
    settings = GenerationConfig(max_new_tokens=args.new, do_sample=args.sample,
                                seed=args.seed if args.sample else None, **sampling)

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=args.vocab, n_positions=1024, n_embd=args.d_model, n_layer=args.layers,
                        n_head=args.heads, bos_token_id=0, eos_token_id=0)
    hf = GPT2LMHeadModel(config).eval()
    with tempfile.TemporaryDirectory() as folder:
        hf.save_pretrained(folder)
        model, _ = load_pretrained(folder)
    lengths = torch.linspace(args.prompt, max(1, args.prompt // 2), args.batch).round().long().tolist() \
        if args.ragged else [args.prompt] * args.batch
    prompt, mask = pad_batch([torch.randint(0, args.vocab, (n,)).tolist() for n in lengths], 0, "left")
    hf_sampling = {"top_k": args.top_k or 0, "top_p": args.top_p or 1.0, "temperature": args.temperature} \
        if args.sample else {}

    def ours() -> torch.Tensor:
        return generate(model, prompt, config=settings, attention_mask=mask)

    def theirs() -> torch.Tensor:
        torch.manual_seed(args.seed)  # transformers samples from the global generator
        with torch.inference_mode():
            return hf.generate(prompt, attention_mask=mask, max_new_tokens=args.new, min_new_tokens=args.new,
                               do_sample=args.sample, eos_token_id=None, pad_token_id=0, **hf_sampling)

    same = torch.equal(ours(), theirs())  # also the warm-up
    times = {"blocklab": [], "transformers": []}
    for _ in range(args.repeats):  # interleaved, so both see the same machine load
        times["blocklab"].append(_timed(ours))
        times["transformers"].append(_timed(theirs))
    tokens = args.batch * args.new
    rate = {name: tokens / min(t) for name, t in times.items()}
    n_params = sum(p.numel() for p in model.parameters())
    decoding = f"sampled ({', '.join(f'{k}={v}' for k, v in sampling.items())})" if args.sample else "greedy"
    print(f"GPT-2 shape: {args.layers} layers, d_model {args.d_model}, {args.heads} heads, "
          f"vocab {args.vocab} ({n_params / 1e6:.1f}M parameters); batch {args.batch}, prompt {args.prompt}"
          f"{' (ragged: ' + ','.join(map(str, lengths)) + ', left-padded)' if args.ragged else ''}, "
          f"{args.new} new tokens, {decoding}, float32, {torch.get_num_threads()} threads, "
          f"best of {args.repeats}; load average {os.getloadavg()[0]:.1f}")
    for name, r in rate.items():
        print(f"  {name:<13} {r:8.1f} tokens/s")
    print(f"  ratio blocklab / transformers: {rate['blocklab'] / rate['transformers']:.2f}x")
    print(f"  same tokens: {same}")


if __name__ == "__main__":
    main()
