"""TransformerLens' ``HookedTransformer`` object model on a blocklab ``Transformer`` (a mixin), where
TransformerLens code touches it:

    model.hook_dict["blocks.0.attn.hook_z"]   every hook point under TransformerLens' names (the cache's keys)
    model.mod_dict["blocks.0.mlp"]            every module: TransformerLens' names beside blocklab's
    model.unembed, model.ln_final, model.pos_embed, model.blocks[0].mlp
                                              TransformerLens' module names: blocklab's head, ln_f, pos, ffn
    model.set_use_attn_result(True)           hook_result: blocklab always has each head's result
    model.set_use_split_qkv_input(True)       refused by name (no per-head copy of the stream): what to patch

A hook point's own ``add_hook`` / ``remove_hooks`` and its TransformerLens ``.name`` are in hooks.py.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .hook_names import transformerlens_names
from .hooks import HookPoint, hook_points

# TransformerLens' module name -> blocklab's (the stack's); a block's ``mlp`` is its ``ffn`` (block.py)
MODULE_ALIASES = {"unembed": "head", "ln_final": "ln_f", "pos_embed": "pos"}

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
    def hook_dict(self) -> dict[str, HookPoint]:
        """TransformerLens' ``hook_dict``: hook name -> hook point, under every name TransformerLens' model
        of this kind has for a stage (blocklab's where it has none), as the cache's keys. A hook point's
        ``add_hook`` gives TransformerLens' layout (q, k, v as (B, T, h, d_head))."""
        causal = getattr(self.config, "causal", True)
        return {name: point for stage, point in hook_points(self).items()  # type: ignore[arg-type]
                for name in transformerlens_names(stage, causal) or [stage]}

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
