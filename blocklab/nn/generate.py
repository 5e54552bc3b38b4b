"""Text generation for causal models: greedy or sampled, batched, windowed, with stops and streaming.

Each step turns the logits of every row's last position (float32, (B, vocab)) into one token, in the
order ``transformers``' ``generate`` uses, so that the same settings give the same tokens:

    repetition penalty   l_t <- l_t / r if l_t > 0 else l_t * r, for each token t already in the row
                         (prompt included, padding not)
    greedy               argmax l  (unless do_sample, or with do_sample=None, temperature / top_k / top_p)
    sampling             (l - max l) / temperature (a constant, or with temperature_end a linear schedule from
                         temperature at the first new token to temperature_end at the last);
                         minus frequency_penalty x how often each token is in the row (TransformerLens'
                         freq_penalty, after the temperature as there);
                         top-k keeps l >= the k-th largest; top-p drops the least
                         likely tokens while their summed probability stays <= 1 - p (the most
                         likely one always stays); then one draw of torch.multinomial(softmax(l))
                         from a torch.Generator seeded with ``seed``

Batches: prompts of different lengths come left-padded with an attention mask
(``model.tokenize(texts, padding="left")``), so every row's newest token is in the last column.
Text in, text out: ``generate(model, "The cat", 10)`` tokenizes (with the BOS token first where
TransformerLens' ``prepend_bos`` puts one) and returns the prompt and its continuation as text,
without the BOS token (a list of texts: a list of strings).
Positions count from each row's first real token: position_ids = cumsum(mask) - 1, so a padded row
gets the same positions (and the same tokens) as when it is generated alone.

KV cache: the prompt runs once, filling each layer's ``KVCache``; each later step feeds only the
newest token. ``use_cache=False`` re-runs the whole window each step; both give the same tokens.

Sliding window: each row sees at most ``max_seq_len`` of its own tokens. When a new token would make
a row's window longer, its oldest ``window_shift`` tokens are dropped, its positions restart at 0 from
the first token left in its window, and the KV cache is rebuilt from the kept tokens (cached keys and
values carry the positions they were computed at, so they cannot be shifted). Each row slides by its
own length, so a prompt gets the same window beside batch-mates of other lengths as alone. With
``window_shift=1`` (the default) every token is predicted from exactly the last ``max_seq_len``
tokens, as nanoGPT's sampler does; a larger shift rebuilds the cache less often and sees between
max_seq_len - shift + 1 and max_seq_len tokens. A prompt longer than the window keeps its last
``max_seq_len`` tokens in view; the returned sequence always holds the whole prompt.

Stops: a row finishes at a stop id (kept in the output) or once its generated text contains a stop
string (decoded with ``model.tokenizer``); later columns of a finished row hold ``pad_id``. Generation
ends when every row has finished or after ``max_new_tokens``.

Streaming: ``on_token(tokens, active)`` is called after each step with the new column (B,) and which
rows it extends (False for rows that had already finished).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from .attention import KVCache
from .packed import packed_decoding
from .tokens import BatchEncoding, positions_from_mask, prepends_bos

if TYPE_CHECKING:  # annotations only: the model calls generate (Transformer.generate)
    from .model import Transformer

OnToken = Callable[[Tensor, Tensor], None]  # (new tokens (B,), active rows (B,) bool)
SAMPLING_ONLY = ("temperature", "temperature_end", "top_k", "top_p", "seed", "frequency_penalty")


@dataclass(frozen=True)
class GenerationConfig:
    """How to generate; validated at construction (ValueError naming field, value and rule)."""

    max_new_tokens: int = 20
    do_sample: bool | None = None  # None: sample when a temperature, top_k or top_p is set, else greedy
    temperature: float = 1.0  # sampling: divides the logits
    temperature_end: float | None = None  # sampling: the temperature moves linearly to this by the last token
    top_k: int | None = None  # sampling: only the k most likely tokens
    top_p: float | None = None  # sampling: only the most likely tokens that hold probability p
    seed: int | None = None  # sampling: seeds the draws (None: a fresh random seed)
    repetition_penalty: float | None = None  # > 1 discourages tokens already in the row
    frequency_penalty: float | None = None  # sampling: minus this x each token's count in the row
    stop_ids: tuple[int, ...] = ()  # a row finishes when it produces one of these
    stop_strings: tuple[str, ...] = ()  # ... or when its generated text contains one (needs a tokenizer)
    pad_id: int | None = None  # fills finished rows (default: the tokenizer's pad id, else the first stop id)
    window_shift: int = 1  # columns dropped when the window is full
    use_cache: bool = True  # KV cache; False re-runs the window each step (same tokens)
    pack_weights: bool = True  # batch 1: one-token steps read weights laid out for it (nn/packed.py)

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_ids", tuple(self.stop_ids))
        object.__setattr__(self, "stop_strings", tuple(self.stop_strings))
        for error in _violations(self):
            raise ValueError(error)

    @property
    def sampling(self) -> bool:
        """Whether tokens are drawn (else argmax): ``do_sample``, or when None, any sampling setting."""
        if self.do_sample is not None:
            return self.do_sample
        return (self.temperature != 1.0 or self.temperature_end is not None or self.top_k is not None
                or self.top_p is not None)

    def temperature_at(self, step: int) -> float:
        """The temperature of the step-th new token (from 0): constant, or linear up to temperature_end."""
        if self.temperature_end is None or self.max_new_tokens < 2:
            return self.temperature
        return self.temperature + (self.temperature_end - self.temperature) * step / (self.max_new_tokens - 1)

    def replace(self, **changes: Any) -> GenerationConfig:
        """A copy with some fields changed (validated again)."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise ValueError(f"GenerationConfig has no field {unknown[0]!r}; fields: {', '.join(FIELDS)}")
        return dataclasses.replace(self, **changes)


FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(GenerationConfig))


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _violations(c: GenerationConfig) -> list[str]:
    """Every rule the config breaks, as messages naming field, value and what is allowed."""
    errors: list[str] = []

    def need(ok: bool, message: str) -> None:
        if not ok:
            errors.append(f"GenerationConfig.{message}")

    need(_is_int(c.max_new_tokens) and c.max_new_tokens >= 0,
         f"max_new_tokens={c.max_new_tokens!r} must be an integer >= 0")
    need(c.do_sample is None or isinstance(c.do_sample, bool), f"do_sample={c.do_sample!r} must be true, "
         "false or None (sample when temperature, top_k or top_p is set)")
    need(isinstance(c.use_cache, bool), f"use_cache={c.use_cache!r} must be true or false")
    need(isinstance(c.pack_weights, bool), f"pack_weights={c.pack_weights!r} must be true or false")
    need(_is_number(c.temperature) and c.temperature > 0, f"temperature={c.temperature!r} must be > 0")
    need(c.temperature_end is None or (_is_number(c.temperature_end) and c.temperature_end > 0),
         f"temperature_end={c.temperature_end!r} must be > 0 (or None: a constant temperature)")
    need(c.top_k is None or (_is_int(c.top_k) and c.top_k >= 1), f"top_k={c.top_k!r} must be an integer >= 1")
    need(c.top_p is None or (_is_number(c.top_p) and 0 < c.top_p <= 1),
         f"top_p={c.top_p!r} must be in (0, 1]")
    need(c.seed is None or _is_int(c.seed) and 0 <= c.seed < 2**64,
         f"seed={c.seed!r} must be an integer in [0, 2**64) (torch seeds take 64 bits)")
    need(c.repetition_penalty is None or (_is_number(c.repetition_penalty) and c.repetition_penalty > 0),
         f"repetition_penalty={c.repetition_penalty!r} must be > 0")
    need(c.frequency_penalty is None or (_is_number(c.frequency_penalty) and c.frequency_penalty >= 0),
         f"frequency_penalty={c.frequency_penalty!r} must be >= 0")
    need(all(_is_int(i) and i >= 0 for i in c.stop_ids), f"stop_ids={c.stop_ids!r} must be token ids >= 0")
    need(all(isinstance(s, str) and s for s in c.stop_strings),
         f"stop_strings={c.stop_strings!r} must be non-empty strings")
    need(c.pad_id is None or (_is_int(c.pad_id) and c.pad_id >= 0),
         f"pad_id={c.pad_id!r} must be a token id >= 0")
    need(_is_int(c.window_shift) and c.window_shift >= 1,
         f"window_shift={c.window_shift!r} must be an integer >= 1")
    if not errors and not c.sampling:
        defaults = {"temperature": 1.0, "temperature_end": None, "top_k": None, "top_p": None, "seed": None,
                    "frequency_penalty": None}
        why = (", but do_sample=False" if c.do_sample is False
               else ": set do_sample=True (or a temperature, top_k, top_p)")
        for name in SAMPLING_ONLY:
            value = getattr(c, name)
            need(value == defaults[name], f"{name}={value!r} only applies to sampling{why}")
    return errors


