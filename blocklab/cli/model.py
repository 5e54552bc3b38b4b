"""``blocklab params``: the analytic parameter count of a preset plus overrides."""

from __future__ import annotations

import argparse

from ..nn.config import ModelConfig
from ..nn.layouts import LAYOUTS
from ..nn.norm_kinds import NORM_KINDS
from ..nn.presets import PRESET_NOTES, PUBLISHED_TOTALS, preset
from .args import add_command, add_config_flags, add_json_flag, config_from_args, emit_json, say_written


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``params``."""
    p = add_command(
        sub, "params",
        "Count the parameters of a preset plus any ModelConfig flag, per component, from the formulas "
        "(no model is built), and compare with the published total of a known preset.",
    )
    add_config_flags(p)
    add_json_flag(p, 'the count: {"total": int, "components": {...}, "per_layer": {...}} (with experts also '
                      '"active": int, "ffn_parts": {...})')
    p.set_defaults(func=cmd_params)


def cmd_params(args: argparse.Namespace) -> int:
    """Print the parameter table (or JSON) for a preset plus overrides."""
    from ..nn.params import count_parameters

    config = config_from_args(args)
    count = count_parameters(config)
    if emit_json(args.json, count.to_dict()):
        return 0
    from rich.console import Console
    from rich.table import Table

    c = config
    table = Table(
        title=f"parameters: {args.preset} (d_model {c.d_model}, {c.n_layers} layers, "
        f"{c.n_heads} heads, d_ff {c.d_ff}, vocab {c.vocab_size})"
    )
    table.add_column("component")
    table.add_column("parameters", justify="right")
    table.add_column("share", justify="right")
    table.add_column("how", style="dim")
    formulas, parts = _formulas(c), _part_formulas(c)
    for name, n in count.components.items():
        table.add_row(name, f"{n:,}", f"{100 * n / count.total:.1f}%", formulas.get(name, ""))
        if name == "blocks.ffn":  # a mixture's parts, inside its row (the components sum without them)
            for part, per_block in count.ffn_parts.items():
                n = per_block * c.n_layers
                table.add_row(f"  {part}", f"{n:,}", f"{100 * n / count.total:.1f}%", parts[part])
    table.add_section()
    table.add_row("total", f"{count.total:,}", "100%", "")
    console = Console()
    console.print(table)
    per_layer = ", ".join(f"{k} {v:,}" for k, v in count.per_layer.items())
    console.print(f"per block: {per_layer}")
    if count.active is not None:
        active = count.active
        console.print(f"active per token: {active:,} ({100 * active / count.total:.1f}%: "
                      f"{c.experts_per_token} of {c.n_experts} experts in each block)")
    for line in attention_notes(c):
        console.print(line)
    if args.preset in PUBLISHED_TOTALS and config == preset(args.preset):
        published = PUBLISHED_TOTALS[args.preset]
        verdict = "equal" if published == count.total else f"differs by {count.total - published:+,}"
        console.print(f"published total: {published:,} ({verdict})")
    if args.preset in PRESET_NOTES:
        console.print(f"note: {PRESET_NOTES[args.preset]}")
    say_written(args.json)
    return 0


def attention_notes(c: ModelConfig) -> list[str]:
    """What a config does to the scores and logits beyond Q K^T / sqrt(d_head), and each layer's window (Gemma
    2), in words."""
    notes = []
    if c.query_pre_attn_scalar is not None:
        notes.append(f"attention scores: Q K^T / sqrt({c.query_pre_attn_scalar:g}) (query_pre_attn_scalar), "
                     f"not / sqrt(d_head {c.d_head})")
    if c.attn_softcap is not None:
        notes.append(f"attention scores soft-capped: {c.attn_softcap:g} tanh(s / {c.attn_softcap:g})")
    if c.logit_softcap is not None:
        notes.append(f"logits soft-capped: {c.logit_softcap:g} tanh(logits / {c.logit_softcap:g})")
    if c.layer_windows is not None:
        kinds = {}  # window -> layers
        for i, w in enumerate(c.layer_windows):
            kinds.setdefault(w, []).append(str(i))
        kind = lambda w: "global" if w is None else f"local, window {w}"
        notes.append("attention per layer: " + "; ".join(f"{', '.join(at)} {kind(w)}"
                                                         for w, at in kinds.items()))
    if c.local_rotary_base is not None:
        notes.append(f"rotary base per layer: {c.local_rotary_base:g} on the local layers "
                     f"(local_rotary_base), {c.rotary_base:g} on the global ones (rotary_base)")
    return notes


def _part_formulas(c: ModelConfig) -> dict[str, str]:
    """'How it is counted' for each part of a mixture of experts (the sub-rows of blocks.ffn)."""
    from ..nn.activation_kinds import activation_kind

    L, E = c.n_layers, c.n_experts
    n_in = activation_kind(c.activation).ffn_kind.input_matrices + 1
    biases = " + biases" if c.has_ffn_bias else ""
    return {
        "router": f"L {L} x E {E} x d",
        "experts": f"L {L} x E {E} x ({n_in} d d_ff{biases})",
        "shared_expert": f"L {L} x ({n_in} d {c.shared_expert_d_ff}{biases} + gate d)",
    }


def _formulas(c: ModelConfig) -> dict[str, str]:
    """One-line 'how it is counted' for each component of the table."""
    from ..nn.activation_kinds import activation_kind

    d, L = c.d_model, c.n_layers
    b = {(True, True): " + 4d", (True, False): " + 3d", (False, True): " + d", (False, False): ""}[
        c.has_qkv_bias, c.has_o_bias]  # q, k, v's biases and o's
    n_in = str(activation_kind(c.activation).ffn_kind.input_matrices + 1)  # and w2
    ln = NORM_KINDS[c.norm].parameters_in_words(c.bias)
    d_q, d_kv = c.n_heads * c.d_head, c.kv_heads * c.d_head  # q's and o's width (d unless head_dim); k's, v's
    q_part = "2d^2" if d_q == d else f"2d x {d_q}"
    qk_norms = {"none": "", "head": " + 2 QK-norms of d_k",
                "all_heads": " + QK-norms of d_q, d_kv"}[c.qk_norm]
    biases = " + biases" if c.has_o_bias or c.has_qkv_bias else ""
    return {
        "embed": f"vocab {c.vocab_size} x d {d}",
        "pos": f"max_seq_len {c.max_seq_len} x d {d}",
        "token_type": f"{c.type_vocab_size} x d {d}",
        "blocks.attn": f"L {L} x (4d^2{b})" if d_q == d_kv == d and c.qk_norm == "none" else
                       f"L {L} x ({q_part} + 2d x {d_kv}{biases}{qk_norms})",
        "blocks.ffn": f"L {L} x (the parts below)" if c.n_experts else
                      f"L {L} x ({n_in} d d_ff{' + biases' if c.has_ffn_bias else ''}), d_ff {c.d_ff}",
        **{f"blocks.{norm}": f"L {L} x {ln}" for norm in LAYOUTS[c.norm_position].norms},
        "ln_f": ln,
        "head": ("tied to embed (shared)" if c.tie_embeddings else f"d {d} x vocab {c.vocab_size}")
                + (f" + bias of {c.vocab_size}" if c.head_bias else ""),
    }
