"""How fast ``blocklab explore`` answers a keystroke: the page's requests for one new input, timed.

When the input changes the page asks ``/api/trace`` for the stages of the group on screen (a block,
the input, or what follows the blocks) and then ``/api/predict`` for the next-token bars. This script
sends exactly those requests to the app (Starlette's TestClient: the request parsing, the model under
its lock, the JSON both ways; no socket) for listops-seed and a GPT-2-small-shaped preset (``gpt2``: 12
blocks, d_model 768, vocabulary 50257; weights drawn with seed 0, inputs as ids), and prints the median
and 90th percentile over the rounds, one thread as the server runs. The issue's targets: under 100 ms
for listops, under 1 s for the GPT-2 shape. The whole trace (every stage at once, what ``blocklab trace
--json`` writes) is timed too, for scale: the page never asks for it.

    .venv/bin/python benchmarks/explore_latency.py [--rounds 20] [--tokens 8] [--models listops-seed,gpt2]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

warnings.filterwarnings("ignore", message="Using `httpx` with")  # Starlette's TestClient on this httpx
from starlette.testclient import TestClient  # noqa: E402

from blocklab.cli.trace import preset_subject  # noqa: E402
from blocklab.explore.app import create_app  # noqa: E402
from blocklab.explore.session import Explored  # noqa: E402
from blocklab.inspect.trace.collect import NORM_OWN_SUFFIXES  # noqa: E402

TARGET_MS = {"listops-seed": 100.0, "gpt2": 1000.0}
INPUTS = {"listops-seed": ["Max ( 1 , 6 , 2 )", "Min ( 3 , 9 , 4 )", "First ( 7 , 2 , 5 )"]}


def timed(call, rounds: int) -> list[float]:
    """Milliseconds of each of ``rounds`` calls (one warm-up call first)."""
    call()
    out = []
    for _ in range(rounds):
        started = time.perf_counter()
        call()
        out.append(1000 * (time.perf_counter() - started))
    return out


def body(name: str, entry: Explored, i: int, tokens: int) -> dict:
    if entry.subject.tokenizer is not None:
        return {"model": name, "input": INPUTS[name][i % len(INPUTS[name])]}
    V = entry.subject.model.config.vocab_size
    return {"model": name, "tokens": [(97 * (j + i) + 13) % V for j in range(tokens)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="timed requests per row (default: 20)")
    parser.add_argument("--tokens", type=int, default=8, help="input length for the GPT-2 shape (default: 8)")
    parser.add_argument("--models", default=",".join(TARGET_MS),
                        help=f"which of {', '.join(TARGET_MS)} (default: both)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as blocklab explore runs
    print(f"{'model':<14}{'request (the page on a new input)':<44}{'median':>10}{'p90':>10}  target")
    for name in args.models.split(","):
        entry = Explored(name, preset_subject(name, 0, {}))
        client = TestClient(create_app({name: entry}))
        stages = [n for n in entry.subject.model.hook_names() if n.startswith("blocks.0.")
                  and not n.endswith(NORM_OWN_SUFFIXES)]  # a norm's own stages: the tracer shows them with it
        rounds, n = args.rounds, {"i": 0}

        def ask(action: str, **extra: object) -> None:
            n["i"] += 1  # a different input each time, as when typing
            answer = client.post(f"/api/{action}", json={**body(name, entry, n["i"], args.tokens), **extra})
            answer.raise_for_status()

        rows = [
            ("trace: block 0's stages", lambda: ask("trace", stages=stages), rounds),
            ("predict: next-token bars", lambda: ask("predict"), rounds),
            ("both (a keystroke)", lambda: (ask("trace", stages=stages), ask("predict")), rounds),
            ("whole trace, every stage (never asked)", lambda: ask("trace"), max(2, rounds // 10)),
        ]
        for label, call, k in rows:
            ms = timed(call, k)
            verdict = ""
            if label.startswith("both"):
                median = statistics.median(ms)
                verdict = f"< {TARGET_MS[name]:.0f} ms: {'met' if median < TARGET_MS[name] else 'NOT met'}"
            p90 = statistics.quantiles(ms, n=10)[-1] if len(ms) >= 2 else ms[0]
            print(f"{name:<14}{label:<44}{statistics.median(ms):>7.0f} ms{p90:>7.0f} ms  {verdict}")


if __name__ == "__main__":
    main()