# ---- one step: logits -> token ---------------------------------------------------------------------


def penalize_repetition(logits: Tensor, seen: Tensor, penalty: float) -> Tensor:
    """(B, V) logits with each seen token's logit (``seen`` (B, V): its count in the row) divided by
    ``penalty`` if positive, else multiplied."""
    penalized = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen > 0, penalized, logits)


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """(B, V) logits with everything below the k-th largest set to -inf (ties with it stay)."""
    kth = torch.topk(logits, min(k, logits.shape[-1]), dim=-1).values[..., -1:]  # (B, 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    """(B, V) logits keeping the most likely tokens whose probabilities sum to >= p; the rest -inf."""
    ascending, order = torch.sort(logits, dim=-1)  # (B, V), least likely first
    below = torch.softmax(ascending, dim=-1).cumsum(dim=-1) <= 1 - p  # mass of this token and less likely
    below[..., -1] = False  # the most likely token always stays
    return logits.masked_fill(below.scatter(-1, order, below), float("-inf"))


def next_token(
    logits: Tensor,
    config: GenerationConfig,
    seen: Tensor | None,
    generator: torch.Generator | None,
    step: int = 0,
) -> Tensor:
    """(B, V) float32 logits of the step-th new token -> (B,) token ids, as the module docstring says
    (``seen`` (B, V): how often each token is in each row, for the penalties)."""
    if config.repetition_penalty is not None and seen is not None:
        logits = penalize_repetition(logits, seen, config.repetition_penalty)
    if not config.sampling:
        return logits.argmax(-1)
    logits = sampling_logits(logits, config, step, seen)
    return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator).squeeze(1)


def sampling_logits(logits: Tensor, config: GenerationConfig, step: int = 0, seen: Tensor | None = None
                    ) -> Tensor:
    """(B, V) logits -> the (B, V) logits a sampled step draws from, softmax of them its distribution:
    shifted, divided by the step's temperature, less the frequency penalty (``seen`` (B, V): each token's
    count in the row), top-k and top-p filtered (explore shows the same)."""
    # softmax(l / T) is softmax((l - max l) / T): the shift keeps a tiny T (1e-40) from making l / T
    # infinite, where softmax would give NaN; every scaled logit is then <= 0, the limit T -> 0 is argmax.
    # A T below the float's smallest normal number would round to 0; below it only the maxima remain
    # anyway, so it is that number.
    temperature = max(config.temperature_at(step), torch.finfo(logits.dtype).tiny)
    logits = (logits - logits.amax(-1, keepdim=True)) / temperature
    if config.frequency_penalty is not None:
        if seen is None:
            raise ValueError("frequency_penalty needs each row's token counts (generate keeps them)")
        logits = logits - config.frequency_penalty * seen
    if config.top_k is not None:
        logits = top_k_filter(logits, config.top_k)
    if config.top_p is not None and config.top_p < 1:
        logits = top_p_filter(logits, config.top_p)
    return logits


