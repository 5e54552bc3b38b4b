"""What a training checkpoint adds to the model file, so ``--resume`` continues bit for bit.

    checkpoints/step-N/optimizer.safetensors   AdamW's step, exp_avg, exp_avg_sq per parameter,
                                               one tensor ``{param name}.{slot}`` each
    checkpoints/step-N/state.json              step, RNG states (one per process), data order,
                                               elapsed time, last evaluation

The data order is a pure function of (seed, step) (see ``train.batch_indices``), so the state
only has to name it. Nothing here is pickled.

The model file's metadata (covered by its digest) records the sha256 of state.json
(``state_sha256``) and the optimizer file's digest (``optimizer_sha256``), so an edited state.json
or an optimizer file from another checkpoint is refused; an optimizer file without its own digest
is refused like a model file without one. ``read_train_state`` checks every field's type and that
the step agrees with the folder name and the model file.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as safetensors_bytes

from ..device import device_rng_state, set_device_rng_state
from ..files.atomic import atomic_write_bytes
from ..files.jsonfiles import json_safe, object_check, parse_json
from ..files.reading import read_regular_bytes
from .checkpoint import DIGEST_KEY, CheckpointError, content_digest, read_checkpoint_header
from .runfiles import checkpoint_step

OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "state.json"
OPTIMIZER_FORMAT = "blocklab-optimizer"
OPTIMIZER_VERSION = "1"
STATE_DIGEST = "state_sha256"  # model-file meta keys tying the checkpoint's three files together
OPTIMIZER_DIGEST = "optimizer_sha256"
STOPPED = ("steps", "target")  # why a run ended: all its steps, or the target accuracy


def _param_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The name of each parameter in the optimizer's own order (its state-dict indices)."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def save_optimizer_state(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """Atomically write the optimizer's per-parameter state as safetensors; the group settings
    (betas, weight decay, ...) go in the header metadata. Returns the file's digest."""
    state = optimizer.state_dict()
    tensors = {}
    for index, name in enumerate(_param_names(model, optimizer)):
        for slot, value in state["state"].get(index, {}).items():
            tensors[f"{name}.{slot}"] = torch.as_tensor(value).detach().cpu().contiguous()
    groups = [{k: v for k, v in g.items() if k != "params"} for g in state["param_groups"]]
    metadata = {"format": OPTIMIZER_FORMAT, "version": OPTIMIZER_VERSION, "param_groups": json.dumps(groups)}
    metadata[DIGEST_KEY] = content_digest(metadata, tensors)  # a flipped bit is caught on load
    atomic_write_bytes(path, safetensors_bytes(tensors, metadata=metadata))
    return metadata[DIGEST_KEY]


def load_optimizer_state(
    path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, digest: str | None = None
) -> None:
    """Restore what ``save_optimizer_state`` wrote into ``optimizer`` (built over ``model``); with
    ``digest`` (what the model file recorded), the file must be the one saved with that model."""
    path = Path(path)
    metadata, keys = read_checkpoint_header(path)
    if metadata.get("format") != OPTIMIZER_FORMAT:
        raise CheckpointError(f"{path}: not a blocklab optimizer state (format={metadata.get('format')!r})")
    if DIGEST_KEY not in metadata:
        raise CheckpointError(f"{path}: has no {DIGEST_KEY} digest, so its integrity cannot be checked")
    if digest is not None and metadata[DIGEST_KEY] != digest:
        raise CheckpointError(f"{path}: is not the optimizer state saved with this checkpoint's model "
                              f"(its digest differs from the one the model file records)")
    names = _param_names(model, optimizer)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    by_param: dict[str, dict[str, torch.Tensor]] = {}
    try:
        with safe_open(str(path), framework="pt") as f:
            tensors = {key: f.get_tensor(key) for key in keys}
    except SafetensorError as error:
        raise CheckpointError(f"{path}: corrupt tensor data ({error})") from None
    if content_digest(metadata, tensors) != metadata[DIGEST_KEY]:
        raise CheckpointError(f"{path}: is corrupt: its content does not match its {DIGEST_KEY} digest")
    for key, tensor in tensors.items():
        name, _, slot = key.rpartition(".")
        by_param.setdefault(name, {})[slot] = tensor
    unknown = sorted(set(by_param) - set(names))
    if unknown:
        raise CheckpointError(f"{path}: optimizer state for parameters the model lacks: {', '.join(unknown)}")
    for name, param in zip(names, params, strict=True):
        for slot, tensor in by_param.get(name, {}).items():
            if tensor.dim() and tensor.shape != param.shape:
                raise CheckpointError(
                    f"{path}: {name}.{slot} has shape {tuple(tensor.shape)}, the parameter "
                    f"{tuple(param.shape)}"
                )
    state = optimizer.state_dict()
    state["state"] = {i: by_param[name] for i, name in enumerate(names) if name in by_param}
    optimizer.load_state_dict(state)


