"""The residual stream as a sum (docs/tracer.md#the-activation-cache): the decompositions the activation
cache offers (``accumulated_resid``, ``decompose_resid``, ``decompose``, ``apply_ln_to_stack``,
``logit_attrs``, ``stack_head_results``), kept apart from the cache's storage and names (cache.py), whose
``ActivationCache`` takes them as a mixin.

Where the stream is a sum and where a norm on it stops one is the cache module's docstring; the parts of
a stage are read from the layouts table (which stage each connection adds to which).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from .norm_kinds import NORM_KINDS
from .norms import NoNorm

if TYPE_CHECKING:  # annotations only (the cache imports this module)
    from collections.abc import Mapping

    from .cache import Key


# TransformerLens' Slice input (``pos_slice=``, ``batch_slice=``): None (all), an int (one index: the axis
# goes), a tuple (slice(*tuple)), a slice, a list or tensor of indices, or TransformerLens' Slice itself
Where = Any


def take(x: Tensor, where: Where, dim: int) -> Tensor:
    """``x`` sliced along ``dim`` as TransformerLens' ``Slice(where).apply(x, dim)``."""
    where = getattr(where, "slice", where)  # TransformerLens' Slice holds what it was built from
    if where is None:
        return x
    if isinstance(where, tuple):
        where = slice(*where)
    elif not isinstance(where, (int, slice)):
        where = torch.as_tensor(where, device=x.device)  # a list, tensor or numpy array of indices
    index: list[Any] = [slice(None)] * x.dim()
    index[dim] = where
    return x[tuple(index)]


# blocklab's labels of the parts -> TransformerLens' (labels follow the cache's keys: its names or ours)
_TL_LABELS = tuple((re.compile(pattern), label) for pattern, label in (
    (r"blocks\.(\d+)\.attn\.result\[(\d+)\]", r"L\1H\2"), (r"blocks\.(\d+)\.ffn\.act\[(\d+)\]", r"L\1N\2"),
    (r"blocks\.(\d+)\.resid_pre", r"\1_pre"), (r"blocks\.(\d+)\.resid_mid", r"\1_mid"),
    (r"blocks\.(\d+)\.attn\.out", r"\1_attn_out"), (r"blocks\.(\d+)\.ffn\.out", r"\1_mlp_out"),
    (r"tok", "embed"), (r"pos", "pos_embed")))


# TransformerLens' decompose_resid mode -> the kinds of part it keeps (besides x0's, with incl_embeds)
PART_KINDS = {"all": ("attn", "mlp", "norm"), "attn": ("attn",), "mlp": ("mlp",)}


def _part_kind(label: str) -> str:
    """Which sublayer a part of the stream (by blocklab's label) comes from: embed, attn, mlp or norm (a
    post-norm block's norm output, with stop_at_norm)."""
    if "." not in label:
        return "embed"  # tok, pos, embed
    if re.search(r"\.(attn\.|ln1_out$)", label):
        return "attn"
    return "mlp" if re.search(r"\.(ffn\.|ln2_out$)", label) else "norm"