# ---- the window the model sees ---------------------------------------------------------------------


def new_kv_cache(model: Transformer, batch: int, max_len: int) -> list[KVCache]:
    """One empty KVCache per block, for ``batch`` sequences of up to ``max_len`` positions."""
    c, weight = model.config, model.head.weight
    shape = (batch, c.kv_heads, max_len, c.d_head)  # grouped-query models keep fewer key/value heads
    return [KVCache(*shape, weight.dtype, weight.device) for _ in range(c.n_layers)]


class NonFiniteLogits(ValueError):
    """A step's logits hold a NaN or Inf (weights that overflow float32): no token can be chosen.
    ``logits`` (B, V), and the window the model saw (``tokens``, ``attention_mask``), to find where the
    overflow began (inspect.nonfinite.refuse_nonfinite_output)."""

    def __init__(self, logits: Tensor, tokens: Tensor, attention_mask: Tensor) -> None:
        super().__init__("the logits of a generation step are not finite")
        self.logits, self.tokens, self.attention_mask = logits, tokens, attention_mask


class Window:
    """Each row's window of the sequence (at most max_seq_len of its own tokens) and the batch's KV cache.

    A row slides by its own length, as it would alone: ``start[b]`` counts the row's real tokens it has
    dropped, so a short prompt left-padded beside a long one keeps the window it has on its own. The
    model sees the columns from the leftmost row window on; the columns before a row's own window are
    masked out for that row, like its padding."""

    def __init__(self, model: Transformer, config: GenerationConfig, mask: Tensor) -> None:
        self.model, self.config = model, config
        self.size = model.config.max_seq_len
        lengths = mask.sum(-1)  # (B,) each row's real tokens
        self.start = (lengths - self.size).clamp(min=0)  # (B,) a long prompt: its last max_seq_len tokens
        first = int((mask.shape[1] - lengths + self.start).min())  # the leftmost column any row sees
        self.capacity = min(self.size, mask.shape[1] - first + config.max_new_tokens)  # cache positions
        self.cache: list[KVCache] | None = None

    def logits(self, tokens: Tensor, mask: Tensor) -> Tensor:
        """(B, V) float32 logits of the last column, given the sequence so far (B, L) and its mask."""
        L = tokens.shape[1]
        lengths = mask.sum(-1)  # (B,)
        slide = lengths - self.start > self.size  # (B,) rows whose new token does not fit their window
        if bool(slide.any()):
            self.start = self.start + self.config.window_shift * slide
            self.cache = None  # cached keys carry the positions they were computed at: rebuilt
        row_first = L - lengths + self.start  # (B,) each row's first column in view
        first = int(row_first.min())
        columns = torch.arange(first, L, device=mask.device)  # (L - first,)
        seen = mask[:, first:L] * (columns[None, :] >= row_first[:, None])  # (B, L - first): keys in view
        if self.config.use_cache and self.cache is not None:
            step = tokens[:, L - 1 :]  # only the newest token; the cache holds the rest
            positions = seen.sum(-1, keepdim=True) - 1  # (B, 1)
        else:
            step, positions = tokens[:, first:L], positions_from_mask(seen)
            if self.config.use_cache:
                self.cache = new_kv_cache(self.model, tokens.shape[0], self.capacity)
        hidden = self.model.encode(step, attention_mask=seen, kv_cache=self.cache,
                                   position_ids=positions.clamp(min=0))  # (B, T_step, d_model)
        logits = self.model.head(hidden[:, -1]).float()  # only the last position predicts
        # argmax of NaNs is id 0, multinomial fails; a NaN or Inf makes the sum non-finite (checked first:
        # 20x cheaper), which a sum of finite logits can be too, by overflow: then each logit is checked
        if not bool(torch.isfinite(logits.sum())) and not bool(torch.isfinite(logits).all()):
            raise NonFiniteLogits(logits, tokens[:, first:L], seen)
        return logits


