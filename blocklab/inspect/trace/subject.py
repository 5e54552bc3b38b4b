"""What the tracer walks and with which input: a ``Subject`` (model, tokenizer, where it came from), the
input as ids, the target's id, and ``trace_subject``, the one call ``blocklab trace`` and ``blocklab
explore`` share so that they agree number for number.

The messages name the flags of ``blocklab trace`` (``--input``, ``--tokens``, ``--target``), which explore's
request fields mirror one for one. A preset's subject is built here; a loaded model's is built where
``blocklab.load`` may be imported (cli.trace.model_subject).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ...nn.config import ModelConfig
from ...nn.model import Transformer
from ...nn.presets import PRESET_TASKS, PRESETS
from ..nonfinite import refuse_nonfinite_output
from .collect import collect_trace
from .record import Trace


@dataclass
class Subject:
    """The model to trace, its tokenizer (None: inputs are ids) and a line saying where it came from."""

    model: Transformer
    tokenizer: Any
    source: str
    _vocab: list[str] | None = field(default=None, repr=False)
    # what to do about an input longer than max_seq_len ({n}: its length); a preset is built anew
    longer: str = "a model file's max_seq_len is fixed by its weights and config: shorten the input"
    # what a reader must know before the numbers, in plain sentences (random weights; no next-token head)
    notes: list[str] = field(default_factory=list)
    next_token: bool = True  # whether its logits predict the next token (an encoder's do not)

    def vocab(self) -> list[str] | None:
        """Every token of the vocabulary as text (``vocabulary``), worked out once per subject."""
        if self._vocab is None:
            self._vocab = vocabulary(self.tokenizer, self.model.config.vocab_size) or []
        return self._vocab or None


RANDOM_NOTE = "the weights are random:"  # how a note saying so begins


def preset_subject(name: str, seed: int, overrides: dict[str, Any]) -> Subject:
    """A preset's model built with ``torch.manual_seed(seed)``; its task's tokenizer if it has one."""
    from ...nn.memory import check_memory
    from ...tasks import get_task

    task = get_task(PRESET_TASKS[name]) if name in PRESET_TASKS else None
    config = preset_config(name, overrides)
    check_memory(config, 1, training=False, what=f"tracing preset {name}", force_flag=False)
    torch.manual_seed(seed)
    changed = "".join(f", {k}={v}" for k, v in overrides.items())
    return Subject(
        Transformer(config).eval(), task.tokenizer if task else None, f"preset {name} (seed {seed}{changed})",
        longer=f"preset {name} is built for each run: --max-seq-len {{n}} builds it long enough",
        notes=[f"{RANDOM_NOTE} preset {name} drawn with seed {seed}, not trained, so what it predicts "
               "means nothing"],
    )


# what a model without a next-token head says in place of its predictions and logit lens
ENCODER_NOTE = ("this model is an encoder: each position attends to both sides (causal=false) and no head "
                "was trained to predict the next token (its logits are the last hidden state times the tied "
                "embeddings), so no next-token prediction, logit lens or generation is shown")


def preset_config(name: str, overrides: dict[str, Any]) -> ModelConfig:
    """The config of a preset with its task's fields (a preset shaped for a task) and ``overrides``."""
    from ...nn.presets import preset
    from ...tasks import get_task

    task = get_task(PRESET_TASKS[name]) if name in PRESET_TASKS else None
    dictated = task.config_overrides() if task else {}
    if "max_seq_len" in dictated:  # the task's length is a least: the tutorial's preset takes <EOS> too
        dictated["max_seq_len"] = max(dictated["max_seq_len"], PRESETS[name]["max_seq_len"])
    return preset(name, **{**dictated, **overrides})


def vocabulary(tokenizer: Any, size: int) -> list[str] | None:
    """Every token of the model's vocabulary labelled as ``token_labels`` labels the input's, or None when
    the tokenizer cannot name them all."""
    try:
        return token_labels(tokenizer, list(range(size))) if tokenizer is not None else None
    except (ValueError, TypeError, AttributeError):
        return None


# what a label shows for a character a reader would not see: spaces at either end, line breaks, tabs
SHOWN = {" ": "␣", "\n": "↵", "\t": "⇥"}


def token_labels(tokenizer: Any, ids: list[int]) -> list[str]:
    """Each id as the text it stands for, shown so that a reader sees every byte of it: GPT-2's ``Ġcat``
    is ``␣cat`` (spaces at either end as ``␣``, line breaks ``↵``, tabs ``⇥``, other control bytes
    ``<0x0D>``), a piece that is not whole UTF-8 characters (byte-level BPE cuts ``€`` into three) is its
    bytes, ``<0xE2>``, where ``to_str_tokens`` gives three identical ``�``. The one labelling of tokens of
    the tracer's text and page and explore's."""
    texts = list(tokenizer.str_tokens(ids))
    cut = [i for i, text in enumerate(texts) if "\ufffd" in text]
    if cut:  # its bytes where the tokenizer spells them (byte-level BPE), else its spelling (``<0xE2>``)
        found = tokenizer.piece_bytes([ids[i] for i in cut]) if hasattr(tokenizer, "piece_bytes") else None
        spelled = tokenizer.tokens([ids[i] for i in cut])
        for n, i in enumerate(cut):
            texts[i] = _shown_bytes(found[n]) if found and found[n] is not None else spelled[n]
    return [_visible(text) for text in texts]


