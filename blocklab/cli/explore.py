"""``blocklab explore``: serve the live page (blocklab/explore) over the models the flags name.

The models are built here, once, as ``blocklab trace`` builds them (``--model`` through ``blocklab.load``,
``--preset`` with the config flags and ``--seed``); the page can choose only among them.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from ..errors import BlocklabWarning, UsageError
from ..inspect.trace.subject import preset_config
from ..nn.config import FIELDS, ModelConfig
from ..nn.presets import PRESETS
from .args import (
    add_command,
    add_config_flags,
    add_model_flag,
    add_seed_flag,
    at_least,
    one_of,
    parse_name,
    parse_path,
    parse_vary,
    set_fields,
)
from .defaults import DEFAULT_PRESET, MAIN_OR_PRESET, NO_MAIN_RUN, default_model
from .trace import Subject, set_file_weights

LOOPBACK = ("127.0.0.1", "localhost", "::1")
# the input the page starts with: the first its tokenizer reads (a task's vocabulary refuses the others)
EXAMPLES = ("The cat sat on the", "Max ( 1 , 6 , 2 )", "<BOS> I like")
IDS_EXAMPLE = "1,2,3,4"
DEFAULT_PORT = 8000


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``explore``."""
    p = add_command(
        sub, "explore",
        "Serve a local web page over the models named here: type an input and every stage's numbers are "
        "traced again as you type (the tracer's numbers and sentences), the block's layout drawn from the "
        "layouts table, next-token probabilities with temperature and top-k, step-by-step generation, a "
        "click to zero a head, an FFN neuron or a sublayer (through the hook API), gradients for a target. "
        "Bound to 127.0.0.1 unless --host says otherwise. Needs the extra: pip install 'blocklab[explore]'.",
    )
    p.add_argument("--preset", dest="presets", action="append", default=[], type=parse_name, metavar="NAME",
                   help="serve this preset, built with --seed and the config flags (repeatable); "
                        + one_of(PRESETS, MAIN_OR_PRESET))
    p.add_argument("--vary", action="append", default=[], metavar="FIELD=V1,V2",
                   help="also serve each preset with this ModelConfig field at each value, the same seed, "
                        "to compare side by side (repeatable: the grid is the product), e.g. "
                        "norm_position=post,pre")
    add_config_flags(p, with_preset=False)
    add_seed_flag(p, "seed the presets' weights are drawn with")
    add_model_flag(p, required=False, what="serve this model (repeatable)", repeatable=True)
    p.add_argument("--weights", type=parse_path, metavar="FILE",
                   help="set each preset's weights from this file (.json or .safetensors) named by stage, as "
                        "'trace --weights' does (docs/tutorial.md)")
    p.add_argument("--host", default="127.0.0.1", metavar="HOST",
                   help="the address to listen on; anything but 127.0.0.1/localhost lets other machines "
                        "use the models (default: 127.0.0.1)")
    p.add_argument("--port", type=at_least(0, 65535), default=DEFAULT_PORT, metavar="N",
                   help=f"the port to listen on; 0: any free one (default: {DEFAULT_PORT})")
    p.add_argument("--open", action="store_true", help="open the page in the default web browser")
    p.set_defaults(func=cmd_explore)


def models_for_args(args: argparse.Namespace) -> dict:
    """The served models by name, built once: each --preset (with the config flags), each --model. Their
    memory is summed from their configs (a --model's from its header or config.json) before any is built."""
    from ..explore.session import Explored
    from ..inspect.trace.subject import preset_subject
    from ..nn.memory import check_total_memory
    from ..weights.load import config_of, locate
    from .trace import model_subject

    # (label, config, whether its weights are read from a file, how it is built)
    planned: list[tuple[str, ModelConfig, bool, Callable[[], Subject]]] = []

    def plan(name: str, config: ModelConfig, from_file: bool, build: Callable[[], Subject]) -> None:
        taken = {label for label, *_ in planned}
        unique, n = name, 2
        while unique in taken:
            unique, n = f"{name} ({n})", n + 1
        planned.append((unique, config, from_file, build))

    named = args.presets or args.models or args.vary or set_fields(args, FIELDS)
    # nothing named: the README's run, else the language model blocklab ships (and a note)
    run, is_main_run = (None, True) if named else default_model()
    for label, name, fields in [] if run else preset_variants(args):
        plan(label, preset_config(name, fields), False, partial(preset_subject, name, args.seed, fields))
    for path in [run] if run else args.models:  # located and sized from the header or config.json
        plan(Path(path).name or path, config_of(locate(path)), True,
             partial(model_subject, path, args.allow_nonfinite))
    counts = [(sum(not f for _, _, f, _ in planned), "preset"), (len(args.models), "--model")]
    what = " and ".join(f"{n} {kind} model{'s' * (n != 1)}" for n, kind in counts if n)
    check_total_memory([(label, config, from_file) for label, config, from_file, _ in planned],
                       f"explore's {what}",
                       "serve fewer (--preset, --vary, --model) or smaller ones")
    served: dict[str, Explored] = {}
    for label, _, from_file, build in planned:
        subject = build()
        if args.weights and not from_file:
            set_file_weights(subject, args.weights)
        subject.notes += [] if is_main_run else [NO_MAIN_RUN]
        served[label] = Explored(label, subject, example(subject))
    return served