def encode_rng(state: torch.Tensor) -> str:
    """A torch RNG state (uint8 tensor) as base64 text for state.json."""
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def decode_rng(text: str, size: int | None = None) -> torch.Tensor:
    """Inverse of ``encode_rng``; ValueError when the text is not a generator state of ``size`` bytes
    (default: a CPU generator's; a GPU's differs)."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError, TypeError):
        raise ValueError("not base64 text") from None
    if size is None and len(raw) != torch.get_rng_state().numel():
        raise ValueError(f"{len(raw)} bytes, a CPU generator's state has {torch.get_rng_state().numel()}")
    if size is not None and len(raw) != size:
        raise ValueError(f"{len(raw)} bytes, this device's generator state has {size}")
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone()


def state_bytes(state: dict[str, Any]) -> bytes:
    """state.json's bytes (strict JSON; what ``STATE_DIGEST`` is computed over)."""
    return (json.dumps(json_safe(state), indent=2, allow_nan=False) + "\n").encode()


def _number(value: Any, low: float = 0.0) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and value >= low


def _integer(value: Any, low: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def tokens_per_second(tokens: float, seconds: float) -> float:
    """Training throughput, one definition for ``blocklab train``'s last line, the progress bar and
    report.html: the training tokens over the training seconds (forward, backward and update; not
    evaluation, checkpoints or logging), both summed over every session of a resumed run, as state.json
    records them (``tokens``, ``train_seconds``)."""
    return tokens / max(seconds, 1e-9)


def read_train_state(folder: str | Path, meta: dict[str, Any], world_size: int) -> dict[str, Any]:
    """A checkpoint folder's state.json, checked: every field's type, the step against the folder's
    name and the model file's ``meta``, the digest the model file records, one RNG state per process.
    A non-finite ``loss`` (written as null) comes back as NaN. ValueError naming file and field."""
    folder = Path(folder)
    path = folder / STATE_FILE
    if not path.exists() and not path.is_symlink():
        raise CheckpointError(f"{folder}: no {STATE_FILE} (an incomplete checkpoint?)")
    data = read_regular_bytes(path, "a checkpoint's training state")
    recorded = meta.get(STATE_DIGEST)
    if recorded is not None and hashlib.sha256(data).hexdigest() != recorded:
        raise CheckpointError(f"{path}: does not match the digest the checkpoint's model file records for it "
                              "(edited or damaged?)")
    state = parse_json(data, str(path), object_check("a checkpoint's training state"))

    def bad(field: str, rule: str) -> CheckpointError:
        return CheckpointError(f"{path}: {field}={state.get(field)!r} must be {rule}")

    step = checkpoint_step(folder)
    if state.get("step") != step or isinstance(state.get("step"), bool):
        raise bad("step", f"{step}, the step in the folder's name")
    if meta.get("step", step) != step:
        raise CheckpointError(f"{path}: the model file says step {meta.get('step')!r}, the folder {step}")
    checks = [
        ("done", isinstance(state.get("done"), bool), "true or false"),
        ("stopped", state.get("stopped") in STOPPED, f"one of: {', '.join(STOPPED)}"),
        ("seconds", _number(state.get("seconds")), "a number >= 0"),
        ("train_seconds", _number(state.get("train_seconds")), "a number >= 0"),
        ("tokens", _integer(state.get("tokens")), "an integer >= 0"),
        ("loss", "loss" in state and (state["loss"] is None or _number(state["loss"], -math.inf)),
         "a number or null"),
        ("eval", isinstance(state.get("eval"), dict) and all(
            isinstance(k, str) and _number(v, -math.inf) for k, v in state["eval"].items()),
         "an object of numbers"),
        ("world_size", state.get("world_size", world_size) == world_size,
         f"{world_size}, the number of processes resuming it"),
        ("rng", isinstance(state.get("rng"), list) and len(state["rng"]) == world_size
         and all(isinstance(r, str) for r in state["rng"]), f"a list of {world_size} RNG states"),
    ]
    for field, ok, rule in checks:
        if not ok:
            raise bad(field, rule)
    for rank, text in enumerate(state["rng"]):
        try:
            decode_rng(text)
        except ValueError as error:
            raise CheckpointError(f"{path}: rng[{rank}] is not a saved RNG state ({error})") from None
    return {**state, "loss": math.nan if state["loss"] is None else state["loss"]}


def restore_device_state(path: Path, state: dict[str, Any], rank: int, world_size: int, device: torch.device,
                         scaler: Any) -> None:
    """This process's device generator (a run resumed on the device type it was saved on) and float16's
    gradient scale (``scaler``), from a checkpoint's state.json at ``path``; ValueError naming the file
    when damaged."""
    saved = state.get("device_rng")
    if saved is not None:
        if not (isinstance(saved, list) and len(saved) == world_size):
            raise ValueError(f"{path}: device_rng is not a list of {world_size} entries")
        mine = saved[rank]
        if not (mine is None or isinstance(mine, dict) and isinstance(mine.get("device"), str)
                and isinstance(mine.get("state"), str)):
            raise ValueError(f"{path}: device_rng[{rank}] is not null or {{device, state}}")
        current = device_rng_state(device)
        if mine is not None and current is not None and mine["device"].split(":")[0] == device.type:
            try:
                set_device_rng_state(device, decode_rng(mine["state"], current.numel()))
            except ValueError as error:
                raise ValueError(f"{path}: device_rng[{rank}] is not a saved RNG state ({error})") \
                    from None
    scale = state.get("grad_scaler")
    if scale is not None and scaler.is_enabled():
        if not (isinstance(scale, dict) and all(isinstance(v, (int, float)) for v in scale.values())):
            raise ValueError(f"{path}: grad_scaler is not an object of numbers")
        scaler.load_state_dict(scale)
