"""Where a model computes and in which precision: the one definition of which devices and dtypes
this machine has, used by train, eval, generate, trace and bench.

    compute = resolve_compute("auto", "bfloat16")    # cuda if present, else mps, else cpu
    model.to(compute.device)
    with compute.autocast():                         # matmuls in bfloat16, the rest float32
        loss = model(x.to(compute.device), y.to(compute.device))[1]

Mixed precision is ``torch.autocast``: the parameters, the optimizer state and the checkpoints stay
float32 (the master weights); autocast runs the matmuls (linear layers, attention) in the chosen
dtype and keeps norms, softmax and the loss in float32. float16's narrow range needs a gradient
scaler (``Compute.grad_scaler``: the loss is scaled up before backward, the gradients down before
the update, and a step whose gradients overflowed is skipped); bfloat16 has float32's range and
needs none.

Availability is measured, not guessed: a device is available when torch says so, a dtype when a
small matmul under autocast on that device comes out in it, and on a CPU the speed of that matmul
in the low-precision dtype is compared with float32 (one core, timed once per process): a CPU without native
bfloat16 runs it in software, tens of times slower, and gets a warning that names both rates.

May import: errors.
"""

from __future__ import annotations

import os
import re
import time
import warnings
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from functools import cache

import torch

from .errors import BlocklabWarning, one_line

DEVICE_CHOICES: tuple[str, ...] = ("auto", "cpu", "cuda", "mps")  # "cuda:N" names one GPU of several
DTYPES: dict[str, torch.dtype] = {  # the matmuls' dtype; float32: no autocast
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
DTYPE_CHOICES: tuple[str, ...] = tuple(DTYPES)
# A CPU whose low-precision matmul runs below this share of its float32 rate has no native support
# for the dtype (issue 16 measured bfloat16 at 0.5 GFLOP/s against float32's 59 on this project's
# machine): autocast slows it down.
SLOW_SHARE = 0.5
_PROBE_SIZE = 128  # the probe's square matmul: 4 MFLOP, ~10 ms where bfloat16 is emulated
_PROBE_SECONDS = 0.02  # each rate is timed over at least this long


class DeviceError(ValueError):
    """A device or dtype this machine cannot use: one line naming it and what is available."""


def is_device_name(name: object) -> bool:
    """Whether ``name`` is one of DEVICE_CHOICES or ``cuda:N`` (N a GPU index)."""
    return isinstance(name, str) and (name in DEVICE_CHOICES or re.fullmatch(r"cuda:\d+", name) is not None)


def available_devices() -> list[str]:
    """The device types torch can use here: ``cpu``, and ``cuda`` / ``mps`` when present."""
    return ["cpu"] + [kind for kind in ("cuda", "mps") if _present(kind)]


def _present(kind: str) -> bool:
    if kind == "cuda":
        return torch.cuda.is_available()
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def _why_absent(kind: str) -> str:
    if kind == "cuda":
        if torch.version.cuda is None:
            return f"this torch ({torch.__version__}) is built without CUDA"
        return f"torch {torch.__version__} (CUDA {torch.version.cuda}) finds no GPU"
    backend = getattr(torch.backends, "mps", None)
    if backend is None or not backend.is_built():
        return f"this torch ({torch.__version__}) is built without MPS (Apple GPUs)"
    return "MPS is not available (it needs macOS 12.3+ on Apple silicon)"


def resolve_device(name: str, local_rank: int | None = None) -> torch.device:
    """The torch.device ``name`` means here: ``auto`` is cuda if present, else mps, else cpu; under
    torchrun (``local_rank``, default the LOCAL_RANK variable) ``cuda`` is this process's GPU.
    DeviceError (one line) when it is not available."""
    if not is_device_name(name):
        raise DeviceError(f"device {name!r} is not one of: {', '.join(DEVICE_CHOICES)}, cuda:N")
    if name == "auto":
        name = next((kind for kind in ("cuda", "mps") if _present(kind)), "cpu")
    kind, _, index = name.partition(":")
    if not _present(kind) and kind != "cpu":
        raise DeviceError(f"device {name!r} is not available: {_why_absent(kind)}; "
                          f"available here: {', '.join(available_devices())}")
    if kind != "cuda":
        return torch.device(kind)
    count = torch.cuda.device_count()
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    gpu = int(index) if index else local_rank
    if gpu >= count:
        raise DeviceError(f"device cuda:{gpu} is not available: this machine has {count} GPU"
                          f"{'s' if count != 1 else ''} (cuda:0 to cuda:{count - 1})")
    return torch.device("cuda", gpu)


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of a model's parameters (cpu for a model without any)."""
    return next((p.device for p in model.parameters()), torch.device("cpu"))


# ---- dtypes: what autocast supports, and how fast --------------------------------------------------


@cache
def autocast_problem(device_type: str, dtype: torch.dtype) -> str | None:
    """Why autocast cannot compute in ``dtype`` on ``device_type`` (None: it can). Measured: a small
    matmul under autocast must come out in ``dtype`` (torch disables autocast, with a warning, for a
    dtype a device does not support)."""
    if not torch.amp.autocast_mode.is_autocast_available(device_type):
        return f"torch {torch.__version__} has no autocast for {device_type}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            a = torch.ones(8, 8, device=device_type)
            with torch.autocast(device_type, dtype=dtype):
                out_dtype = (a @ a).dtype
        except (RuntimeError, TypeError, ValueError) as error:
            return one_line(str(error))
    if out_dtype != dtype:
        said = f" ({one_line(str(caught[0].message))})" if caught else ""
        return f"autocast on {device_type} leaves matmuls in {out_dtype}{said}"
    return None


@cache
def matmul_rate(dtype: torch.dtype) -> float:
    """GFLOP/s of one CPU core on a square matmul in ``dtype``, timed once per process (the first
    call warms up; then as many as fit in ``_PROBE_SECONDS``). One thread: on a loaded machine a
    multi-threaded float32 matmul can stall waiting for busy cores, which says nothing about the dtype."""
    n = _PROBE_SIZE
    generator = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=generator).to(dtype) for _ in range(2))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a @ b
        reps, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < _PROBE_SECONDS or reps == 0:
            a @ b
            reps += 1
    finally:
        torch.set_num_threads(threads)
    return 2 * n**3 * reps / max(elapsed, 1e-9) / 1e9


