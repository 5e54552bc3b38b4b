"""How `blocklab bench` shows its report: terminal tables (rich) and the sweep plot (matplotlib)."""

from __future__ import annotations

import io
import statistics
from typing import Any

from ..files.folders import write_output_file


def plot_sweeps(report: dict[str, Any], path: str) -> None:
    """Two panels: microseconds per token against seq len and against d_model, with attention's
    share of the FLOPs on a second axis; written to ``path`` (the user's --plot) by the one writer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, xkey, title in (
        (axes[0], "sweep_seq", "seq", "cost per token vs sequence length (d_model 512)"),
        (axes[1], "sweep_d_model", "d_model", "cost per token vs d_model (seq 256, d_ff 4 d_model)"),
    ):
        rows = report[key]
        xs = [r[xkey] for r in rows]
        for name, style, label in (("blocklab", "o-", "blocklab block"), ("torch-pre", "s--", "torch-pre"),
                                   ("attention", "^:", "SDPA alone")):
            ax.plot(xs, [r[f"{name}_us_per_token"] for r in rows], style, label=label)
        share = ax.twinx()
        share.plot(xs, [r["attention_flop_share"] for r in rows], color="grey", alpha=0.6)
        share.set_ylim(0, 1)
        share.set_ylabel("attention share of FLOPs: 4T / (8d + 4 d_ff + 4T)", color="grey", fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(xkey)
        ax.set_ylabel("microseconds per token, forward + backward")
        ax.set_title(title, fontsize=10)
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    write_output_file(path, buffer.getvalue(), flag="--plot")


def _mb(n: float) -> str:
    return f"{n / 2**20:.1f}"


def ratio_text(r: dict[str, Any]) -> str:
    """A ratio summary (``bench.ratio_summary``) as the report prints it: median [low-high]."""
    return f"{r['median']:.3f}x [{r['low']:.3f}-{r['high']:.3f}]"


def shape_text(s: dict[str, Any]) -> str:
    """A bench ``Shape`` (as a dict, ``asdict``) as the report prints it."""
    return (f"d_model {s['d_model']}, {s['n_heads']} heads, d_ff {s['d_ff']}, batch {s['batch']}, "
            f"seq {s['seq']}, {s['dtype']}")


def _label(name: str, row: dict[str, Any]) -> str:
    return name + (" (causal)" if row["causal"] and row["kind"] == "peer" else "")


def _blocks_table(result: dict[str, Any], how: str) -> Any:
    """Every block: tokens/s (median and best round), what it keeps, its share of the matmul rate."""
    from rich.table import Table

    table = Table(title=f"one block, forward + backward, {how}: {shape_text(result['shape'])}; "
                        f"{result['rounds']} interleaved rounds")
    columns = ["block", "tokens/s", "(best)", "saved", "held MB", "peak MB", "of matmul", "over floor"]
    columns += ["compile s"] if result["compiled"] else []
    for col in columns:  # block names whole; headers wrap instead
        table.add_column(col, justify="left" if col == "block" else "right", no_wrap=col == "block")
    for name, row in result["blocks"].items():
        cells = [_label(name, row), f"{row['tokens_per_s_median']:,.0f}",
                 f"{row['tokens_per_s']:,.0f}"]
        if "saved_floats_per_token_per_d" in row:
            cells += [f"{row['saved_floats_per_token_per_d']:.2f} d", _mb(row["held_bytes"]),
                      _mb(row["peak_bytes"])]
        else:
            cells += ["", "", ""]
        cells += [f"{100 * row['fraction_of_matmul']:.0f}%", f"{row['over_floor']:.3f}x"]
        cells += [f"{row['compile_seconds']:.1f}"] if result["compiled"] else []
        table.add_row(*cells)
    return table


def _ratios_table(result: dict[str, Any], confidence: float) -> Any:
    """Each targeted variant's speed ratio to every other block: median [interval] and best rounds."""
    from rich.table import Table

    title = f"speed ratio: median of {result['rounds']} rounds [{100 * confidence:.0f}% interval]"
    table = Table(title=title)
    table.add_column("block")
    for variant in result["ratios"]:
        table.add_column(f"{variant} is", justify="right")
        table.add_column("(best round)", justify="right")
    names = [n for n in result["blocks"] if any(n in r for r in result["ratios"].values())]
    for name in names:
        cells = [_label(name, result["blocks"][name])]
        for ratios in result["ratios"].values():
            r = ratios.get(name)
            cells += [ratio_text(r), f"{r['best_round']:.3f}x"] if r else ["", ""]
        table.add_row(*cells)
    return table


def _noise(result: dict[str, Any]) -> str:
    """The machine's noise during the rounds: load average and matmul rate, lowest to highest."""
    load, rate = result["noise"]["load_average_per_round"], result["noise"]["matmul_gflops_per_round"]
    return (f"noise over the rounds: load average {min(load):.1f}-{max(load):.1f}; matmul rate "
            f"{min(rate):.0f}-{max(rate):.0f} GFLOP/s (median {statistics.median(rate):.0f}, best round "
            f"{max(rate) / min(rate):.2f}x the worst)")


def verdict_line(v: dict[str, Any], confidence: float) -> str:
    """One target's verdict with its numbers: floats kept, the speed interval, the best-round ratio."""
    t, speed = v["target"], v["speed"]
    shown = {"met": "met", "not met": "NOT met"}.get(v["verdict"], v["verdict"])
    return (f"target {v['variant']}: keeps {v['floats_per_d']:.2f} d floats/token (target <= "
            f"{t['floats_per_d']:.2f} d); against the fastest peer, {v['fastest_peer']}, "
            f"{speed['median']:.3f}x (median of {v['rounds']} rounds; {100 * confidence:.0f}% interval "
            f"{speed['low']:.3f}-{speed['high']:.3f}; target >= {t['speed']:.2f}x; best rounds "
            f"{speed['best_round']:.3f}x): {shown}; {_at_floor(v, confidence)}")