# ---- the loop ------------------------------------------------------------------------------------


def check_inputs(model: Transformer, tokens: Tensor, mask: Tensor, config: GenerationConfig) -> None:
    """ValueError when ``generate`` cannot run: a model that sees the future, a prompt that is not left-padded
    ids, stop ids beyond the vocabulary, ... (``generate`` checks first; a caller streaming the prompt
    checks before showing it)."""
    if not model.config.causal:
        raise ValueError("generate needs a causal model (ModelConfig.causal=true); this one sees the future")
    if tokens.dim() != 2 or tokens.shape[1] < 1 or tokens.dtype not in (torch.long, torch.int32):
        raise ValueError(f"prompt must be (batch, seq) integer ids with seq >= 1, got {tokens.dtype} "
                         f"of shape {tuple(tokens.shape)}")
    if mask.shape != tokens.shape:
        raise ValueError(f"attention_mask {tuple(mask.shape)} must have the prompt's shape "
                         f"{tuple(tokens.shape)}")
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError("attention_mask must hold 1 (real token) and 0 (padding) only")
    empty = (mask.sum(-1) == 0).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"prompt row {empty[0]} is all padding: every row needs at least one real token")
    right = (mask.diff(dim=-1) < 0).any(-1).nonzero().flatten().tolist()
    if right:
        raise ValueError(f"prompt row {right[0]} has padding after a real token: generate needs left padding "
                         "(model.tokenize(texts, padding='left'))")
    vocab = model.config.vocab_size
    for name, ids in (("stop_ids", config.stop_ids), ("pad_id", [config.pad_id] if config.pad_id else [])):
        if any(i >= vocab for i in ids):
            raise ValueError(f"GenerationConfig.{name}={getattr(config, name)!r} must be ids below the "
                             f"model's vocab_size={vocab}")
    size = model.config.max_seq_len
    if config.window_shift > size:
        raise ValueError(f"GenerationConfig.window_shift={config.window_shift} must be <= the model's "
                         f"max_seq_len={size}")
    if config.stop_strings and model.tokenizer is None:
        raise ValueError("GenerationConfig.stop_strings need the model's tokenizer to read the text; "
                         "this model has none (set model.tokenizer, or use stop_ids)")


def _filler(model: Transformer, config: GenerationConfig) -> int | None:
    """The id that fills a finished row's later columns (None when nothing can finish early)."""
    if not (config.stop_ids or config.stop_strings):
        return None
    if config.pad_id is not None:
        return config.pad_id
    if model.tokenizer is not None:
        return model.tokenizer.pad_id
    return config.stop_ids[0]


