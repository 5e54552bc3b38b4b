"""TransformerLens' ActivationCache methods that split the stream finer than blocklab's decompositions
(decompose.py) and slice the batch: ``compute_head_results``, ``get_neuron_results``,
``stack_neuron_results``, ``get_full_resid_decomposition``, ``apply_slice_to_batch_dim``, with its
``pos_slice`` / ``neuron_slice`` / ``batch_slice`` (``decompose.take``) and its labels (``L0N5``, ``bias``).
``ActivationCache`` (cache.py) takes them as a mixin, after ``StreamDecomposition``.

The full decomposition is TransformerLens' recipe, x0 parts + every head + every neuron (or FFN output)
+ the biases, which sums to the stream only where each sublayer's output is added to it as it is: a block
whose residual scales its branches (rezero, deepnorm) or adds a norm's output (sandwich, post-norm) is
refused by name, with ``decompose(..., per_head=True)`` to use instead.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .decompose import StreamDecomposition, Where, take


class TransformerLensAnalysis(StreamDecomposition):
    """TransformerLens' finer splits of the stream and its batch slice (a mixin of ``ActivationCache``)."""

    grads: Any

    def compute_head_results(self) -> None:
        """Each head's output ``attn.result`` (B, T, h, d) = z @ W_O per head, from ``attn.z``, for the blocks
        whose result was not cached (TransformerLens' ``compute_head_results``; a no-op where it was)."""
        for i, block in enumerate(self._blocks("compute_head_results")):
            name = f"blocks.{i}.attn.result"
            if name not in self._stages:
                with torch.no_grad():  # (B, T, h, d_head) -> (B, T, h, d), as the forward computes it
                    self._stages[name] = block.attn.results_from_z(self[f"blocks.{i}.attn.z"])
                self._tl_keys = None  # the keys it iterates are spelled again

    def get_neuron_results(self, layer: int, neuron_slice: Where = None, pos_slice: Where = None) -> Tensor:
        """What each FFN neuron of block ``layer`` writes to the stream: its activation times its row of
        W_out, (B, T, neurons, d), for the neurons ``neuron_slice`` keeps (TransformerLens')."""
        acts = take(take(self["ffn.act", layer], pos_slice, -2), neuron_slice, -1)  # (B, T, n)
        w_out = take(self._blocks("get_neuron_results")[layer].ffn.W_out, neuron_slice, 0)  # (n, d)
        with torch.no_grad():
            return acts[..., None] * w_out.to(acts.dtype)

    def stack_neuron_results(
        self, layer: int, pos_slice: Where = None, neuron_slice: Where = None, return_labels: bool = False,
        incl_remainder: bool = False, apply_ln: bool = False,
    ) -> Tensor | tuple[Tensor, list[str]]:
        """Every neuron's output in blocks 0 .. layer - 1, stacked (layers * neurons, B, T, d), labelled
        ``blocks.{i}.ffn.act[{n}]`` (TransformerLens' keys: ``L{i}N{n}``); ``incl_remainder``: then the
        stream entering ``layer`` minus them; ``apply_ln`` through the norm reading the stream at ``layer``
        (TransformerLens' ``stack_neuron_results``)."""
        if isinstance(neuron_slice, int):  # one neuron: keep its axis, to stack over it
            neuron_slice = [neuron_slice]
        d_ff = self._blocks("stack_neuron_results")[0].ffn.W_out.shape[0]
        kept = take(torch.arange(d_ff), neuron_slice, 0).tolist()
        parts = [self.get_neuron_results(i, neuron_slice, pos_slice) for i in range(layer)]
        labels = [f"blocks.{i}.ffn.act[{n}]" for i in range(layer) for n in kept]
        if parts:  # (B, T, n, d) each -> (n, B, T, d)
            stack = torch.cat([p.movedim(-2, 0) for p in parts])
        else:
            stack = take(self["embed"], pos_slice, -2)[None][:0]
        if incl_remainder:
            stack, labels = self._with_remainder(stack, labels, layer, pos_slice)
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, pos_slice=pos_slice)
        return (stack, self._labels(labels)) if return_labels else stack

    def get_full_resid_decomposition(
        self, layer: int | None = None, mlp_input: bool = False, expand_neurons: bool = True,
        apply_ln: bool = False, pos_slice: Where = None, return_labels: bool = False,
    ) -> Tensor | tuple[Tensor, list[str]]:
        """The stream entering block ``layer`` (default: leaving the last; ``mlp_input``: entering its FFN)
        as every head's result, every neuron's output (``expand_neurons``; else each FFN's output), the
        x0 parts and the biases (``bias``: ``model.accumulated_bias``), stacked (parts, B, T, d):
        TransformerLens' ``get_full_resid_decomposition``, its order and labels (``L0H0``, ``L0N0``,
        ``0_mlp_out``, ``embed``, ``pos_embed``, ``bias``)."""
        n = self.n_layers
        last = n if layer is None or layer == -1 else layer
        self._check_plain_sums(last, mlp_input)
        self.compute_head_results()
        heads, labels = self.stack_head_results(last + (1 if mlp_input else 0), True, pos_slice=pos_slice)
        parts = [heads]
        if last > 0 and expand_neurons:
            neurons, neuron_labels = self.stack_neuron_results(last, pos_slice, return_labels=True)
            parts.append(neurons)
            labels += neuron_labels
        elif last > 0:
            parts += [take(self[f"blocks.{i}.ffn.out"], pos_slice, -2)[None] for i in range(last)]
            labels += self._labels([f"blocks.{i}.ffn.out" for i in range(last)])
        for label, x0 in self._embedding_parts():
            parts.append(take(x0, pos_slice, -2)[None])
            labels += self._labels([label])
        bias = self.model.accumulated_bias(last, mlp_input, include_mlp_biases=expand_neurons)
        parts.append(bias.to(heads.dtype).expand((1, *heads.shape[1:])))
        labels.append("bias")
        stack = torch.cat(parts)
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, None if last == n else last, mlp_input, pos_slice)
        return (stack, labels) if return_labels else stack

    def _check_plain_sums(self, layer: int, mlp_input: bool) -> None:
        """Refuse a full decomposition where the stream is not x0 plus each sublayer's output as it is."""
        for i, block in enumerate(self._blocks("get_full_resid_decomposition")[: layer + 1]):
            if "attn" not in block.layout.connections:  # the simplified block: attention feeds the FFN
                raise ValueError(
                    f"get_full_resid_decomposition: block {i} ({block.layout.formula}) adds no attention "
                    "output to its stream (attention feeds the FFN), so its heads are not parts of the "
                    "stream; cache.decompose(stage) splits this stream")
            for c in block.layout.connections.values():
                coefficients = [float(k) for k in getattr(block, c.residual).coefficients()]
                if c.branch != f"{c.sublayer}.out" or coefficients != [1.0, 1.0]:
                    raise ValueError(
                        f"get_full_resid_decomposition: block {i} ({block.layout.formula}) adds "
                        f"{c.branch} times {coefficients[1]:g} to {coefficients[0]:g} x its stream, so "
                        "heads, neurons and biases do not sum to it; cache.decompose(stage, per_head=True) "
                        "splits this stream")
        if mlp_input and layer < len(self._blocks("mlp_input")) and \
                self._blocks("mlp_input")[layer].layout.connections["ffn"].x == "resid_pre":
            raise ValueError(f"mlp_input: block {layer}'s FFN reads its input stream (attention and FFN in "
                             "parallel), which holds none of its heads; ask for layer without mlp_input")

    def apply_slice_to_batch_dim(self, batch_slice: Where) -> Any:
        """A new cache with every stage (and gradient) sliced along the batch as TransformerLens' Slice:
        an int keeps that row and drops the axis (TransformerLens' ``apply_slice_to_batch_dim``)."""
        grads = {n: take(g, batch_slice, 0) for n, g in self.grads._stages.items()} \
            if self.grads is not None else None
        where = getattr(batch_slice, "slice", batch_slice)  # TransformerLens' Slice: what it was built from
        if not self.has_batch_dim and where is not None:
            raise ValueError("apply_slice_to_batch_dim: this cache has no batch dimension (remove_batch_dim)")
        stages = self._stages.map(lambda t: take(t, where, 0) if t.dim() > 0 else t)
        sliced = type(self)(stages, self.model, grads, self.transformerlens_keys)
        sliced.has_batch_dim = self.has_batch_dim and not isinstance(where, int)  # an int drops the axis
        return sliced
