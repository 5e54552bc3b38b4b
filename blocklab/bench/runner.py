"""`blocklab bench`: one transformer block against its peers, measured in one run on this machine.

For blocklab's variants and every installed peer (``VARIANTS`` and ``PEERS``, in ``bench/blocks.py``),
built with equal shapes (default: d_model 512, 8 heads, d_ff 2048, batch 8, seq 256, float32, biases,
exact GELU):

- step time: one forward + backward, in interleaved rounds (every block once per round, the order
  rotating so no block always runs first), together with the block's largest matmul, whose rate in
  each round shows how much the machine's speed moved. Other load hits all blocks of a round alike,
  so speed is compared within a round: a variant's ratio to a block is the median over rounds of
  (the block's step time / the variant's), with a percentile bootstrap interval of that median
  (``measure.Bootstrap``: 95%, 10,000 resamples, seed 0). Each block's best round (other load only
  ever adds time) is kept as a secondary figure.
- saved activations: the bytes autograd keeps for backward after one forward, captured with
  ``torch.autograd.graph.saved_tensors_hooks``. Each saved tensor is mapped to its storage and
  every storage counts once, whole (a view keeps all of its storage alive). Storages of parameters
  and buffers are excluded: they are not activations. The block's input counts: in a stack it is
  the previous block's output, kept alive only because this block saved it.
- peak: the most bytes held at once by tensors created during one step (activations, saved
  tensors, temporaries, gradients), tracked op by op with a dispatch mode; parameters and the
  input batch excluded.
- FLOPs: model FLOPs counted analytically (``block_flops``), the same for every block, against the
  machine's matmul rate, measured in the same rounds on the block's largest matmul.
- floor: what a block's step would take if only its matmuls and its attention core cost time: its
  linear layers' FLOPs (plus what it recomputes, ``Candidate.recomputed_flops``) at the matmul
  rate of the round, plus SDPA alone (forward + backward, timed in the same round). Norms,
  activations, residual adds, allocation and Python cost nothing in it. A block's step over its
  floor is its overhead; a peer's step over a variant's floor is the most that variant could show
  against that peer on this machine.
- verdict: each variant with a ``Target`` is checked against the fastest peer (the one its median
  ratio is lowest against): ``met`` when it keeps at most the target's floats per token and the
  whole speed interval is at or above the target, ``not met`` when it keeps more or the whole
  interval is below, otherwise undecided (too few rounds, or the interval straddles the target).
  Beside it, the same test on the ratio the variant would show at its floor: a target not met
  even there is out of reach on this machine, whatever the code does.

``run_bench`` returns the whole report as one JSON-ready dict, laid out as ``schema.json``
(``format`` "blocklab-bench", ``version`` 3) describes.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from typing import Any

import torch
from torch import nn

from ..nn.block import TransformerBlock
from .blocks import (
    PEERS,
    VARIANTS,
    Candidate,
    Shape,
    Target,
    Variant,
    attention_probe,
    block_flops,
    blocklab_candidate,
    build_candidates,
    linear_flops,
    make_input,
    matmul_probe,
    train_step,
)
from .footprint import saved_activations, saved_by, step_memory
from .stats import NOT_MET, Bootstrap, decide, time_rounds, within_round_ratios

FORMAT, VERSION = "blocklab-bench", 3  # the JSON layout: schema.json
BOOTSTRAP = Bootstrap()  # 95%, 10,000 resamples, seed 0
ATTENTION_PROBES = {False: "attention", True: "attention-causal"}  # SDPA alone, timed in the rounds

# ---- the comparison at one shape ---------------------------------------------------------------


def _memory_row(c: Candidate, x: torch.Tensor, shape: Shape) -> dict[str, float]:
    """What a block keeps for backward (per token, and per token and d_model in floats), and the bytes
    held after forward and at the peak of a step, on input ``x`` (batch, seq, d_model)."""
    saved, _ = saved_activations(c.module, c.run, x)
    held, peak = step_memory(c.module, c.run, x)
    return {"saved_bytes_per_token": saved.nbytes / shape.tokens,
            "saved_floats_per_token_per_d": saved.nbytes / shape.tokens / x.element_size() / shape.d_model,
            "held_bytes": held, "peak_bytes": peak}


def compare(
    shape: Shape, rounds: int = 5, min_seconds: float = 0.0, peers: Sequence[str] = tuple(PEERS),
    compile: bool = False, memory: bool = True, variants: Sequence[Variant] = VARIANTS,
    bootstrap: Bootstrap = BOOTSTRAP,
) -> dict[str, Any]:
    """Every block at ``shape``: tokens/s, saved bytes, peak, FLOP rate; each targeted variant's
    speed ratio to every other block; the raw seconds of every round and the machine's noise.

    Tokens/s is given from each block's best round (``tokens_per_s``; other processes only ever
    add time) and as the median over rounds (``tokens_per_s_median``).
    """
    candidates, skipped = build_candidates(shape, peers, variants)
    x, g = make_input(shape)
    rows: dict[str, dict[str, Any]] = {
        c.name: {"kind": c.kind, "note": c.note, "causal": c.causal} for c in candidates
    }
    for c in candidates if memory else ():
        rows[c.name].update(_memory_row(c, x, shape))
    for c in candidates if compile else ():
        c.run = torch.compile(c.run)
        t0 = time.perf_counter()
        train_step(c, x, g)  # compiles forward and backward
        rows[c.name]["compile_seconds"] = time.perf_counter() - t0
    matmul, matmul_flops = matmul_probe(shape)
    steps: dict[str, Callable[[], None]] = {c.name: (lambda c=c: train_step(c, x, g)) for c in candidates}
    steps["matmul"] = matmul
    causal_kinds = sorted({c.causal for c in candidates})
    for causal in causal_kinds:
        steps[ATTENTION_PROBES[causal]] = attention_probe(shape, causal)
    load: list[float] = []
    times = time_rounds(steps, rounds, min_seconds, warmup=2 if compile else 1,
                        before_round=lambda: load.append(os.getloadavg()[0]))
    probes = {name: times.pop(name) for name in ["matmul", *(ATTENTION_PROBES[c] for c in causal_kinds)]}
    matmul_times = probes["matmul"]
    best_rate = matmul_flops / min(matmul_times)  # FLOP/s
    floors = {c.name: floor_seconds(shape, c, matmul_flops, matmul_times, probes[ATTENTION_PROBES[c.causal]])
              for c in candidates}
    for c in candidates:
        t = times[c.name]
        rows[c.name].update(
            step_ms=1e3 * min(t), step_ms_median=1e3 * statistics.median(t),
            tokens_per_s=shape.tokens / min(t),
            tokens_per_s_median=statistics.median(shape.tokens / s for s in t),
            fraction_of_matmul=block_flops(shape, c.causal, c.gated) / min(t) / best_rate,
            floor_ms=1e3 * statistics.median(floors[c.name]),
            over_floor=statistics.median(within_round_ratios(t, floors[c.name])),
        )
    return {
        "shape": asdict(shape), "rounds": rounds, "compiled": compile,
        "matmul_gflops": best_rate / 1e9,
        "noise": {"load_average_per_round": load,
                  "matmul_gflops_per_round": [matmul_flops / t / 1e9 for t in matmul_times]},
        "blocks": rows, "ratios": speed_ratios(candidates, times, variants, bootstrap),
        "seconds_per_round": {**times, **probes}, "floor_seconds_per_round": floors, "skipped": skipped,
    }


def floor_seconds(
    shape: Shape, candidate: Candidate, matmul_flops: float, matmul_times: Sequence[float],
    attention_times: Sequence[float],
) -> list[float]:
    """The candidate's floor in each round: its linear layers' FLOPs and what it recomputes, at that
    round's matmul rate, plus that round's SDPA alone (see the module docstring)."""
    flops = linear_flops(shape, candidate.gated) + candidate.recomputed_flops
    return [flops * t_matmul / matmul_flops + t_attention
            for t_matmul, t_attention in zip(matmul_times, attention_times, strict=True)]


def speed_ratios(
    candidates: Sequence[Candidate], times: dict[str, list[float]], variants: Sequence[Variant],
    bootstrap: Bootstrap,
) -> dict[str, dict[str, dict[str, Any]]]:
    """{variant: {block: ratio}} for each variant with a target, against every block but its own:
    the block's step time over the variant's within each round (> 1: the variant is faster),
    against the variant's causal twin when the block is causal. A ratio has its median over rounds,
    the bootstrap interval of that median (low, high) and the ratio of best rounds."""
    ratios: dict[str, dict[str, dict[str, Any]]] = {}
    for v in (v for v in variants if v.target):
        own = {c.causal: c.name for c in candidates if c.variant == v.name}
        ratios[v.name] = {}
        for c in candidates:
            if c.variant == v.name or c.kind == "causal twin":
                continue
            base = own[c.causal]
            ratios[v.name][c.name] = {
                "against": base, **ratio_summary(times[c.name], times[base], bootstrap),
                "best_round": min(times[c.name]) / min(times[base]),
            }
    return ratios


def ratio_summary(num: Sequence[float], den: Sequence[float], bootstrap: Bootstrap) -> dict[str, float]:
    """The within-round ratios num[r] / den[r]: their median and its bootstrap interval (low, high)."""
    per_round = within_round_ratios(num, den)
    low, high = bootstrap.interval(per_round)
    return {"median": statistics.median(per_round), "low": low, "high": high}


MIN_ROUNDS_FOR_VERDICT = 10
TOO_FEW_ROUNDS = "too few rounds to decide"


def target_verdict(floats_per_d: float, low: float, high: float, rounds: int, target: Target) -> str:
    """``met`` / ``not met`` / why undecided, for a variant keeping ``floats_per_d`` whose speed
    interval against the fastest peer is (low, high) over ``rounds`` rounds.

    The floats are counted exactly: over the limit is ``not met`` whatever the speed. The speed is
    decided only from at least ``MIN_ROUNDS_FOR_VERDICT`` rounds, and only when the whole interval
    lies on one side of the target.
    """
    if floats_per_d > target.floats_per_d:
        return NOT_MET
    if rounds < MIN_ROUNDS_FOR_VERDICT:
        return TOO_FEW_ROUNDS
    return decide(low, high, target.speed)


def verdicts(
    compared: dict[str, Any], variants: Sequence[Variant] = VARIANTS, bootstrap: Bootstrap = BOOTSTRAP
) -> list[dict[str, Any]]:
    """Each variant's target checked on one comparison (with memory measured): what it keeps, and
    its speed against the fastest peer, the one its median ratio is lowest against; and the same
    speed test on the ratio it would show at its floor (``at_floor``: the peer's step over the
    variant's floor, round by round)."""
    out = []
    for v in variants:
        if v.target is None:
            continue
        ratios = compared["ratios"][v.name]
        peers = {k: r for k, r in ratios.items() if compared["blocks"][k]["kind"] == "peer"}
        fastest = min(peers, key=lambda k: peers[k]["median"])
        speed, floats = peers[fastest], compared["blocks"][v.name]["saved_floats_per_token_per_d"]
        own = speed["against"]  # the variant, or its causal twin against a causal peer
        at_floor = ratio_summary(compared["seconds_per_round"][fastest],
                                 compared["floor_seconds_per_round"][own], bootstrap)
        out.append({
            "variant": v.name, "target": asdict(v.target), "floats_per_d": floats, "fastest_peer": fastest,
            "speed": speed, "rounds": compared["rounds"],
            "verdict": target_verdict(floats, speed["low"], speed["high"], compared["rounds"], v.target),
            "at_floor": {**at_floor, "against": own,
                         "verdict": target_verdict(floats, at_floor["low"], at_floor["high"],
                                                   compared["rounds"], v.target)},
        })
    return out


def accounting(shape: Shape, **config: Any) -> list[dict[str, Any]]:
    """blocklab's saved tensors one by one: shape, floats per token, the autograd nodes saving it."""
    c = blocklab_candidate(shape, **config)
    c.module.to(shape.torch_dtype)
    x, _ = make_input(shape)
    saved, out = saved_activations(c.module, c.run, x)
    nodes = saved_by(out)
    return [
        {"shape": list(tensor_shape), "dtype": dtype, "saved_by": sorted(set(nodes.get(key, []))),
         "floats_per_token": nbytes / x.element_size() / shape.tokens}
        for key, (nbytes, tensor_shape, dtype) in saved.storages.items()
    ]


# ---- sweeps and depth -------------------------------------------------------------------------


def attention_flop_share(shape: Shape) -> float:
    """Attention's share of the block's model FLOPs: 4T / (8d + 4 d_ff + 4T)."""
    return 4 * shape.seq / (2 * (4 * shape.d_model + 2 * shape.d_ff) + 4 * shape.seq)


def sweep(shapes: Sequence[Shape], rounds: int, min_seconds: float, peer: str = "torch-pre") -> list[dict]:
    """Microseconds per token (forward + backward, best round) of blocklab, one peer and SDPA alone."""
    rows = []
    for shape in shapes:
        torch.manual_seed(0)
        candidates = [blocklab_candidate(shape), PEERS[peer](shape)]
        for c in candidates:
            c.module.to(shape.torch_dtype)
        x, g = make_input(shape)
        steps = {c.name: (lambda c=c: train_step(c, x, g)) for c in candidates}
        steps["attention"] = attention_probe(shape)
        times = time_rounds(steps, rounds, min_seconds)
        row = {"d_model": shape.d_model, "seq": shape.seq, "batch": shape.batch,
               "attention_flop_share": attention_flop_share(shape)}
        for name, t in times.items():
            row[f"{name}_us_per_token"] = 1e6 * min(t) / shape.tokens  # best round, as in compare
        rows.append(row)
    return rows


def seq_shapes(base: Shape, seqs: Sequence[int], tokens: int) -> list[Shape]:
    """``base`` at each sequence length, the batch chosen to keep ``tokens`` per step."""
    return [replace(base, seq=t, batch=max(1, tokens // t)) for t in seqs]


def width_shapes(base: Shape, widths: Sequence[int]) -> list[Shape]:
    """``base`` at each d_model, with d_head 64 (one head below 64) and d_ff = 4 d_model."""
    return [replace(base, d_model=d, n_heads=max(1, d // 64), d_ff=4 * d) for d in widths]


def depth_memory(shape: Shape, depths: Sequence[int]) -> list[dict[str, Any]]:
    """Bytes held after the forward and peak bytes of one step through a stack of pre-norm blocks,
    plain and with ``checkpoint_blocks`` (which keeps only each block's input)."""
    rows = []
    for n in depths:
        row: dict[str, Any] = {"depth": n}
        for label, ckpt in (("plain", False), ("checkpointed", True)):
            torch.manual_seed(0)
            config = blocklab_candidate(shape, checkpoint_blocks=ckpt).module.config
            stack = nn.Sequential(*(TransformerBlock(config) for _ in range(n))).to(shape.torch_dtype)
            x, _ = make_input(shape)
            row[f"{label}_held_bytes"], row[f"{label}_peak_bytes"] = step_memory(stack, stack, x)
        rows.append(row)
    return rows


# ---- the whole run ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """How much one `blocklab bench` run measures: the comparison's rounds, the sweeps, the depths."""

    name: str
    rounds: int  # interleaved rounds of the comparison (every block once per round)
    min_seconds: float  # a block repeats within its round until this much time passed (0: once)
    seqs: tuple[int, ...]  # sequence lengths of the seq sweep, at sweep_tokens tokens per step
    sweep_tokens: int
    widths: tuple[int, ...]  # d_model of the width sweep, at width_batch sequences per step
    width_batch: int
    sweep_rounds: int
    sweep_min_seconds: float
    depths: tuple[int, ...]  # stacks of depth_shape blocks, plain and checkpointed
    compile_rounds: int = 3
    shape: Shape = field(default_factory=Shape)
    depth_shape: Shape = field(default_factory=lambda: Shape(d_model=256, n_heads=4, d_ff=1024, batch=4,
                                                             seq=128))

    def __post_init__(self) -> None:
        for name in ("rounds", "sweep_rounds", "compile_rounds", "sweep_tokens", "width_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"Plan.{name}={getattr(self, name)} must be at least 1")
        for name in ("min_seconds", "sweep_min_seconds"):
            if getattr(self, name) < 0:
                raise ValueError(f"Plan.{name}={getattr(self, name)} must be >= 0")


FULL = Plan("full", rounds=30, min_seconds=0.0, seqs=(64, 128, 256, 512, 1024, 2048), sweep_tokens=2048,
            widths=(64, 128, 256, 512, 1024), width_batch=8, sweep_rounds=3, sweep_min_seconds=0.2,
            depths=(1, 2, 4, 8))
QUICK = Plan("quick", rounds=12, min_seconds=0.0, seqs=(64, 256, 1024), sweep_tokens=1024,
             widths=(64, 256, 1024), width_batch=2, sweep_rounds=2, sweep_min_seconds=0.0, depths=(1, 4))


def schema() -> dict[str, Any]:
    """The JSON schema of a bench report (``schema.json``)."""
    return json.loads(resources.files(__package__).joinpath("schema.json").read_text())


def run_bench(
    quick: bool = False, compile: bool = False, dtype: str = "float32", plot: str | None = None,
    rounds: int | None = None, plan: Plan | None = None, bootstrap: Bootstrap = BOOTSTRAP,
) -> dict[str, Any]:
    """Everything `blocklab bench` reports, as one JSON-ready dict (``schema.json``).

    ``plan`` defaults to ``QUICK`` or ``FULL``; ``rounds`` overrides its comparison's rounds.
    """
    plan = plan or (QUICK if quick else FULL)
    plan = replace(plan, rounds=rounds) if rounds is not None else plan
    base = replace(plan.shape, dtype=dtype)
    report: dict[str, Any] = {
        "format": FORMAT, "version": VERSION,
        "machine": {"torch": torch.__version__, "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
                    "processor": platform.processor() or platform.machine(),
                    "load_average_at_start": os.getloadavg()[0]},  # other processes competing for the CPUs
        "plan": asdict(plan), "quick": plan.name == "quick",
        "statistics": {"ratio": "median over rounds of the within-round ratio",
                       "interval": "percentile bootstrap of that median, resampling rounds",
                       **asdict(bootstrap), "min_rounds_for_verdict": MIN_ROUNDS_FOR_VERDICT},
    }
    report["compare"] = compare(base, plan.rounds, plan.min_seconds, bootstrap=bootstrap)
    report["verdicts"] = verdicts(report["compare"], bootstrap=bootstrap)
    report["accounting"] = {v.name: accounting(base, **v.config) for v in VARIANTS if v.target}
    if compile:
        targeted = tuple(v for v in VARIANTS if v.target)
        report["compile"] = compare(base, plan.compile_rounds, 0.3, compile=True, memory=False,
                                    peers=("torch-pre",) if quick else tuple(PEERS),
                                    variants=targeted if quick else VARIANTS, bootstrap=bootstrap)
    report["depth"] = depth_memory(replace(plan.depth_shape, dtype=dtype), plan.depths)
    sweep_shapes = seq_shapes(base, plan.seqs, plan.sweep_tokens)
    report["sweep_seq"] = sweep(sweep_shapes, plan.sweep_rounds, plan.sweep_min_seconds)
    wide = width_shapes(replace(base, batch=plan.width_batch), plan.widths)
    report["sweep_d_model"] = sweep(wide, plan.sweep_rounds, plan.sweep_min_seconds)
    report["machine"]["load_average_at_end"] = os.getloadavg()[0]
    if plot:
        from .report import plot_sweeps

        plot_sweeps(report, plot)
        report["plot"] = plot
    return report
