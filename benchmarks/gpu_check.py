"""Every GPU figure in one run, for the few minutes a GPU is lent (issue 38 item 6; ``scripts/gpu-check.sh``).

Four parts, each figure a ratio of blocklab against a peer measured in the same run (interleaved rounds,
the device synchronised after every step), printed as one table and written as JSON:

1. **tests**: the test files that exercise a GPU (``CUDA_TESTS``: CUDA and NCCL paths, autocast, flash SDPA;
   they skip cleanly without one), as pytest reports them.
2. **block**: one forward + backward of the block at GPT-2 small's shape (d 768, 12 heads, d_ff 3072, 8 x 1024
   tokens) in bfloat16 with SDPA's flash kernel forced, against ``nn.TransformerEncoderLayer`` and
   ``transformers``' ``GPT2Block`` (the bench's candidates, ``blocklab.bench.blocks``; a causal peer is
   compared with blocklab's causal block).
3. **training**: GPT-2 small's whole training step (bfloat16 autocast, float32 weights, AdamW) against a
   nanoGPT-style plain model on the same tokens (``train_step.py``): tokens/s and model FLOPs utilisation
   against the GPU's dense bfloat16 peak (``PEAK_BF16``, when the GPU is one of those).
4. **generation**: KV-cached greedy generation on GPT-2 small's shape against ``transformers``'
   ``generate``, batch 1 and 8, float32 (``generate.py``), with whether the tokens are the same.

``--device cpu --quick`` runs every part at toy sizes in float32 (CI runs it, so the script cannot rot).

    .venv/bin/python benchmarks/gpu_check.py [--device cuda] [--quick] [--out runs/gpu-check]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import generate as generation
import torch
import train_step as training

from blocklab.bench.blocks import VARIANTS, Shape, build_candidates, make_input, train_step
from blocklab.bench.runner import BOOTSTRAP, speed_ratios
from blocklab.bench.stats import time_rounds
from blocklab.files.jsonfiles import write_json

ROOT = Path(__file__).resolve().parents[1]
CUDA_TESTS = ("tests/test_device.py",)
# Dense bfloat16 tensor-core peaks (FLOP/s) by a word of torch.cuda.get_device_name(): the vendors' sheets.
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 70e12, "L4": 121e12}
SIZES = {  # per part: the full check on a GPU, and --quick's toy sizes
    "block": {False: Shape(768, 12, 3072, batch=8, seq=1024, dtype="bfloat16"),
              True: Shape(64, 4, 256, batch=2, seq=32, dtype="float32")},
    "training": {False: dict(batch=8, seq=1024, layers=None, vocab=None, rounds=10, dtype="bfloat16"),
                 True: dict(batch=1, seq=32, layers=1, vocab=512, rounds=2, dtype="float32")},
    "generation": {False: dict(batches="1,8", prompt=32, new=64, repeats=3, tiny=False),
                   True: dict(batches="1", prompt=4, new=4, repeats=1, tiny=True)},
}


def run_tests() -> dict[str, Any]:
    """pytest on the GPU test files: its summary line and exit status (5 = nothing collected)."""
    command = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *CUDA_TESTS]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    return {"status": done.returncode, "summary": lines[-1] if lines else done.stderr[-500:]}


def _flash(device: torch.device) -> contextlib.AbstractContextManager:
    """SDPA restricted to its flash kernel on a GPU (an input it cannot take then fails loudly)."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION])


def _synchronized(step, device: torch.device):
    def run() -> None:
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    return run


def check_block(device: torch.device, quick: bool, rounds: int) -> dict[str, Any]:
    """The bench's blocks on ``device``: blocklab's speed ratio to each peer (> 1: blocklab is faster)."""
    shape = SIZES["block"][quick]
    candidates, skipped = build_candidates(shape, peers=("torch-pre", "hf-gpt2"))
    x, g = make_input(shape)
    x, g = x.detach().to(device).requires_grad_(), g.to(device)
    steps = {}
    for c in candidates:
        c.module.to(device)
        steps[c.name] = _synchronized(lambda c=c: train_step(c, x, g), device)
    with _flash(device):
        times = time_rounds(steps, rounds, min_seconds=0.0 if not quick else 0.01, warmup=2)
    ratios = speed_ratios(candidates, times, [v for v in VARIANTS if v.target], BOOTSTRAP)["blocklab"]
    return {"shape": vars(shape), "skipped": skipped,
            "tokens_per_s": {n: shape.tokens / min(t) for n, t in times.items()},
            "ratios": {peer: r for peer, r in ratios.items() if not peer.startswith("blocklab")}}