class StreamDecomposition:
    """The decompositions of ``ActivationCache`` (a mixin): they read ``self[...]``, ``self._stages``
    (the stages by name) and ``self.model``."""

    _stages: Mapping[str, Tensor]
    model: nn.Module
    transformerlens_keys: bool
    has_batch_dim: bool

    def _labels(self, labels: list[str]) -> list[str]:
        """The parts' labels as the cache's keys are spelled: blocklab's (``blocks.0.attn.result[1]``,
        ``blocks.0.resid_pre``), or TransformerLens' (``L0H1``, ``0_pre``, ``0_attn_out``, ``embed``)."""
        if not self.transformerlens_keys:
            return labels
        out = []
        for label in labels:
            for pattern, theirs in _TL_LABELS:
                if pattern.fullmatch(label):
                    label = pattern.sub(theirs, label)
                    break
            out.append(label)
        return out

    def accumulated_resid(
        self, layer: int | None = None, incl_mid: bool = False, apply_ln: bool = False,
        pos_slice: Where = None, mlp_input: bool = False, return_labels: bool = False,
    ) -> Tensor | tuple[Tensor, list[str]]:
        """The residual stream entering each block 0 .. ``layer`` (default: every block, then the
        stream leaving the last), stacked: (stages, B, T, d). ``incl_mid`` adds the stream between
        each block's two sublayers (resid_mid; post-norm: ln1). ``apply_ln``: each through the
        final norm with its own statistics (the logit lens: what the head would read if the
        model stopped there; TransformerLens's recompute_ln); with a ``layer`` before the last, through
        the norm reading block ``layer``'s input with its denominator (``apply_ln_to_stack``), as
        TransformerLens (``mlp_input``: and the stream entering its FFN, through the norm reading that).
        ``pos_slice``: the positions kept (TransformerLens' Slice: an int drops the axis)."""
        blocks = self._blocks("accumulated_resid")
        n = len(blocks)
        last = n if layer is None or layer == -1 else layer
        if not 0 <= last <= n:
            raise ValueError(f"layer={layer} is outside 0..{n} (n_layers: the stream leaving the last block)")
        if mlp_input and last == n:
            raise ValueError("mlp_input needs a layer: the FFN input of which block?")
        labels = []
        for i in range(min(last + 1, n)):
            labels.append(f"blocks.{i}.resid_pre")
            mid = blocks[i].layout.connections["ffn"].x  # the stream the FFN's connection adds to
            if ((incl_mid and i < last) or (mlp_input and i == last)) and mid != "resid_pre":
                labels.append(f"blocks.{i}.{mid}")  # the parallel block has no stream between
        if last == n:
            labels.append(self._final_stream())
        stack = torch.stack([take(self[name], pos_slice, -2) for name in labels])
        if apply_ln:
            stack = self._final_norm_of(stack) if last == n else \
                self.apply_ln_to_stack(stack, last, mlp_input, pos_slice)
        if self.transformerlens_keys and last == n:
            labels[-1] = "final_post"
        return (stack, self._labels(labels)) if return_labels else stack

    # -- the residual stream as a sum -------------------------------------------------------------

    def decompose_resid(
        self, layer: int | None = None, mlp_input: bool = False, mode: str = "all", *, apply_ln: bool = False,
        per_head: bool = False, stop_at_norm: bool = False, pos_slice: Where = None, incl_embeds: bool = True,
        return_labels: bool = False,
    ) -> Tensor | tuple[Tensor, list[str]]:
        """The residual stream entering block ``layer`` (default: leaving the last block; with
        ``mlp_input``, entering block ``layer``'s FFN) as its parts: the embedding, then each
        earlier attention and FFN output, stacked (parts, B, T, d); they sum to the stream exactly
        (float rounding). TransformerLens's ``decompose_resid``; ``decompose(stage)`` for any stage.
        """
        return self.decompose(self._stream_stage(layer, mlp_input), mode=mode, apply_ln=apply_ln,
                              per_head=per_head, stop_at_norm=stop_at_norm, pos_slice=pos_slice,
                              incl_embeds=incl_embeds, return_labels=return_labels)

    def decompose(
        self, stage: Key, *, mode: str = "all", apply_ln: bool = False, per_head: bool = False,
        stop_at_norm: bool = False, pos_slice: Where = None, incl_embeds: bool = True,
        return_labels: bool = False,
    ) -> Tensor | tuple[Tensor, list[str]]:
        """A residual stream stage (``resid_pre``, ``resid_mid``, ``resid_post``, a block's output)
        as parts that sum to it exactly: (parts, B, T, d), labelled by stage name.

        The parts: ``embed`` (or ``tok`` and ``pos`` when x0 is exactly their sum), then each
        sublayer's output as the residual adds it (``attn.out``/``ffn.out``; sandwich:
        ``ln1_out``/``ln2_out``), each times the residual scales on its way (rezero, deepnorm).
        ``per_head``: each attention output as its heads' ``attn.result[h]`` plus ``attn.o.bias``
        (eval mode: dropout off). ``apply_ln``: each part through the norm that reads this stage,
        its denominator held at the one the forward computed (``apply_ln_to_stack``): the parts
        then sum to that norm's output minus its beta. Where a norm sits on the stream (post-norm)
        the decomposition is refused, or with ``stop_at_norm`` ends at the norm's output. ``pos_slice``:
        the positions kept (TransformerLens' Slice). TransformerLens' ``mode`` "attn" or "mlp" keeps the
        attention's or the FFN's parts alone, ``incl_embeds=False`` leaves x0 out (they then sum to less).
        """
        if mode not in PART_KINDS:
            raise ValueError(f"mode={mode!r} is not one of: {', '.join(PART_KINDS)}")
        name = self.name_of(stage)
        wanted = {*PART_KINDS[mode], *(["embed"] if incl_embeds else [])}
        labels, parts = zip(*[(label, part) for label, part in self._parts(name, per_head, stop_at_norm)
                              if _part_kind(label) in wanted], strict=True)
        stack = take(torch.stack(torch.broadcast_tensors(*parts)), pos_slice, -2)
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, stage=name, pos_slice=pos_slice)
        return (stack, self._labels(list(labels))) if return_labels else stack

    def apply_ln_to_stack(
        self, stack: Tensor, layer: int | None = None, mlp_input: bool = False, pos_slice: Where = None,
        batch_slice: Where = None, has_batch_dim: bool = True, recompute_ln: bool = False, *,
        stage: Key | None = None,
    ) -> Tensor:
        """Each part of a residual stream stage (``stack``: (..., B, T, d), parts of the stream at
        ``layer``/``mlp_input`` as in ``decompose_resid``, or at ``stage``) through the norm that
        reads that stage, with the denominator the forward computed: gamma (part - mean) / denom
        (RMSNorm: no centring). Linear, so the results sum to the norm's output minus beta.
        ``pos_slice``: the positions ``stack`` holds (already sliced, as TransformerLens);
        ``batch_slice``: the rows kept, of ``stack`` (axis 1, when ``has_batch_dim``) and of the
        denominators; ``recompute_ln`` at the last layer: the final norm with each part's own statistics
        (the logit lens), as TransformerLens."""
        if has_batch_dim:
            stack = take(stack, batch_slice, 1)
        name = self._stream_stage(layer, mlp_input) if stage is None else self.name_of(stage)
        if recompute_ln and name == self._final_stream():
            return self._final_norm_of(stack)
        norm, where = self._norm_reading(name, "ffn" if mlp_input and stage is None else "attn")
        share = getattr(norm, "share", None)
        if isinstance(norm, nn.Identity):
            return stack
        if share is None:
            raise ValueError(f"{where} ({type(norm).__name__}) does not split over the parts of its input "
                             "(BatchNorm's statistics span the batch)")
        whole = take(self[name], pos_slice, -2)  # (B, T, d): the stream whose denominators are held
        with torch.no_grad():
            return share(stack, take(whole, batch_slice, 0) if self.has_batch_dim else whole)

    def logit_attrs(
        self, stack: Tensor, tokens: int | str | Tensor | None = None,
        incorrect_tokens: int | str | Tensor | None = None, pos_slice: Where = None,
        batch_slice: Where = None, has_batch_dim: bool = True, *, direction: Tensor | None = None,
        apply_ln: bool = True,
    ) -> Tensor:
        """Each part's share of a logit: (parts, B, T) = part . direction, with parts of the stream
        leaving the last block (``decompose_resid()``, ``stack_head_results``, ...).

        direction: the head's row of ``tokens`` (an id, one token's text as TransformerLens takes it, or
        ids broadcastable to (B, T): the logit of that token at each position), minus the row of
        ``incorrect_tokens`` (a logit
        difference); or any ``direction`` (d,) or (B, T, d) in the head's input space.
        ``apply_ln`` (default): the parts go through the final norm first (``apply_ln_to_stack``),
        so the attributions plus beta . direction sum to the logit (difference) exactly. ``pos_slice``: the
        positions ``stack`` holds (already sliced, as TransformerLens).
        """
        if (tokens is None) == (direction is None):
            raise ValueError("logit_attrs needs tokens (the logit of those ids) or a direction, not both")
        if tokens is not None:
            self._model_part("head", "logit_attrs")
            direction = self.model.tokens_to_residual_directions(tokens)  # the head's rows
            if incorrect_tokens is not None:
                direction = direction - self.model.tokens_to_residual_directions(incorrect_tokens)
        elif incorrect_tokens is not None:
            raise ValueError("incorrect_tokens goes with tokens, not with a direction")
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, None, False, pos_slice, batch_slice, has_batch_dim,
                                           stage=self._final_stream())
        with torch.no_grad():
            return (stack * direction.to(stack.dtype)).sum(-1)

    def stack_head_results(
        self, layer: int | None = None, return_labels: bool = False, incl_remainder: bool = False, *,
        pos_slice: Where = None, apply_ln: bool = False,
    ) -> Tensor | tuple[Tensor, list[str]]:
        """Every head's ``attn.result`` in blocks 0 .. layer - 1 (default: all), stacked:
        (layers * heads, B, T, d), labelled ``blocks.{i}.attn.result[{h}]`` (TransformerLens' keys:
        ``L{i}H{h}``); at the positions ``pos_slice`` keeps; ``incl_remainder``: then the stream entering
        ``layer`` minus them (``remainder``). ``apply_ln``: through the norm reading the stream at ``layer``
        (``apply_ln_to_stack``)."""
        last = self.n_layers if layer is None or layer == -1 else layer
        results = [take(self["attn.result", i], pos_slice, -3) for i in range(last)]  # (B, T, h, d) each
        labels = [f"blocks.{i}.attn.result[{h}]" for i, r in enumerate(results) for h in range(r.shape[-2])]
        stack = torch.cat([r.movedim(-2, 0) for r in results])
        if incl_remainder:
            stack, labels = self._with_remainder(stack, labels, last, pos_slice)
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, None if layer in (None, -1) else layer, pos_slice=pos_slice)
        return (stack, self._labels(labels)) if return_labels else stack

    def _with_remainder(self, stack: Tensor, labels: list[str], layer: int, pos_slice: Where
                        ) -> tuple[Tensor, list[str]]:
        """``stack`` (parts, B, T, d) and the stream entering ``layer`` minus its sum (``remainder``)."""
        stream = take(self[self._stream_stage(layer, False)], pos_slice, -2)
        return torch.cat([stack, (stream - stack.sum(0))[None]]), [*labels, "remainder"]

    # -- how the model is wired (layouts.LAYOUTS, through each block's layout) --------------------

    def _blocks(self, what: str) -> list[nn.Module]:
        blocks = getattr(self.model, "blocks", None)
        if not isinstance(blocks, nn.ModuleList):
            raise ValueError(f"{what} needs the cache of a Transformer (model.run_with_cache); this one is "
                             f"of a {type(self.model).__name__}")
        return list(blocks)

    def _model_part(self, attribute: str, what: str) -> nn.Module:
        self._blocks(what)
        return getattr(self.model, attribute)

    def _final_stream(self) -> str:
        """The stage holding the stream leaving the last block."""
        blocks = self._blocks("the final residual stream")
        return f"blocks.{len(blocks) - 1}.{blocks[-1].layout.output}"

    def _stream_stage(self, layer: int | None, mlp_input: bool) -> str:
        """The stream entering block ``layer`` (its FFN with ``mlp_input``); None: leaving the last."""
        blocks = self._blocks("the residual stream")
        n = len(blocks)
        if layer is None or layer in (-1, n):
            if mlp_input:
                raise ValueError("mlp_input needs a layer: the FFN input of which block?")
            return self._final_stream()
        if not 0 <= layer < n:
            raise ValueError(f"layer={layer} is outside 0..{n} (n_layers: the stream leaving the last block)")
        return f"blocks.{layer}.{blocks[layer].layout.connections['ffn'].x if mlp_input else 'resid_pre'}"

    def _norm_reading(self, name: str, sublayer: str = "attn") -> tuple[nn.Module, str]:
        """The norm that reads stream stage ``name`` (the layout's norm_inputs; after the last block:
        ln_f); where two do (the parallel block's ln1 and ln2), the one ``sublayer`` reads."""
        if name == self._final_stream():
            return self.model.ln_f, "ln_f"
        if name == "embed":
            name = "blocks.0.resid_pre"
        _, layer, stage = name.split(".", 2)
        block = self._blocks("apply_ln")[int(layer)]
        norms = [norm for norm, source in block.layout.norm_inputs.items() if source == stage]
        norms.sort(key=lambda norm: norm != block.layout.sublayer(sublayer).reads)
        if not norms:
            raise ValueError(f"no norm reads {name} ({block.layout.formula}): apply_ln has nothing to apply")
        return getattr(block, norms[0]), f"blocks.{layer}.{norms[0]}"

    def _final_norm_of(self, stack: Tensor) -> Tensor:
        """The final norm applied to each entry of ``stack`` with its own statistics."""
        norm = self._model_part("ln_f", "apply_ln")
        kind = NORM_KINDS.get(getattr(self.model.config, "norm", None))
        if kind is not None and kind.normalises and not kind.per_position:
            raise ValueError(f"apply_ln with norm={kind.name!r}: {kind.label}'s statistics span the batch, "
                             "not one vector")
        with torch.no_grad():
            return norm(stack)

    def _parts(self, name: str, per_head: bool, stop_at_norm: bool) -> list[tuple[str, Tensor]]:
        """Stream stage ``name`` as [(label, tensor)] summing to it, walking LAYOUTS back to x0."""
        if name == "embed":
            return self._embedding_parts()
        if not name.startswith("blocks."):
            raise ValueError(f"{name} is not on the residual stream (decompose takes resid_pre, resid_mid, "
                             "resid_post or a block's output)")
        _, index, stage = name.split(".", 2)
        layer, blocks = int(index), self._blocks("decompose")
        block, layout = blocks[layer], blocks[layer].layout
        if stage == "resid_pre":
            before = "embed" if layer == 0 else f"blocks.{layer - 1}.{blocks[layer - 1].layout.output}"
            return self._parts(before, per_head, stop_at_norm)
        if stage in layout.norm_inputs:  # a norm's output on the stream (post-norm's ln1, ln2)
            source = f"blocks.{layer}.{layout.norm_inputs[stage]}"
            if isinstance(getattr(block, stage), (NoNorm, nn.Identity)):
                return self._parts(source, per_head, stop_at_norm)
            if stop_at_norm:
                return [(name, self[name])]
            raise ValueError(
                f"{name} = {stage.upper()}({source}) ({layout.formula}): a norm sits on the residual stream "
                "here, so the stream after it is not a sum of the parts before it. What is a sum: each "
                "residual connection back to the last norm (post-norm: resid_mid = resid_pre + attn.out, "
                "resid_post = ln1 + ffn.out); stop_at_norm=True decomposes that far")
        connections = [c for c in layout.connections.values() if c.out == stage]  # the parallel block: two
        if not connections:
            raise ValueError(f"{name} is not on the residual stream (decompose takes resid_pre, resid_mid, "
                             "resid_post or a block's output)")
        first = connections[0]
        residual = getattr(block, first.residual)
        a, b = (c.detach() if isinstance(c, Tensor) else c for c in residual.coefficients())
        before = self._parts(f"blocks.{layer}.{first.x}", per_head, stop_at_norm) if a != 0 else []
        branches = [part for c in connections
                    for part in self._branch_parts(layer, c.sublayer, c.branch, per_head)]
        return [(label, a * t) for label, t in before] + [(label, b * t) for label, t in branches]

    def _branch_parts(self, layer: int, sublayer: str, branch: str, per_head: bool
                      ) -> list[tuple[str, Tensor]]:
        name = f"blocks.{layer}.{branch}"
        if not per_head or sublayer != "attn":
            return [(name, self[name])]
        if branch != "attn.out":
            raise ValueError(f"per_head: block {layer}'s attention reaches the stream through {branch}, a "
                             "norm, so its heads' results are not parts of the stream")
        results = self[f"blocks.{layer}.attn.result"]  # (B, T, h, d)
        parts = [(f"blocks.{layer}.attn.result[{h}]", results[:, :, h]) for h in range(results.shape[2])]
        bias = self._blocks("per_head")[layer].attn.o.bias
        if bias is not None:
            bias = bias.detach().to(results.dtype).expand_as(results[:, :, 0])
            parts.append((f"blocks.{layer}.attn.o.bias", bias))
        return parts

    def _embedding_parts(self) -> list[tuple[str, Tensor]]:
        """x0 as ``tok`` + ``pos`` when it is exactly their sum (no embedding norm, token types or
        dropout in between), else whole as ``embed``."""
        embed = self["embed"]
        if "tok" in self._stages:
            parts = [("tok", self["tok"])] + ([("pos", self["pos"])] if "pos" in self._stages else [])
            total = parts[0][1]
            for _, t in parts[1:]:
                total = total + t
            if torch.equal(total, embed):
                return parts
        return [("embed", embed)]