def _at_floor(v: dict[str, Any], confidence: float) -> str:
    """The verdict's floor test: what the variant would show at its floor, and whether that reaches
    the target."""
    f = v["at_floor"]
    reach = {"met": "the floor allows the target",
             "not met": "out of reach on this machine, even at the floor"}.get(f["verdict"], f["verdict"])
    return (f"at its floor it would be {f['median']:.3f}x ({100 * confidence:.0f}% interval "
            f"{f['low']:.3f}-{f['high']:.3f}): {reach}")


def print_report(report: dict[str, Any]) -> None:
    """The report as terminal tables."""
    from rich.console import Console

    console = Console(width=max(100, Console().width))
    stats = report["statistics"]
    for key, how in (("compare", "eager"), ("compile", "torch.compile")):
        if key in report:
            _print_comparison(console, report[key], how, stats["confidence"])
    console.print(f"ratios: the median over rounds of the within-round ratio; intervals: percentile "
                  f"bootstrap of that median ({100 * stats['confidence']:.0f}%, {stats['resamples']:,} "
                  f"resamples of the rounds, seed {stats['seed']}); a speed verdict needs >= "
                  f"{stats['min_rounds_for_verdict']} rounds and an interval on one side of the target")
    if report["quick"]:
        console.print(f"quick: {report['compare']['rounds']} rounds and fewer sweep points (a full run: "
                      f"`blocklab bench`)", style="bold")
    for v in report["verdicts"]:
        console.print(verdict_line(v, stats["confidence"]))
    for table in _memory_and_sweep_tables(report):
        console.print(table)
    m = report["machine"]
    console.print(f"torch {m['torch']}, {m['threads']} threads on {m['cpus']} CPUs; load average "
                  f"{m['load_average_at_start']:.1f} at the start, {m['load_average_at_end']:.1f} at the end")
    if "plot" in report:
        console.print(f"plot: {report['plot']}")


def _print_comparison(console: Any, result: dict[str, Any], how: str, confidence: float) -> None:
    """One side-by-side comparison (eager or compiled): the blocks, the ratios, the matmul rate, the noise."""
    console.print(_blocks_table(result, how))
    for name, row in result["blocks"].items():
        console.print(f"  {name}: {row['note']}", style="dim")
    console.print(_ratios_table(result, confidence))
    console.print("  a ratio: the block's step time over the variant's in the same round (> 1: the "
                  "variant is faster); causal blocks against the variant's causal twin", style="dim")
    s = result["shape"]
    skipped = "; ".join(f"{k}: {v}" for k, v in result["skipped"].items())
    console.print(f"matmul rate {result['matmul_gflops']:.1f} GFLOP/s in its best round: "
                  f"({s['batch'] * s['seq']} x {s['d_model']}) @ ({s['d_model']} x {s['d_ff']}), in the "
                  "same rounds"
                  + (f"; skipped {skipped}" if skipped else ""))
    console.print(_noise(result))
    console.print("floor: a block's linear-layer FLOPs (and what it recomputes) at the round's matmul "
                  "rate, plus SDPA alone timed in the same round; norms, activations, residual adds, "
                  "allocation and Python cost nothing in it. \"over floor\": the median over rounds of "
                  "step / floor", style="dim")


def _memory_and_sweep_tables(report: dict[str, Any]) -> list[Any]:
    """What each variant keeps for backward, the depth stack's memory, and the two sweeps (rich Tables)."""
    from rich.table import Table

    tables = []
    for variant, rows in report["accounting"].items():
        table = Table(title=f"what {variant} keeps for backward, one row per storage")
        for col in ("shape", "dtype", "floats/token", "saved by (autograd nodes)"):
            table.add_column(col, justify="right" if col == "floats/token" else "left")
        for row in rows:
            table.add_row("x".join(map(str, row["shape"])), row["dtype"], f"{row['floats_per_token']:.0f}",
                          ", ".join(name.removesuffix("Backward") for name in row["saved_by"]))
        table.add_row("total", "", f"{sum(r['floats_per_token'] for r in rows):.0f}", "")
        tables.append(table)
    depth_shape = report["plan"]["depth_shape"]
    table = Table(title=f"a stack of pre-norm blocks, d_model {depth_shape['d_model']}, seq "
                        f"{depth_shape['seq']}, batch {depth_shape['batch']}: MB after forward / peak")
    for col in ("depth", "plain", "checkpoint_blocks"):
        table.add_column(col, justify="right")
    for row in report["depth"]:
        table.add_row(str(row["depth"]), f"{_mb(row['plain_held_bytes'])} / {_mb(row['plain_peak_bytes'])}",
                      f"{_mb(row['checkpointed_held_bytes'])} / {_mb(row['checkpointed_peak_bytes'])}")
    tables.append(table)
    for key, label in (("sweep_seq", "seq"), ("sweep_d_model", "d_model")):
        table = Table(title=f"microseconds per token, forward + backward, best round, against {label}")
        for col in (label, "batch", "blocklab", "torch-pre", "SDPA alone", "attention share of FLOPs"):
            table.add_column(col, justify="right")
        for row in report[key]:
            table.add_row(str(row[label]), str(row["batch"]), f"{row['blocklab_us_per_token']:.1f}",
                          f"{row['torch-pre_us_per_token']:.1f}", f"{row['attention_us_per_token']:.1f}",
                          f"{100 * row['attention_flop_share']:.0f}%")
        tables.append(table)
    return tables