def slow_dtype_warning(device: torch.device, dtype: torch.dtype) -> str | None:
    """A warning when ``dtype`` matmuls run on this CPU at below SLOW_SHARE of float32's rate (no
    native support: autocast would slow training down); None otherwise, or off the CPU."""
    if device.type != "cpu" or dtype == torch.float32:
        return None
    low, full = matmul_rate(dtype), matmul_rate(torch.float32)
    if low >= SLOW_SHARE * full:
        return None
    name = dtype_name(dtype)
    return (f"this CPU has no native {name}: a {name} matmul runs at {low:.2g} GFLOP/s, float32 at "
            f"{full:.2g} GFLOP/s (measured now), so --dtype {name} computes more slowly than float32 here")


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


# ---- the choice: device and dtype, checked ----------------------------------------------------------


@dataclass(frozen=True)
class Compute:
    """Where a model computes (``device``) and the dtype autocast runs its matmuls in (``dtype``;
    float32: no autocast). Parameters, optimizer state and checkpoints stay float32."""

    device: torch.device
    dtype: torch.dtype = torch.float32

    @property
    def mixed(self) -> bool:
        """Whether autocast is on (dtype below float32)."""
        return self.dtype != torch.float32

    def autocast(self) -> AbstractContextManager:
        """The context a forward pass runs in: torch.autocast on this device, or nothing for float32."""
        if not self.mixed:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def grad_scaler(self) -> torch.amp.GradScaler:
        """A gradient scaler, enabled for float16 only (bfloat16 has float32's exponent range)."""
        return torch.amp.GradScaler(self.device.type, enabled=self.dtype == torch.float16)

    def describe(self) -> str:
        """``cpu, float32`` or ``cuda:0, bfloat16 autocast (float32 weights)``."""
        precision = f"{dtype_name(self.dtype)} autocast (float32 weights)" if self.mixed else "float32"
        return f"{self.device}, {precision}"


def resolve_compute(device: str = "auto", dtype: str = "float32", local_rank: int | None = None) -> Compute:
    """The Compute ``device`` and ``dtype`` name here, checked: DeviceError (one line) when either is
    unavailable; a BlocklabWarning when the CPU computes ``dtype`` slowly (``slow_dtype_warning``)."""
    if dtype not in DTYPES:
        raise DeviceError(f"dtype {dtype!r} is not one of: {', '.join(DTYPE_CHOICES)}")
    where = resolve_device(device, local_rank)
    wanted = DTYPES[dtype]
    if wanted != torch.float32:
        problem = autocast_problem(where.type, wanted)
        if problem is not None:
            raise DeviceError(f"dtype {dtype} is not available on {where}: {problem}; "
                              f"use {', '.join(d for d in DTYPE_CHOICES if d != dtype)}")
        slow = slow_dtype_warning(where, wanted)
        if slow is not None:
            warnings.warn(slow, BlocklabWarning, stacklevel=2)
    return Compute(where, wanted)


# ---- random number generators: the CPU's and the device's ----------------------------------------


def device_rng_state(device: torch.device) -> torch.Tensor | None:
    """The generator state of ``device`` beside the CPU's (dropout on a GPU draws from it); None on
    the CPU."""
    if device.type == "cuda":
        return torch.cuda.get_rng_state(device)
    if device.type == "mps":
        return torch.mps.get_rng_state()
    return None


def set_device_rng_state(device: torch.device, state: torch.Tensor) -> None:
    """Restore what ``device_rng_state`` returned."""
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    elif device.type == "mps":
        torch.mps.set_rng_state(state)


@contextmanager
def same_rng(device: torch.device) -> Iterator[None]:
    """Run a block and put the CPU's and ``device``'s generators back as they were: what the block
    draws cannot change what comes after it."""
    cpu, other = torch.get_rng_state(), device_rng_state(device)
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        if other is not None:
            set_device_rng_state(device, other)
