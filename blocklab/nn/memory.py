"""The memory guard: estimate what a config and batch need before allocating anything.

The estimate, in bytes, for float32 (4 bytes a value), P parameters, N = batch x seq tokens:

    parameters   4 P   (+ the sinusoidal table, 4 max_seq_len d; rotary: its r/2 frequencies)
    gradients    4 P                          training only
    optimizer    8 P                          AdamW keeps two moments per parameter
    activations  4 N (L a + 3 d + 3 V)        training: what autograd keeps for backward

per token and layer (a mixture of experts: ``moe_values_per_token`` in place of the FFN's terms),
on the lean path (``config.uses_lean_path``),
a = 6 d + f d_ff + h (+ 2 h T with the explicit attention path):
the block input, q, k, v and the attention output (5 d), the input of the second sublayer
(d), the FFN activation (f = 1; 2 for gated activations, which add w3's output), one softmax
statistic per head (h). Module by module, autograd also keeps each norm's output and statistics
and the activation's output: a = 8 d + 2 f d_ff + h + 4 (docs/performance.md's ledger: the
norms' outputs (2 d), their mean and rstd (4), act(h) beside h (and the gate's product)).
Outside the blocks: the embedding, final norm and head input (3 d),
and the logits, their log-softmax and their gradient (3 V). Inference keeps no graph: one
layer's activations plus the logits, a + 2 V per token. With ``checkpoint_blocks`` a block
keeps only its input (d) and recomputes the rest in backward, so L a becomes L d + a.

Building the model costs more than its parameters: each block's modules, hooks and small tensors take
about ``BLOCK_OVERHEAD`` bytes whatever the width (measured: ~91 KB a block at d_model 16 to 256), so
a config of a million narrow layers is refused for what it is (about 90 GB), not for its parameters.
Loading a checkpoint holds the file's tensors beside the model's until they are copied in (4 P more).
The sinusoidal position table is built in float32 a slice at a time (``embedding.sinusoidal_table``),
so it costs what the estimate counts for it, never a float64 copy of the whole.
Not counted: the ~20 MB of libtorch's kernels a process pages in on its first tensor ops, shared
file-backed code that is the process's whatever the model, not the model's.
``tests/nn/test_memory.py`` checks
gradients + optimizer + activations against the peak bytes PyTorch's profiler records for a
real training step (forward, backward, AdamW step).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from .activation_kinds import activation_kind
from .config import ModelConfig
from .params import count_parameters
from .position_kinds import POSITION_KINDS
from .rotary import rotary_dim

BYTES_FLOAT32 = 4
ADAMW_SLOTS = 2  # exp_avg and exp_avg_sq
BLOCK_OVERHEAD = 128 * 1024  # bytes a block's modules take beyond its parameters (measured ~91 KB)


class InsufficientMemoryError(ValueError):
    """The estimated memory exceeds what is available; the message has the estimate."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Estimated bytes by kind; ``total`` is their sum."""

    parameters: int
    gradients: int
    optimizer: int
    activations: int
    construction: int = 0  # the model's modules beyond its parameters; a loaded file's copy of the weights

    @property
    def total(self) -> int:
        """All five terms."""
        return self.parameters + self.gradients + self.optimizer + self.activations + self.construction

    def describe(self) -> str:
        """``1.2 GB (parameters 500.0 MB, gradients ..., optimizer ..., activations ..., ...)``."""
        parts = [f"{name} {format_bytes(getattr(self, name))}"
                 for name in ("parameters", "gradients", "optimizer", "activations", "construction")
                 if getattr(self, name)]
        return f"{format_bytes(self.total)} ({', '.join(parts)})"


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KB' (powers of 1024)."""
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1024 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def activation_values_per_token(config: ModelConfig, seq_len: int, explicit_attention: bool = False) -> int:
    """Values autograd keeps per token for one block: lean 6 d + f d_ff + h, module by module
    8 d + 2 f d_ff + h + 4 (+ 2 h T explicit); rotary positions add the rotated q and k (d + d_kv),
    QK-norm the normalised q and k (d + d_kv) and its denominators (h + h_kv per head, 2 over all
    heads), grouped-query heads the keys and values repeated for their query heads (2 d), ALiBi its bias
    row per head (h T: the float mask SDPA keeps), soft-capped scores the explicit path and tanh's output (h
    T). Heads wider
    or narrower than d / h (``head_dim``) make q and the heads' output h d_k wide: d_q in place of d."""
    c = config
    explicit_attention = explicit_attention or c.attn_softcap is not None  # SDPA cannot cap: explicit path
    ffn = activation_kind(c.activation).ffn_kind.input_matrices * c.d_ff
    d_q, d_kv = c.n_heads * c.d_head, c.kv_heads * c.d_head  # q's width (d unless head_dim), k's and v's
    attention = c.n_heads + (2 * c.n_heads * seq_len if explicit_attention else 0) + 2 * (d_q - c.d_model)
    if POSITION_KINDS[c.pos_encoding].rotary:
        attention += d_q + d_kv
    if c.qk_norm != "none":
        denominators = c.n_heads + c.kv_heads if c.qk_norm == "head" else 2
        attention += d_q + d_kv + denominators
    if c.kv_heads != c.n_heads:
        attention += 2 * d_q
    if POSITION_KINDS[c.pos_encoding].alibi:  # the bias -m_h |i - j|, SDPA's float mask kept for backward:
        attention += c.n_heads * seq_len  # h T per token with padding ((B, h, T, T)); fewer without
    if c.attn_softcap is not None:  # tanh keeps its output (B, h, T, T) for backward: h T per token
        attention += c.n_heads * seq_len
    if c.uses_lean_path:
        return 6 * c.d_model + ffn + attention
    ffn_kept = 2 * ffn if not c.n_experts else moe_values_per_token(c)
    return 8 * c.d_model + ffn_kept + attention + 4  # (module path) norms' outputs and stats, act(h)


