"""TransformerLens' ``HookedTransformer.generate`` keywords in blocklab's terms, so TL code calling
``model.generate`` runs unchanged with TL's meaning (``Transformer.generate`` uses it):

    stop_at_eos (TL: True)        stop a row at the EOS id (``eos_token_id``, else the tokenizer's), later
                                  columns of a finished row filled with it; without an EOS id to stop at,
                                  only an explicit stop_at_eos=True is an error (as in TL)
    eos_token_id (int or list)    the ids a row stops at (filled with the tokenizer's EOS, else the first)
    use_past_kv_cache             ``use_cache``
    freq_penalty                  ``frequency_penalty`` (0: none): minus freq_penalty x each token's count,
                                  after the temperature; it applies to sampling, as in TL
    temperature=0.0               greedy decoding, as TL's ``sample_logits``
    return_type                   "input" (the input's kind: text or ids), "str" or "tokens"; "embeds" is
                                  refused (blocklab generates from ids)
    verbose                       a progress bar over the new tokens (TL: tqdm)
    padding_side                  "left", blocklab's own for generation; "right" is refused by name

One default differs and is documented: TL samples unless ``do_sample=False``; blocklab decodes greedily
unless ``do_sample=True`` or a temperature, top_k or top_p says to sample. Keywords neither blocklab nor TL
knows are refused by GenerationConfig, naming them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch import Tensor

from . import generate as generation

if TYPE_CHECKING:  # annotations only (the model calls this module)
    from .model import Transformer

RETURN_TYPES = ("input", "str", "tokens")


def from_transformerlens(model: Transformer, settings: dict[str, Any]) -> tuple[dict[str, Any], str, bool]:
    """``settings`` with TL's keywords translated to GenerationConfig's fields, the return type and
    whether to show progress (``verbose``)."""
    settings = dict(settings)
    return_type, verbose = settings.pop("return_type", "input"), settings.pop("verbose", False)
    if return_type not in RETURN_TYPES:
        raise ValueError(f"return_type={return_type!r} is not one of: {', '.join(RETURN_TYPES)} "
                         "(TransformerLens' 'embeds' has no meaning here: blocklab generates from token ids)")
    if not isinstance(verbose, bool):
        raise ValueError(f"verbose={verbose!r} must be true or false")
    side = settings.pop("padding_side", "left")
    if side != "left":
        raise ValueError(f"padding_side={side!r}: blocklab generates from left-padded prompts, so each row's "
                         "continuation follows its own last token; pass 'left' (or nothing)")
    if "use_past_kv_cache" in settings:
        settings["use_cache"] = settings.pop("use_past_kv_cache")
    penalty = settings.pop("freq_penalty", 0.0)
    if penalty != 0.0:
        settings["frequency_penalty"] = penalty
    if settings.get("temperature") == 0.0:  # TL's sample_logits: temperature 0 is greedy
        settings.pop("temperature")
        settings["do_sample"] = False
    _stop_at_eos(model, settings)
    return settings, return_type, verbose


def _stop_at_eos(model: Transformer, settings: dict[str, Any]) -> None:
    """TL's stop_at_eos and eos_token_id as stop ids and the id finished rows are filled with."""
    asked = settings.pop("stop_at_eos", None)
    eos = settings.pop("eos_token_id", None)
    tokenizer_eos = model.tokenizer.eos_id if model.tokenizer is not None else None
    if asked is False:
        if eos is not None:
            raise ValueError("eos_token_id applies with stop_at_eos=True (TransformerLens' default)")
        return
    if eos is None:
        if tokenizer_eos is None:
            if asked:
                raise ValueError("stop_at_eos=True needs an EOS id: pass eos_token_id= (the model has no "
                                 "tokenizer with one)")
            return  # TL's default with nothing to stop at: blocklab's own default, no stop
        eos = tokenizer_eos
    ids = [eos] if isinstance(eos, int) else list(eos)
    settings["stop_ids"] = (*settings.get("stop_ids", ()), *ids)
    settings.setdefault("pad_id", tokenizer_eos if tokenizer_eos is not None and not isinstance(eos, int)
                        else ids[0])


def generate(model: Transformer, given: Tensor | str | list[str], max_new_tokens: int | None,
             settings: dict[str, Any]) -> Tensor | str | list[str]:
    """``model.generate``: blocklab's ``generate`` with TL's keywords (``from_transformerlens``), its
    output in the kind ``return_type`` asks for, with a progress bar when ``verbose``."""
    settings, return_type, verbose = from_transformerlens(model, settings)
    text = isinstance(given, str) or isinstance(given, list) and all(isinstance(t, str) for t in given)
    if text and return_type == "tokens":  # the prompt's ids as TL tokenizes it (left-padded), then the rest
        batch = model.tokenize(given, prepend_bos=settings.pop("prepend_bos", None), padding="left")
        given, settings["attention_mask"] = batch.ids, batch.attention_mask
    stop = None
    if verbose:
        total = max_new_tokens if max_new_tokens is not None else settings.get("max_new_tokens", 20)
        settings["on_token"], stop = progress(total)
    try:
        out = generation.generate(model, given, max_new_tokens, **settings)
    finally:
        if stop is not None:
            stop()
    return model.to_string(out) if return_type == "str" and isinstance(out, Tensor) else out


def progress(total: int) -> tuple[Callable[[Tensor, Tensor], None], Callable[[], None]]:
    """A progress bar over ``total`` new tokens: the ``on_token`` that advances it, and its close."""
    from rich.progress import Progress

    bar = Progress(transient=True)
    task = bar.add_task("generating", total=total)
    bar.start()
    return (lambda tokens, active: bar.advance(task)), bar.stop