def preset_variants(args: argparse.Namespace) -> list[tuple[str, str, dict[str, Any]]]:
    """(label, preset, its fields) for each --preset and each --vary combination of it (the preset as
    built once when a combination leaves it unchanged); UsageError for flags that name no preset field."""
    overrides = set_fields(args, FIELDS)
    presets = args.presets or ([] if args.models else [DEFAULT_PRESET])
    if overrides and not presets:
        raise UsageError(f"config flags ({', '.join(overrides)}) apply to --preset, not to --model")
    grid = parse_vary(args.vary)
    unknown = [f for f in grid if f not in FIELDS]
    if unknown:
        raise UsageError(f"--vary {unknown[0]}: explore varies ModelConfig fields only ({', '.join(FIELDS)})")
    if grid and not presets:
        raise UsageError("--vary builds variants of a --preset; name one")
    variants = []
    for name in presets:
        variants.append((name, name, overrides))
        base = preset_config(name, overrides)
        for values in itertools.product(*grid.values()):
            changed = dict(zip(grid, values, strict=True))
            if all(getattr(base, k) == v for k, v in changed.items()):
                continue  # the preset as built above (a field it leaves at ModelConfig's default too)
            label = " ".join(f"{k}={v}" for k, v in changed.items())
            variants.append((f"{name} {label}", name, {**overrides, **changed}))
    return variants


def example(subject: Subject) -> str:
    """The input the page starts with for ``subject``: the first of ``EXAMPLES`` its tokenizer reads and
    the model takes (ids without a tokenizer)."""
    if subject.tokenizer is None:
        return IDS_EXAMPLE
    for text in EXAMPLES:
        try:
            ids = subject.tokenizer.encode(text)
        except (ValueError, KeyError):
            continue
        if 0 < len(ids) <= subject.model.config.max_seq_len:
            return text
    return ""


def notes_by_model(models: dict) -> dict[str, list[str]]:
    """Each note of the served models -> the models it is about, in the order served."""
    found: dict[str, list[str]] = {}
    for name, explored in models.items():
        for note in explored.subject.notes:
            found.setdefault(note, []).append(name)
    return found


def cmd_explore(args: argparse.Namespace) -> int:
    """Build the models, then serve until Ctrl-C."""
    from ..explore.app import require_server_packages, serve

    require_server_packages()  # before building anything: the one-line install hint
    import torch

    torch.set_num_threads(1)  # one short sequence: a second thread costs more than it brings (cli/trace.py)
    if args.host not in LOOPBACK:
        every = (" and any Host header is accepted (no DNS rebinding check: listen on one address to keep "
                 "it)") if args.host in ("0.0.0.0", "::") else ""
        warnings.warn(f"--host {args.host}: the page and its models are reachable from other machines{every}",
                      BlocklabWarning, stacklevel=1)
    models = models_for_args(args)

    def started(url: str) -> None:
        print(f"blocklab explore: {len(models)} model{'s' * (len(models) != 1)} ({', '.join(models)}) "
              f"at {url}  (Ctrl-C stops)", flush=True)
        for note, names in notes_by_model(models).items():
            print(f"blocklab explore: note ({', '.join(names)}): {note}", flush=True)
        if args.open:
            import webbrowser

            webbrowser.open(url)

    try:
        serve(models, args.host, args.port, started)
    except OSError as error:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {error.strerror or error} "
                         "(another --port, or --port 0 for any free one)") from None
    print("blocklab explore: stopped", file=sys.stderr)
    return 0