def moe_values_per_token(config: ModelConfig) -> int:
    """Values a mixture of experts keeps per token for backward: the router's probabilities (E), and for
    each of the token's k experts its copy of the token (d), what the expert keeps (f d_ff on its lean
    path, 2 f d_ff module by module), its output before the weight (d), the weight, its index (int64: 2);
    a shared expert adds what it keeps and its gate's input (d) and output (1)."""
    c = config
    kept = (1 if c.components_fused else 2) * activation_kind(c.activation).ffn_kind.input_matrices
    routed = c.experts_per_token * (2 * c.d_model + kept * c.d_ff + 3)
    shared = kept * c.shared_expert_d_ff + c.d_model + 1 if c.shared_expert_d_ff else 0
    return c.n_experts + routed + shared


def estimate_memory(
    config: ModelConfig,
    batch_size: int,
    seq_len: int | None = None,
    training: bool = True,
    explicit_attention: bool = False,
    loading: bool = False,
) -> MemoryEstimate:
    """Bytes for parameters, gradients, AdamW state, activations and construction (module docstring).

    ``loading``: the weights are read from a file (a second copy while they are copied in)."""
    c = config
    T = c.max_seq_len if seq_len is None else seq_len
    tokens = batch_size * T
    P = count_parameters(c).total
    positions = POSITION_KINDS[c.pos_encoding]  # a fixed code added to x0 is a table; rotary: its frequencies
    tables = (c.max_seq_len * c.d_model if positions.adds_to_x0 and not positions.learned
              else rotary_dim(c.d_head, c.rotary_fraction) // 2 * (1 + (c.local_rotary_base is not None))
              if positions.rotary else 0)  # (Gemma 3's local layers: a second table of frequencies)
    params = BYTES_FLOAT32 * (P + tables)
    construction = BLOCK_OVERHEAD * c.n_layers + (BYTES_FLOAT32 * P if loading else 0)
    per_layer = activation_values_per_token(c, T, explicit_attention)
    if training:
        blocks = (c.n_layers * c.d_model + per_layer if getattr(c, "checkpoint_blocks", False)
                  else c.n_layers * per_layer)
        activations = tokens * (blocks + 3 * c.d_model + 3 * c.vocab_size)
        return MemoryEstimate(params, BYTES_FLOAT32 * P, BYTES_FLOAT32 * ADAMW_SLOTS * P,
                              BYTES_FLOAT32 * activations, construction)
    return MemoryEstimate(params, 0, 0, BYTES_FLOAT32 * tokens * (per_layer + 2 * c.vocab_size), construction)


