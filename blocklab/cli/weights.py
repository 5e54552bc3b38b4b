"""``blocklab import``, ``embed``, ``generate``: real weights in, sentence embeddings, text out."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from ..inspect.trace.subject import parse_token_ids
from .args import (
    add_command,
    add_device_flags,
    add_json_flag,
    add_model_flag,
    add_out_flag,
    add_seed_flag,
    at_least,
    emit_json,
    parse_float,
    parse_int,
    parse_path,
    say_written,
)

if TYPE_CHECKING:
    import torch

    from ..nn.generate import GenerationConfig


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``import``, ``embed`` and ``generate``."""
    _add_import(sub)
    _add_embed(sub)
    _add_generate(sub)


def _add_import(sub: argparse._SubParsersAction) -> None:
    """Register ``import``."""
    p = add_command(
        sub, "import",
        "Read a model and write it as one blocklab checkpoint file (.safetensors) with its tokenizer and "
        "where it came from; the file loads anywhere --model is accepted.",
    )
    from ..weights.load import ACCEPTED

    p.add_argument("path", type=parse_path, metavar="MODEL", help=f"the model to read: {ACCEPTED}")
    add_out_flag(p, "the checkpoint file to write (.safetensors)", required=True)
    p.set_defaults(func=cmd_import)


def _add_embed(sub: argparse._SubParsersAction) -> None:
    """Register ``embed``."""
    p = add_command(
        sub, "embed",
        "Sentence embeddings: the last layer's vectors averaged over each input's tokens and scaled to "
        "length 1 (as sentence-transformers does), and the cosine similarity of every pair of inputs.",
    )
    add_model_flag(p)
    p.add_argument("--input", action="append", required=True, metavar="TEXT",
                   help="a sentence (repeatable: one embedding each)")
    p.add_argument("--dims", type=at_least(0), default=8, metavar="N",
                   help="embedding values shown per input in the text output (default: 8)")
    add_json_flag(p, "the inputs, embeddings and cosine similarities")
    p.set_defaults(func=cmd_embed)


def _add_generate(sub: argparse._SubParsersAction) -> None:
    """Register ``generate``."""
    p = add_command(
        sub, "generate",
        "Continue prompts with a causal model. Greedy unless a sampling flag (--sample, --temperature, "
        "--top-k, --top-p) is given. Several --input prompts run as one left-padded batch. A row stops at "
        "a --stop text, a --stop-id (default: the tokenizer's end-of-text token) or after --max-new-tokens; "
        "past the model's max_seq_len the window slides. Text streams to the terminal as it is generated.",
    )
    add_model_flag(p)
    p.add_argument("--input", action="append", required=True, metavar="TEXT",
                   help="a prompt (with --ids: token ids, e.g. '1 5 7'); repeatable: one left-padded batch")
    p.add_argument("--ids", action="store_true", help="each --input is token ids (spaces or commas)")
    p.add_argument("--max-new-tokens", dest="max_new_tokens", type=parse_int, default=20, metavar="N",
                   help="tokens to add at most (default: 20)")
    sampling = p.add_argument_group("sampling (any of these turns sampling on)")
    sampling.add_argument("--sample", action="store_true", help="sample from the softmax instead of argmax")
    sampling.add_argument("--temperature", type=parse_float, default=None, metavar="X",
                          help="divides the logits (default: 1)")
    sampling.add_argument("--temperature-end", dest="temperature_end", type=parse_float, default=None,
                          metavar="X",
                          help="the temperature moves linearly from --temperature to X by the last new token")
    sampling.add_argument("--top-k", dest="top_k", type=parse_int, default=None, metavar="K",
                          help="sample from the k most likely tokens")
    sampling.add_argument("--top-p", dest="top_p", type=parse_float, default=None, metavar="P",
                          help="sample from the most likely tokens holding probability p (nucleus)")
    add_seed_flag(p, "random seed of the draws; only with a sampling flag", default=None, shown="0")
    p.add_argument("--repetition-penalty", dest="repetition_penalty", type=parse_float, default=None,
                   metavar="X", help="> 1 discourages tokens already in the row (greedy or sampled)")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="a row ends once its new text contains TEXT (repeatable)")
    p.add_argument("--stop-id", "--eos-id", dest="stop_ids", action="append", type=parse_int, default=None,
                   metavar="ID",
                   help="a row ends at this token id (repeatable; default: the tokenizer's end of text)")
    p.add_argument("--window-shift", dest="window_shift", type=parse_int, default=1, metavar="N",
                   help="past max_seq_len, drop this many oldest tokens at a time (default: 1, the last "
                        "max_seq_len tokens)")
    p.add_argument("--no-cache", dest="use_cache", action="store_false", help="re-run the window each step")
    add_device_flags(p)
    add_json_flag(p, "one line per prompt with its ids, new ids and text")
    p.set_defaults(func=cmd_generate)


