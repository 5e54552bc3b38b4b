"""What page faults do to `blocklab bench`'s comparison: the same rounds with glibc's default
allocator settings and with settings under which freed memory stays with the process.

A CPU training step allocates its activations and gradients afresh. glibc's malloc gives large
freed blocks back to the kernel (munmap, or trimming the top of the heap), so the next step writes
to new pages, and every first write to a page is a minor page fault: the kernel maps and zeroes
it. Which block pays for them depends on how many large blocks it allocates and in what order, so
they are part of what the bench compares. Two settings, each in its own processes (glibc reads them
at start-up):

    default   glibc's own (its mmap threshold rises to the largest mmapped block freed, up to
              32 MiB on 64-bit, and its trim threshold to twice that)
    reuse     MALLOC_MMAP_THRESHOLD_=1 GiB, MALLOC_TRIM_THRESHOLD_=4 GiB: nothing freed goes back
              to the kernel, so after the first steps a step faults on (almost) no page

Processes alternate (default, reuse, reuse, default, ...) so a drift of the machine hits both
settings alike. Each times every block in interleaved rounds as `blocklab bench` does
(``blocklab.bench.runner.compare``, bench shape), then counts each block's minor page faults per step; the
ratios pool the rounds of a setting's processes: the median within-round ratio with its 95%
bootstrap interval, and each block's step over its floor (linear FLOPs at the round's matmul rate
plus SDPA alone, as in the bench).

    .venv/bin/python benchmarks/page_faults.py [--processes 3] [--rounds 12] [--peers hf-gpt2,torch-pre]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
from dataclasses import asdict
from typing import Any

import torch

from blocklab.bench.blocks import build_candidates, make_input, train_step
from blocklab.bench.report import ratio_text, shape_text
from blocklab.bench.runner import BOOTSTRAP, PEERS, VARIANTS, Shape, compare, speed_ratios
from blocklab.bench.stats import within_round_ratios

SETTINGS: dict[str, dict[str, str]] = {
    "default": {},
    "reuse": {"MALLOC_MMAP_THRESHOLD_": str(2**30), "MALLOC_TRIM_THRESHOLD_": str(2**32)},
}
FAULT_STEPS = 3  # steps whose faults are counted, after two that warm the block up


def faults_per_step(peers: list[str]) -> dict[str, float]:
    """Each block's minor page faults per forward + backward step at the bench shape."""
    shape = Shape()
    candidates, _ = build_candidates(shape, peers)
    x, g = make_input(shape)
    faults: dict[str, float] = {}
    for c in candidates:
        for _ in range(2):
            train_step(c, x, g)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(FAULT_STEPS):
            train_step(c, x, g)
        faults[c.name] = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / FAULT_STEPS
    return faults


def worker(rounds: int, peers: list[str]) -> None:
    """One process: the bench's rounds, then each block's faults per step with the allocator as the
    rounds left it (its steady state); JSON on stdout."""
    result = compare(Shape(), rounds=rounds, peers=peers, memory=False)
    faults = faults_per_step(peers)
    print(json.dumps({"faults": faults, "seconds": result["seconds_per_round"],
                      "floors": result["floor_seconds_per_round"]}))


def run_process(setting: str, rounds: int, peers: list[str]) -> dict[str, Any]:
    env = {**os.environ, **SETTINGS[setting]}
    for name in {n for s in SETTINGS.values() for n in s} - set(SETTINGS[setting]):
        env.pop(name, None)  # "default" means glibc's own, whatever this shell sets
    command = [sys.executable, __file__, "--worker", "--rounds", str(rounds), "--peers", ",".join(peers)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"page_faults.py: the {setting} worker failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=3, help="processes per setting (default 3)")
    parser.add_argument("--rounds", type=int, default=12, help="interleaved rounds per process (default 12)")
    parser.add_argument("--peers", default="hf-gpt2,hf-bert,torch-pre",
                        help=f"comma-separated, from: {', '.join(PEERS)} (default hf-gpt2,hf-bert,torch-pre)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    peers = args.peers.split(",")
    if unknown := [p for p in peers if p not in PEERS]:
        parser.error(f"--peers: unknown {', '.join(unknown)}; allowed: {', '.join(PEERS)}")
    if args.processes < 1 or args.rounds < 1:
        parser.error("--processes and --rounds must be at least 1")
    if args.worker:
        worker(args.rounds, peers)
        return
    if platform.libc_ver()[0] != "glibc":
        raise SystemExit("page_faults.py: the settings compared are glibc's malloc tunables; this Python "
                         f"runs on {platform.libc_ver()[0] or 'another C library'}")

    load = os.getloadavg()[0]
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SETTINGS}
    both = list(SETTINGS)
    order = [s for i in range(args.processes) for s in (both if i % 2 == 0 else both[::-1])]
    for i, setting in enumerate(order, 1):
        runs[setting].append(run_process(setting, args.rounds, peers))
        if sys.stderr.isatty():  # progress on a terminal; a record (docgen) keeps only the results
            print(f"  process {i} of {len(order)} ({setting}) done", file=sys.stderr, flush=True)

    candidates, _ = build_candidates(Shape(), peers)  # names, kinds and causal twins, as the workers had
    names = [c.name for c in candidates]
    pooled = {s: {n: [t for r in runs[s] for t in r["seconds"][n]] for n in names} for s in SETTINGS}
    floors = {s: {n: [t for r in runs[s] for t in r["floors"][n]] for n in names} for s in SETTINGS}
    rounds = args.processes * args.rounds
    print(f"bench shape ({shape_text(asdict(Shape()))}), forward + backward; "
          f"{args.processes} processes per setting x {args.rounds} interleaved rounds = {rounds} rounds "
          f"each; {torch.get_num_threads()} threads; load average {load:.2f} at the start, "
          f"{os.getloadavg()[0]:.2f} at the end")
    reuse = " ".join(f"{k}={v}" for k, v in SETTINGS["reuse"].items())
    print(f"settings: default = glibc's own; reuse = {reuse}")
    print(f"\n{'block':24s} {'page faults / step':>22s} {'step over its floor':>24s}")
    print(f"{'':24s} {'default':>10s} {'reuse':>11s} {'default':>12s} {'reuse':>11s}")
    for n in names:
        fault = [statistics.median(r["faults"][n] for r in runs[s]) for s in SETTINGS]
        over = [statistics.median(within_round_ratios(pooled[s][n], floors[s][n])) for s in SETTINGS]
        print(f"{n:24s} {fault[0]:>10,.0f} {fault[1]:>11,.0f} {over[0]:>11.3f}x {over[1]:>10.3f}x")
    ratios = {s: speed_ratios(candidates, pooled[s], VARIANTS, BOOTSTRAP) for s in SETTINGS}
    print("\nspeed ratio: the block's step time over the variant's in the same round (> 1: the variant is "
          "faster), causal blocks against the variant's causal twin; median [95% interval]")
    print(f"{'variant':16s} {'block':18s} {'default':>22s} {'reuse':>22s}")
    for variant, blocks in ratios["default"].items():
        for block in blocks:
            cells = [ratios[s][variant][block] for s in SETTINGS]
            print(f"{variant:16s} {block:18s} " + " ".join(f"{ratio_text(r):>22s}" for r in cells))


if __name__ == "__main__":
    main()
