"""TransformerLens' ``HookedTransformer`` object model on a blocklab ``Transformer`` (a mixin), where
TransformerLens code touches it:

    model.hook_dict["blocks.0.attn.hook_z"]   every hook point under TransformerLens' names (the cache's keys)
    model.mod_dict["blocks.0.mlp"]            every module: TransformerLens' names beside blocklab's
    model.unembed, model.ln_final, model.pos_embed, model.blocks[0].mlp
                                              TransformerLens' module names: blocklab's head, ln_f, pos, ffn
    model.set_use_attn_result(True)           hook_result: blocklab always has each head's result
    model.set_use_split_qkv_input(True)       refused by name (no per-head copy of the stream): what to patch
    model.accumulated_bias(layer), model.tokens_to_residual_directions(tokens), model.get_token_position(
    " cat", text), model.to_single_str_token(id)

A hook point's own ``add_hook`` / ``remove_hooks`` and its TransformerLens ``.name`` are in hooks.py.
Each hook point is also an attribute under TransformerLens' name (``model.blocks[0].attn.hook_pattern``
is ``...attn.hook_weights``, ``model.blocks[0].mlp.hook_post`` is ``...ffn.hook_act``;
``alias_hook_points``) wherever that attribute is not blocklab's own: ``model.hook_embed`` stays blocklab's
x0 (TransformerLens' is the token part, ``model.hook_dict["hook_embed"]``; its ``add_hook`` is refused).
A name TransformerLens' model of this config holds another tensor under (``hook_embed`` after BLOOM's
embedding LayerNorm) is in no key list and refused by name wherever it is written (``hook_names``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from .hook_names import blocklab_name, transformerlens_names
from .hooks import HookPoint, hook_points

# TransformerLens' module name -> blocklab's (the stack's); a block's ``mlp`` is its ``ffn`` (block.py)
MODULE_ALIASES = {"unembed": "head", "ln_final": "ln_f", "pos_embed": "pos"}

class HookDict(dict):
    """TransformerLens' ``hook_dict``; a missing name is a KeyError saying why where blocklab knows it (no
    such stage, or another tensor under that name in TransformerLens' model of ``config``)."""

    def __init__(self, points: dict[str, HookPoint], config: Any) -> None:
        super().__init__(points)
        self.config = config

    def __missing__(self, name: str) -> HookPoint:
        try:
            blocklab_name(name, self.config)
        except ValueError as error:
            raise KeyError(str(error)) from None
        raise KeyError(name)


# TransformerLens' switches that add a copy of the stream blocklab does not make: (the hook names the
# copy has, what to hook in blocklab instead)
_NO_COPY = {
    "set_use_split_qkv_input": (
        "blocks.{i}.hook_q_input / hook_k_input / hook_v_input (one copy of resid_pre per head, feeding q, k "
        "or v alone)", "a head's query, key or value after its projection: blocks.{i}.attn.hook_q / hook_k / "
        "hook_v (B, T, h, d_head), or the whole input: blocks.{i}.ln1.hook_normalized"),
    "set_use_attn_in": (
        "blocks.{i}.hook_attn_in (one copy of resid_pre per head, feeding that head alone)",
        "a head's query, key or value: blocks.{i}.attn.hook_q / hook_k / hook_v, or a head's output: "
        "blocks.{i}.attn.hook_z / hook_result"),
    "set_use_hook_mlp_in": (
        "blocks.{i}.hook_mlp_in (a copy of resid_mid feeding the MLP alone)",
        "the MLP's normalised input: blocks.{i}.ln2.hook_normalized (before gamma and beta), or its hidden "
        "layer: blocks.{i}.mlp.hook_pre"),
}


def alias_hook_points(model: Any) -> None:
    """Put each hook point in its TransformerLens parent module's instance ``__dict__`` under its
    TransformerLens attribute name (plain attributes: not submodules, not in the state dict), where the
    parent has no attribute of that name already (called once at construction)."""
    modules = model.mod_dict
    for name, point in model.hook_dict.items():
        parent_path, _, attribute = name.rpartition(".")
        parent = modules.get(parent_path) if parent_path else model
        if parent is not None and attribute.startswith("hook_") and not hasattr(parent, attribute):
            parent.__dict__[attribute] = point


def _refused(switch: str) -> None:
    copy, instead = _NO_COPY[switch]
    raise ValueError(f"{switch}(True): TransformerLens then hooks {copy}; blocklab's attention and MLP read "
                     f"one input, so there is no such copy to hook. Hook {instead}")


