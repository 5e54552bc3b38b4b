"""How `blocklab bench` shows its report: terminal tables (rich) and the sweep plot (matplotlib)."""

from __future__ import annotations

from typing import Any


def plot_sweeps(report: dict[str, Any], path: str) -> None:
    """Two panels: microseconds per token against seq len and against d_model, with attention's
    share of the FLOPs on a second axis."""
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
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _mb(n: float) -> str:
    return f"{n / 2**20:.1f}"


def print_report(report: dict[str, Any]) -> None:
    """The report as terminal tables."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(100, Console().width))
    for key, how in (("compare", "eager"), ("compile", "torch.compile")):
        if key not in report:
            continue
        result, s = report[key], report[key]["shape"]
        table = Table(title=f"one block, forward + backward, {how}: d_model {s['d_model']}, "
                            f"{s['n_heads']} heads, d_ff {s['d_ff']}, batch {s['batch']}, seq {s['seq']}, "
                            f"{s['dtype']}; best of {result['rounds']} interleaved rounds")
        columns = ["block", "tokens/s", "blocklab is", "(median)", "saved/token", "held MB", "peak MB",
                   "of matmul"]
        columns += ["compile s"] if result["compiled"] else []
        for col in columns:
            table.add_column(col, justify="left" if col == "block" else "right")
        for name, row in result["blocks"].items():
            cells = [name + (" (causal)" if row["causal"] else ""), f"{row['tokens_per_s']:,.0f}",
                     f"{row['speedup']:.2f}x", f"{row['speedup_median']:.2f}x"]
            if "saved_floats_per_token_per_d" in row:
                cells += [f"{row['saved_floats_per_token_per_d']:.2f} d", _mb(row["held_bytes"]),
                          _mb(row["peak_bytes"])]
            else:
                cells += ["", "", ""]
            cells += [f"{100 * row['fraction_of_matmul']:.0f}%"]
            cells += [f"{row['compile_seconds']:.1f}"] if result["compiled"] else []
            table.add_row(*cells)
        console.print(table)
        for name, row in result["blocks"].items():
            console.print(f"  {name}: {row['note']}", style="dim")
        skipped = "; ".join(f"{k}: {v}" for k, v in result["skipped"].items())
        console.print(f"matmul rate {result['matmul_gflops']:.1f} GFLOP/s: ({s['batch'] * s['seq']} x "
                      f"{s['d_model']}) @ ({s['d_model']} x {s['d_ff']}), in the same rounds"
                      + (f"; skipped {skipped}" if skipped else ""))
    v = report["verdict"]
    console.print(
        f"target: blocklab keeps {v['saved_floats_per_token_per_d']:.2f} d floats/token "
        f"(limit {v['limit']:.0f} d) at {v['speed_vs_fastest_peer']:.3f}x the fastest peer, "
        f"{v['fastest_peer']} (limit {v['speed_limit']}x; against every peer >= "
        f"{v['slowest_speedup']:.3f}x): {'met' if v['met'] else 'NOT met'}"
    )
    table = Table(title="what blocklab's block keeps for backward, one row per storage")
    for col in ("shape", "dtype", "floats/token", "saved by (autograd nodes)"):
        table.add_column(col, justify="right" if col == "floats/token" else "left")
    for row in report["accounting"]:
        table.add_row("x".join(map(str, row["shape"])), row["dtype"], f"{row['floats_per_token']:.0f}",
                      ", ".join(name.removesuffix("Backward") for name in row["saved_by"]))
    table.add_row("total", "", f"{sum(r['floats_per_token'] for r in report['accounting']):.0f}", "")
    console.print(table)
    table = Table(title="a stack of pre-norm blocks, d_model 256, seq 128, batch 4: MB after forward / peak")
    for col in ("depth", "plain", "checkpoint_blocks"):
        table.add_column(col, justify="right")
    for row in report["depth"]:
        table.add_row(str(row["depth"]), f"{_mb(row['plain_held_bytes'])} / {_mb(row['plain_peak_bytes'])}",
                      f"{_mb(row['checkpointed_held_bytes'])} / {_mb(row['checkpointed_peak_bytes'])}")
    console.print(table)
    for key, label in (("sweep_seq", "seq"), ("sweep_d_model", "d_model")):
        table = Table(title=f"microseconds per token, forward + backward, against {label}")
        for col in (label, "batch", "blocklab", "torch-pre", "SDPA alone", "attention share of FLOPs"):
            table.add_column(col, justify="right")
        for row in report[key]:
            table.add_row(str(row[label]), str(row["batch"]), f"{row['blocklab_us_per_token']:.1f}",
                          f"{row['torch-pre_us_per_token']:.1f}", f"{row['attention_us_per_token']:.1f}",
                          f"{100 * row['attention_flop_share']:.0f}%")
        console.print(table)
    m = report["machine"]
    console.print(f"torch {m['torch']}, {m['threads']} threads on {m['cpus']} CPUs; load average "
                  f"{m['load_average_at_start']:.1f} at the start, {m['load_average_at_end']:.1f} at the end")
    if "plot" in report:
        console.print(f"plot: {report['plot']}")
