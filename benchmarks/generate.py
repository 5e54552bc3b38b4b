"""Generation speed: blocklab's KV-cached ``generate`` vs ``transformers``' GPT-2 ``generate``.

Both run the same randomly initialised GPT-2 (default: GPT-2 small's shape, 124M parameters),
imported into blocklab through a Hugging Face folder, on the same prompt, greedy, for the same
number of new tokens. They are timed interleaved in one run and the best of ``--repeats`` is
kept; the ratio is what to read (absolute tokens/s are noisy on a shared machine). Also
reports whether both produced the same tokens.

    .venv/bin/python benchmarks/generate.py [--layers 12 --d-model 768 --heads 12]
        [--prompt 32 --new 64 --batch 1 --repeats 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from blocklab.generate import generate  # noqa: E402
from blocklab.interop import load_pretrained  # noqa: E402


def _best_time(fn, repeats: int) -> float:
    return min(_timed(fn) for _ in range(repeats))


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
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=args.vocab, n_positions=1024, n_embd=args.d_model, n_layer=args.layers,
                        n_head=args.heads, bos_token_id=0, eos_token_id=0)
    hf = GPT2LMHeadModel(config).eval()
    with tempfile.TemporaryDirectory() as folder:
        hf.save_pretrained(folder)
        model, _ = load_pretrained(folder)
    prompt = torch.randint(0, args.vocab, (args.batch, args.prompt))
    mask = torch.ones_like(prompt)

    def ours() -> torch.Tensor:
        return generate(model, prompt, args.new)

    def theirs() -> torch.Tensor:
        with torch.inference_mode():
            return hf.generate(prompt, attention_mask=mask, max_new_tokens=args.new, min_new_tokens=args.new,
                               do_sample=False, eos_token_id=None, pad_token_id=0)

    same = torch.equal(ours(), theirs())  # also the warm-up
    times = {"blocklab": [], "transformers": []}
    for _ in range(args.repeats):  # interleaved, so both see the same machine load
        times["blocklab"].append(_timed(ours))
        times["transformers"].append(_timed(theirs))
    tokens = args.batch * args.new
    rate = {name: tokens / min(t) for name, t in times.items()}
    n_params = sum(p.numel() for p in model.parameters())
    print(f"GPT-2 shape: {args.layers} layers, d_model {args.d_model}, {args.heads} heads, "
          f"vocab {args.vocab} ({n_params / 1e6:.1f}M parameters); batch {args.batch}, prompt {args.prompt}, "
          f"{args.new} new tokens, greedy, float32, {torch.get_num_threads()} threads, "
          f"best of {args.repeats}")
    for name, r in rate.items():
        print(f"  {name:<13} {r:8.1f} tokens/s")
    print(f"  ratio blocklab / transformers: {rate['blocklab'] / rate['transformers']:.2f}x")
    print(f"  same tokens: {same}")


if __name__ == "__main__":
    main()