def estimate_training_memory(
    config: ModelConfig, batch_size: int, eval_batch_size: int, seq_len: int | None = None
) -> MemoryEstimate:
    """A training run's peak: the training step, or a no-grad evaluation batch while the
    gradients and AdamW state are still held, whichever needs more."""
    step = estimate_memory(config, batch_size, seq_len, training=True)
    evaluation = estimate_memory(config, eval_batch_size, seq_len, training=False)
    return dataclasses.replace(step, activations=max(step.activations, evaluation.activations))


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def available_memory() -> tuple[int, str] | None:
    """(bytes, where it was read): MemAvailable, lowered by a cgroup limit if there is one."""
    try:
        meminfo = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    match = re.search(r"^MemAvailable:\s+(\d+) kB", meminfo, re.MULTILINE)
    if not match:
        return None
    best = (int(match.group(1)) * 1024, "MemAvailable in /proc/meminfo")
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),  # cgroup v2
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        limit, usage = _read_int(limit_file), _read_int(usage_file)
        if limit is not None and usage is not None and limit - usage < best[0]:
            best = (max(limit - usage, 0), f"the cgroup limit in {limit_file}")
    return best


def check_memory(
    config: ModelConfig,
    batch_size: int,
    seq_len: int | None = None,
    training: bool = True,
    force: bool = False,
    what: str = "this run",
    eval_batch_size: int = 0,
    force_flag: bool = True,
    loading: bool = False,
) -> MemoryEstimate:
    """The estimate; raises InsufficientMemoryError when it exceeds available memory (unless force).

    With ``eval_batch_size`` (training only) the estimate also covers the run's evaluations;
    ``force_flag`` says whether the message may suggest ``--force`` (the command has one);
    ``loading``: the weights come from a file (``estimate_memory``).
    """
    if training and eval_batch_size:
        estimate = estimate_training_memory(config, batch_size, eval_batch_size, seq_len)
    else:
        estimate = estimate_memory(config, batch_size, seq_len, training, loading=loading)
    available = available_memory()
    if not force and available is not None and estimate.total > available[0]:
        T = config.max_seq_len if seq_len is None else seq_len
        raise InsufficientMemoryError(
            f"not enough memory: {what} ({'training' if training else 'inference'}, batch {batch_size} x "
            f"{T} tokens) needs about {estimate.describe()} but {format_bytes(available[0])} is available "
            f"({available[1]}); use a smaller config or batch" + (", or pass --force to try anyway"
                                                                  if force_flag else "")
        )
    return estimate


def check_total_memory(models: list[tuple[str, ModelConfig, bool]], what: str, hint: str) -> None:
    """InsufficientMemoryError when the models, held all at once (inference, one sequence each), need
    more than is available: checked before any of them is built or read. Each entry is (its label, its
    config, whether its weights are read from a file); the message names the total, each model's share
    and what is available, in one line."""
    shares = {label: estimate_memory(c, 1, training=False).total for label, c, _ in models}
    # The models are read one at a time: a file's second copy of the weights (estimate_memory's loading
    # term) is held only while that model is read, so the peak is all the models plus the largest copy.
    copies = {label: estimate_memory(c, 1, training=False, loading=True).total - shares[label]
              for label, c, from_file in models if from_file}
    largest = max(copies, key=copies.__getitem__, default=None)
    needed = sum(shares.values()) + (copies[largest] if largest is not None else 0)
    available = available_memory()
    if available is None or needed <= available[0]:
        return
    each = ", ".join(f"{label} {format_bytes(share)}" for label, share in shares.items())
    if largest is not None:
        each += f"; reading {largest}'s weights holds a second copy, {format_bytes(copies[largest])}"
    raise InsufficientMemoryError(
        f"not enough memory: {what} need about {format_bytes(needed)} in total ({each}) but "
        f"{format_bytes(available[0])} is available ({available[1]}); {hint}"
    )


def check_data_memory(needed: int, what: str, hint: str) -> None:
    """InsufficientMemoryError when ``needed`` bytes of task data (an estimate, before anything is
    generated or read) exceed the available memory; the message names ``what`` and the ``hint``."""
    available = available_memory()
    if available is not None and needed > available[0]:
        raise InsufficientMemoryError(
            f"not enough memory: {what} needs about {format_bytes(needed)} to build its data but "
            f"{format_bytes(available[0])} is available ({available[1]}); {hint}"
        )