@torch.inference_mode()
def generate(
    model: Transformer,
    tokens: Tensor | str | list[str],
    max_new_tokens: int | None = None,
    *,
    config: GenerationConfig | None = None,
    attention_mask: Tensor | None = None,
    on_token: OnToken | None = None,
    prepend_bos: bool | None = None,
    **fields: Any,
) -> Tensor | str | list[str]:
    """Extend ``tokens`` (B, T) (left-padded when ``attention_mask`` says so) by up to
    ``max_new_tokens`` columns; returns (B, T + generated). ``fields`` change ``config``'s fields:
    ``generate(model, ids, 20, do_sample=True, top_p=0.9, seed=0)``. Text in (a str or a list of
    them), text out: the prompt and its continuation, without a prepended BOS token."""
    if isinstance(tokens, str) or isinstance(tokens, list) and all(isinstance(t, str) for t in tokens):
        if attention_mask is not None:
            raise ValueError("text is tokenized with its own attention mask: pass ids to give a mask")
        batch = model.tokenize(tokens, prepend_bos=prepend_bos, padding="left")
        out = generate(model, batch.ids, max_new_tokens, config=config, attention_mask=batch.attention_mask,
                       on_token=on_token, **fields)
        texts = _texts(model, out, batch, prepend_bos)
        return texts[0] if isinstance(tokens, str) else texts
    if prepend_bos:
        raise ValueError("prepend_bos applies to text; these are token ids already")
    if max_new_tokens is not None:
        fields["max_new_tokens"] = max_new_tokens
    config = (config or GenerationConfig()).replace(**fields)
    mask = torch.ones_like(tokens) if attention_mask is None else attention_mask.to(tokens.device).long()
    check_inputs(model, tokens, mask, config)
    was_training = model.training
    model.eval()
    try:
        with packed_decoding(config.pack_weights):
            return _decode(model, tokens, mask, config, on_token)
    finally:
        model.train(was_training)


def _decode(model: Transformer, tokens: Tensor, mask: Tensor, config: GenerationConfig,
            on_token: OnToken | None) -> Tensor:
    """The decoding loop over checked ids (B, T) and their mask: one token a step for each row until
    ``max_new_tokens`` or every row has stopped (a stopped row is filled with the pad id)."""
    generator = None
    if config.sampling:
        generator = torch.Generator(device=tokens.device)
        generator.manual_seed(config.seed if config.seed is not None else torch.seed())
    seen = None
    if config.repetition_penalty is not None or config.frequency_penalty is not None:
        # (B, V): how often each row holds each token (real ones only, not padding)
        seen = torch.zeros(tokens.shape[0], model.config.vocab_size, device=tokens.device)  # float32
        seen.scatter_add_(1, tokens.long(), mask.float())
    filler, stop_ids = _filler(model, config), torch.tensor(config.stop_ids, dtype=torch.long)
    done = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
    out, prompt_len = tokens.long(), tokens.shape[1]
    window = Window(model, config, mask)
    for step in range(config.max_new_tokens):
        new = next_token(window.logits(out, mask), config, seen, generator, step)  # (B,)
        active = ~done
        if filler is not None:
            new = new.masked_fill(done, filler)
        out = torch.cat([out, new[:, None]], dim=1)
        mask = torch.cat([mask, torch.ones_like(new)[:, None]], dim=1)
        if seen is not None:
            seen[torch.arange(len(new)), new] += active.float()
        if filler is not None:
            done |= active & _stopped(model, config, out[:, prompt_len:], active, stop_ids.to(new.device))
        if on_token is not None:
            on_token(new, active)
        if bool(done.all()):
            break
    return out


def _texts(model: Transformer, out: Tensor, prompt: BatchEncoding, prepend_bos: bool | None) -> list[str]:
    """Each row of ``out`` as text: its real prompt tokens, without a BOS ``tokenize`` prepended, and
    every token generated after them."""
    skip = int(prepends_bos(model.require_tokenizer(), prepend_bos))
    width = prompt.ids.shape[1]
    return [model.to_string(torch.cat([row[:width][mask.bool()][skip:], row[width:]]))
            for row, mask in zip(out, prompt.attention_mask, strict=True)]


def _stopped(
    model: Transformer, config: GenerationConfig, generated: Tensor, active: Tensor, stop_ids: Tensor
) -> Tensor:
    """(B,) bool: rows whose newest token is a stop id, or whose generated text (B, n) now holds a
    stop string (only ``active`` rows are decoded)."""
    stopped = torch.isin(generated[:, -1], stop_ids)
    if config.stop_strings:
        assert model.tokenizer is not None  # check_inputs
        for row in active.nonzero().flatten().tolist():
            text = model.tokenizer.decode(generated[row])
            stopped[row] |= any(s in text for s in config.stop_strings)
    return stopped