def check_training(device: torch.device, quick: bool) -> dict[str, Any]:
    """GPT-2 small's training step against the nanoGPT-style model: speed-up, tokens/s, MFU."""
    sizes = SIZES["training"][quick]
    argv = ["--shapes", "gpt2", "--device", str(device), "--batch", str(sizes["batch"]), "--seq",
            str(sizes["seq"]), "--rounds", str(sizes["rounds"]), "--dtype", sizes["dtype"]]
    argv += [a for key in ("layers", "vocab") if sizes[key] for a in (f"--{key}", str(sizes[key]))]
    with _flash(device) if sizes["dtype"] != "float32" else contextlib.nullcontext():
        row = training.main(argv)[0]
    peak = next((v for k, v in PEAK_BF16.items() if k in _device_name(device)), None)
    row["mfu"] = {n: f / peak for n, f in row["model_flops_per_s"].items()} if peak and not quick else None
    return row


def check_generation(device: torch.device, quick: bool) -> list[dict[str, Any]]:
    """Greedy generation on GPT-2 small's shape against transformers', batch by batch."""
    sizes = SIZES["generation"][quick]
    hf, model = generation.models("gpt2-small", sizes["tiny"], str(device))
    args = argparse.Namespace(device=str(device), ragged=True,
                              **{k: sizes[k] for k in ("prompt", "new", "repeats")})
    rows = []
    for batch in map(int, sizes["batches"].split(",")):
        row = generation.compare(hf, model, batch, False, args)
        rows.append({"batch": batch, "speedup": row["rate"]["blocklab"] / row["rate"]["transformers"], **row})
    return rows


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def print_table(report: dict[str, Any]) -> None:
    """The figures as one table: part, against what, the ratio (> 1: blocklab is faster) and its detail."""
    print(f"\ngpu-check on {report['device_name']} ({report['device']}), torch {report['torch']}, "
          f"{report['seconds']:.0f} s{' (quick)' if report['quick'] else ''}")
    print(f"{'part':<11}{'against':<26}{'blocklab':>10}  detail")
    print(f"{'tests':<11}{' '.join(CUDA_TESTS):<26}{'':>10}  {report['tests']['summary']}")
    for peer, r in report["block"]["ratios"].items():
        print(f"{'block':<11}{peer:<26}{r['median']:>9.2f}x  [{r['low']:.2f}, {r['high']:.2f}] "
              f"against {r['against']}")
    t = report["training"]
    mfu = f", MFU {t['mfu']['blocklab']:.1%} vs {t['mfu'][t['peer']]:.1%}" if t["mfu"] else ""
    print(f"{'training':<11}{t['peer']:<26}{t['speedup']:>9.2f}x  [{t['interval'][0]:.2f}, "
          f"{t['interval'][1]:.2f}] {t['tokens_per_s']['blocklab']:.0f} tok/s{mfu}")
    for g in report["generation"]:
        print(f"{'generation':<11}{'transformers, batch ' + str(g['batch']):<26}{g['speedup']:>9.2f}x  "
              f"same tokens: {g['same']}")
    print("ratios: the peer's time over blocklab's (above 1: blocklab is faster)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu")
    parser.add_argument("--quick", action="store_true",
                        help="toy sizes, float32: checks that every part runs")
    parser.add_argument("--rounds", type=int, default=12, help="interleaved rounds of the block comparison")
    parser.add_argument("--out", default="runs/gpu-check",
                        help="folder for report.json (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        device = torch.device(args.device)
    except RuntimeError:
        print(f"gpu-check: --device {args.device!r} is not a device: cuda, cuda:N or cpu", file=sys.stderr)
        return 2
    if device.type not in ("cuda", "cpu"):
        print(f"gpu-check: --device {args.device!r}: the check runs on cuda, cuda:N or cpu", file=sys.stderr)
        return 2
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu-check: no CUDA GPU here (torch.cuda.is_available() is False); "
              "use --device cpu --quick to check the script itself", file=sys.stderr)
        return 2
    start = time.perf_counter()
    report: dict[str, Any] = {"device": str(device), "device_name": _device_name(device),
                              "torch": torch.__version__, "quick": args.quick}
    print("gpu-check: 1/4 tests", flush=True)
    report["tests"] = run_tests()
    print("gpu-check: 2/4 block", flush=True)
    report["block"] = check_block(device, args.quick, 2 if args.quick else args.rounds)
    print("gpu-check: 3/4 training", flush=True)
    report["training"] = check_training(device, args.quick)
    print("gpu-check: 4/4 generation", flush=True)
    report["generation"] = check_generation(device, args.quick)
    report["seconds"] = time.perf_counter() - start
    print_table(report)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "report.json", report)  # atomically, never through a link
    print(f"written: {out / 'report.json'}")
    return 0 if report["tests"]["status"] in (0, 5) else 1


if __name__ == "__main__":
    sys.exit(main())