def _shown_bytes(raw: bytes) -> str:
    """Bytes as text, each byte that is not part of a whole UTF-8 character as ``<0xE2>``."""
    shown, start = [], 0
    while start < len(raw):
        try:
            shown.append(raw[start:].decode("utf-8"))
            break
        except UnicodeDecodeError as error:
            good = raw[start:start + error.start].decode("utf-8")
            bad = raw[start + error.start:start + error.end]
            shown.append(good + "".join(f"<0x{b:02X}>" for b in bad))
            start += error.end
    return "".join(shown)


def _visible(text: str) -> str:
    """``text`` with its spaces at either end, line breaks, tabs and control bytes made visible."""
    core = text.strip(" ")
    lead = len(text) - len(text.lstrip(" ")) if core else len(text)
    trail = len(text) - len(text.rstrip(" ")) if core else 0
    shown = [SHOWN.get(c, c) if c in "\n\t" else f"<0x{ord(c):02X}>" if ord(c) < 32 or ord(c) == 127 else c
             for c in core]
    return SHOWN[" "] * lead + "".join(shown) + SHOWN[" "] * trail


def parse_token_ids(text: str, flag: str = "--tokens") -> list[int]:
    """``"1,2,3"`` or ``"1 2 3"`` -> [1, 2, 3]; ValueError naming ``flag`` and the bad piece."""
    pieces = text.replace(",", " ").split()
    if not pieces:
        raise ValueError(f"{flag} is empty: give token ids like 1,2,3")
    if "," in text and any(not piece.strip() for piece in text.split(",")):
        raise ValueError(f"{flag} {text[:40]!r} has an empty item between commas; give token ids like 1,2,3")
    for piece in pieces:
        if not piece.lstrip("-").isdigit():
            raise ValueError(f"{flag} needs integer ids separated by commas or spaces; {piece!r} is not one")
    return [int(p) for p in pieces]


def target_id(tokenizer: Any, token: str, vocab_size: int) -> int:
    """The id of ``--target``: a token of the vocabulary, or an id when there is no tokenizer; either
    way an id the model's vocabulary has (0..vocab_size-1)."""
    table = getattr(tokenizer, "token_to_id", None)
    found = (
        table.get(token)
        if isinstance(table, dict)
        else (tokenizer.token_id(token) if hasattr(tokenizer, "token_id") else None)
    )
    if found is None and tokenizer is None and token.isdigit():
        found = int(token)
    if found is not None:
        if not 0 <= int(found) < vocab_size:
            raise ValueError(f"--target {token!r} is id {found}, out of range: the model's vocabulary has "
                             f"ids 0..{vocab_size - 1}")
        return int(found)
    if tokenizer is not None:  # the token as text (" cat"), when it is one token
        try:
            ids = tokenizer.encode(token)
        except ValueError:  # not in a vocabulary tokenizer's words
            ids = []
        ids = [i for i in ids if tokenizer.str_tokens([i])[0] in token]  # without the special tokens it adds
        if len(ids) == 1 and 0 <= int(ids[0]) < vocab_size:
            return int(ids[0])
    raise ValueError(
        f"--target {token!r} is not a token of the vocabulary"
        + (f"; {tokenizer.describe_vocab()}" if hasattr(tokenizer, "describe_vocab") else "")
    )


def input_ids(subject: Subject, text: str | None, tokens: str | None) -> list[int]:
    """The input as ids: ``text`` through the subject's tokenizer, or ``tokens`` ("1,2,3"); each id checked
    against the vocabulary."""
    tok = subject.tokenizer
    if (text is None) == (tokens is None):
        raise ValueError("give the input as text with --input or as ids with --tokens (one of them)")
    if text is not None and tok is None:
        raise ValueError(f"{subject.source} has no tokenizer: give token ids with --tokens 1,2,3")
    ids = tok.encode(text) if text is not None else parse_token_ids(tokens)
    V = subject.model.config.vocab_size
    bad = [i for i in ids if not 0 <= i < V]
    if bad:
        raise ValueError(f"token id {bad[0]} is out of range: the model's vocabulary has ids 0..{V - 1}")
    return ids


def trace_subject(subject: Subject, text: str | None, tokens: str | None, target: str | None = None,
                  position: int | None = None, stages: list[str] | None = None) -> Trace:
    """``collect_trace`` of one input given as ``blocklab trace`` takes it (--input or --tokens, --target,
    --position, --stages): the command and ``blocklab explore`` share it, so they agree number for number."""
    tok = subject.tokenizer
    ids = input_ids(subject, text, tokens)
    limit = subject.model.config.max_seq_len
    if len(ids) > limit:
        raise ValueError(f"the input is {len(ids)} tokens and the model takes at most max_seq_len={limit}; "
                         + subject.longer.format(n=len(ids)))
    labels = token_labels(tok, ids) if tok is not None else [str(i) for i in ids]  # text, not vocab spelling
    aim = target_id(tok, target, subject.model.config.vocab_size) if target is not None else None
    with torch.no_grad():  # a forward that overflows: where it began, not a trace of NaNs
        batch = torch.tensor([ids])
        refuse_nonfinite_output(subject.model, subject.model(batch), "logits", batch)
    trace = collect_trace(subject.model, ids, labels, position=position, target=aim, target_token=target,
                          vocab=subject.vocab(), names=stages, source=subject.source, text=text)
    trace.notes = list(subject.notes)
    if not subject.next_token:  # numbers of a head nobody trained: not shown as predictions
        trace.predictions, trace.lens = [], []
    return trace