class TransformerLensModel:
    """``hook_dict``, ``mod_dict``, TransformerLens' module names and its ``set_use_*`` switches, for
    ``Transformer`` (mixin)."""

    config: Any
    blocks: nn.ModuleList
    head: nn.Linear
    ln_f: nn.Module
    pos: nn.Module | None
    use_attn_result = False  # set_use_attn_result's flag, which model.cfg reports

    @property
    def hook_dict(self) -> HookDict:
        """TransformerLens' ``hook_dict``: hook name -> hook point, under every name TransformerLens' model
        of this kind has for a stage (blocklab's where it has none), as the cache's keys. A hook point's
        ``add_hook`` gives TransformerLens' layout (q, k, v as (B, T, h, d_head))."""
        return HookDict({name: point for stage, point in hook_points(self).items()  # type: ignore[arg-type]
                         for name in transformerlens_names(stage, self.config) or [stage]}, self.config)

    @property
    def mod_dict(self) -> dict[str, nn.Module]:
        """TransformerLens' ``mod_dict``: module name -> module, its names (``unembed``, ``ln_final``,
        ``pos_embed``, ``blocks.{i}.mlp``, every hook name) beside blocklab's module paths."""
        modules = {name: m for name, m in self.named_modules()  # type: ignore[attr-defined]
                   if name and not isinstance(m, HookPoint)}  # hook points: under their hook names
        for theirs, ours in MODULE_ALIASES.items():
            if ours in modules:
                modules[theirs] = modules[ours]
        for i, block in enumerate(self.blocks):
            modules[f"blocks.{i}.mlp"] = block.ffn
        return {**modules, **self.hook_dict}

    @property
    def unembed(self) -> nn.Linear:
        """TransformerLens' name for the LM head (``head``)."""
        return self.head

    @property
    def ln_final(self) -> nn.Module:
        """TransformerLens' name for the final norm (``ln_f``)."""
        return self.ln_f

    @property
    def pos_embed(self) -> nn.Module:
        """TransformerLens' name for the position table (``pos``); an AttributeError where x0 adds none."""
        if self.pos is None:
            raise AttributeError(f"pos_embed: pos_encoding={self.config.pos_encoding!r} adds no position "
                                 "table to x0")
        return self.pos

    def set_use_attn_result(self, use_attn_result: bool) -> None:
        """TransformerLens' switch for ``blocks.{i}.attn.hook_result`` (each head's output, (B, T, h, d)):
        blocklab always has that stage, so True is what blocklab does; the flag is ``model.cfg``'s."""
        self.use_attn_result = bool(use_attn_result)

    def set_use_split_qkv_input(self, use_split_qkv_input: bool) -> None:
        """TransformerLens' per-head copies of the input to q, k and v: refused (True) by name."""
        if use_split_qkv_input:
            _refused("set_use_split_qkv_input")

    def set_use_attn_in(self, use_attn_in: bool) -> None:
        """TransformerLens' per-head copies of the attention's input: refused (True) by name."""
        if use_attn_in:
            _refused("set_use_attn_in")

    def set_use_hook_mlp_in(self, use_hook_mlp_in: bool) -> None:
        """TransformerLens' copy of the MLP's input stream: refused (True) by name."""
        if use_hook_mlp_in:
            _refused("set_use_hook_mlp_in")

    # -- TransformerLens' helpers for direct logit attribution ----------------------------------------

    def accumulated_bias(self, layer: int, mlp_input: bool = False, include_mlp_biases: bool = True
                         ) -> Tensor:
        """What the biases of the blocks before ``layer`` add to the stream (d,): each attention's output
        bias and (``include_mlp_biases``) each FFN's; with ``mlp_input``, block ``layer``'s attention
        bias too (TransformerLens' ``accumulated_bias``)."""
        d = self.head.weight.shape[1]
        total = torch.zeros(d, dtype=self.head.weight.dtype, device=self.head.weight.device)
        for i, block in enumerate(self.blocks[: layer + (1 if mlp_input else 0)]):
            total = total + block.attn.b_O
            if include_mlp_biases and i < layer:
                total = total + block.ffn.b_out
        return total

    def tokens_to_residual_directions(self, tokens: str | int | Tensor | Sequence[int]) -> Tensor:
        """The head's row of each token, the direction whose dot product with the final hidden state is
        its logit: a token (its text, id or a one-element tensor) -> (d,); ids (T,) -> (T, d); (B, T) ->
        (B, T, d) (TransformerLens' ``tokens_to_residual_directions``)."""
        unembed = self.head.weight  # (vocab, d)
        if isinstance(tokens, str):
            tokens = self.to_single_token(tokens)  # type: ignore[attr-defined]
        ids = torch.as_tensor(tokens, device=unembed.device)
        return unembed[ids.reshape(())] if ids.numel() == 1 else unembed[ids]

    def get_token_position(self, single_token: str | int, input: str | Tensor, mode: str = "first",
                           prepend_bos: bool | None = None, padding_side: str | None = None) -> int:
        """Where ``single_token`` (its text or id) first (``mode="first"``) or last (``"last"``) occurs in
        ``input`` (a text, tokenized as ``to_tokens`` does, or ids (T,) / (1, T)); TransformerLens'
        ``get_token_position``. A ValueError when it does not occur."""
        if mode not in ("first", "last"):
            raise ValueError(f"mode={mode!r} is not one of: first, last")
        tokens = self.to_tokens(input, prepend_bos, padding_side or "right") if isinstance(input, str) \
            else input  # type: ignore[attr-defined]
        if tokens.dim() == 2:
            if tokens.shape[0] != 1:
                raise ValueError(f"get_token_position takes one sequence, not ids {tuple(tokens.shape)}")
            tokens = tokens[0]
        token = self.to_single_token(single_token) if isinstance(single_token, str) \
            else single_token  # type: ignore[attr-defined]
        where = (tokens == token).nonzero()[:, 0].tolist()
        if not where:
            raise ValueError(f"token {single_token!r} ({token}) does not occur in the input")
        return where[0] if mode == "first" else where[-1]

    def to_single_str_token(self, int_token: int) -> str:
        """One token id as its text (TransformerLens' ``to_single_str_token``)."""
        return self.to_str_tokens([int_token])[0]  # type: ignore[attr-defined]