def cmd_import(args: argparse.Namespace) -> int:
    """Read a model, write it as a blocklab checkpoint with its tokenizer, print a summary."""
    from ..weights.load import import_model

    print(import_model(args.path, args.out).summary())
    print(f"wrote {args.out}")
    return 0


def cmd_embed(args: argparse.Namespace) -> int:
    """Print each input's embedding and the cosine similarity of every pair."""
    from ..inspect.nonfinite import refuse_nonfinite_output
    from ..weights.load import load
    from ..weights.sentence import cosine_similarities, format_embeddings, sentence_embeddings

    loaded = load(args.model, allow_nonfinite=args.allow_nonfinite)
    model, tokenizer = loaded.model, loaded.tokenizer
    if tokenizer is None:
        raise UsageError(f"{args.model} has no tokenizer, so text cannot be embedded")
    emb = sentence_embeddings(model, tokenizer, args.input)
    tokens, mask = tokenizer.encode_batch(args.input, padding="right")
    refuse_nonfinite_output(model, emb, "sentence embeddings", tokens, attention_mask=mask)
    cos = cosine_similarities(emb)
    if emit_json(args.json, {"inputs": args.input, "embeddings": emb.tolist(), "cosine": cos.tolist()}):
        return 0
    n_tokens = [len(tokenizer.encode(t)) for t in args.input]
    print(format_embeddings(args.input, n_tokens, emb, cos, args.dims))
    say_written(args.json)
    return 0


def generation_config(args: argparse.Namespace, tokenizer: Any) -> GenerationConfig:
    """The GenerationConfig the generate flags describe (sampling seeded with 0 unless --seed)."""
    from ..nn.generate import GenerationConfig

    sampled = {
        name: getattr(args, name)
        for name in ("temperature", "temperature_end", "top_k", "top_p", "seed")
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
    token comes, after ``start`` shows the prompt; a batch prints each row, labelled ``[i]``, when it
    finishes."""

    def __init__(self, tokenizer: Any, prompts: list[list[int]]) -> None:
        self.tokenizer, self.prompts = tokenizer, prompts
        self.new: list[list[int]] = [[] for _ in prompts]
        self.finished = [False] * len(prompts)
        self.shown = ""  # the one prompt's text printed so far

    def _text(self, row: int) -> str:
        ids = self.prompts[row] + self.new[row]
        if self.tokenizer is None:
            return " ".join(map(str, ids))
        return self.tokenizer.decode(ids, skip_special_tokens=True)  # the text, without BOS and end tokens

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

    def start(self) -> None:
        """Show the one prompt (called once generation is known to be possible)."""
        if len(self.prompts) == 1:
            self.shown = self._text(0)
            print(self.shown, end="", flush=True)

    def end_line(self) -> None:
        """End a line the one prompt's stream left open (generation stopped by an error or Ctrl-C), so
        that the error's line starts a line of its own."""
        if self.shown:
            print(flush=True)

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
    from ..inspect.nonfinite import refuse_nonfinite_output
    from ..nn.generate import NonFiniteLogits, check_inputs, generate
    from ..nn.tokens import pad_batch
    from ..weights.load import load

    compute = resolve_compute(args.device, args.dtype)
    loaded = load(args.model, allow_nonfinite=args.allow_nonfinite)  # a run folder too, like every command
    model, tokenizer = loaded.model.to(compute.device), loaded.tokenizer
    if not args.ids and tokenizer is None:
        raise UsageError(f"{args.model} has no tokenizer: give token ids with --ids")
    prompts = [parse_token_ids(t, "--input") if args.ids else tokenizer.encode(t) for t in args.input]
    config = generation_config(args, tokenizer)
    ids, mask = pad_batch(prompts, tokenizer.pad_id if tokenizer is not None else 0, "left")
    check_inputs(model, ids, mask.long(), config)  # a refusal is the only output: never after the prompt
    stream = TerminalStream(tokenizer, prompts) if args.json != "-" else None  # --json: JSON lines only
    if stream is not None:
        stream.start()
    new: list[list[int]] = [[] for _ in prompts]

    def on_token(tokens: torch.Tensor, active: torch.Tensor) -> None:
        for row in active.nonzero().flatten().tolist():
            new[row].append(int(tokens[row]))
        if stream is not None:
            stream(tokens, active)

    try:
        with compute.autocast():
            generate(model, ids.to(compute.device), config=config, attention_mask=mask.to(compute.device),
                     on_token=on_token)
    except BaseException as error:
        if stream is not None:
            stream.end_line()
        if isinstance(error, NonFiniteLogits):  # say where the forward overflowed
            refuse_nonfinite_output(model, error.logits, "logits", error.tokens,
                                    attention_mask=error.attention_mask)
        raise
    if stream is not None:
        stream.close()
    rows = [{"prompt_ids": prompt, "new_ids": continuation,
             "text": None if tokenizer is None else
             tokenizer.decode(prompt + continuation, skip_special_tokens=True)}
            for prompt, continuation in zip(prompts, new, strict=True)]
    emit_json(args.json, rows, lines=True)
    say_written(args.json)
    return 0
