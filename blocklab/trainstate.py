"""What a training checkpoint adds to the model file, so ``--resume`` continues bit for bit.

    checkpoints/step-N/optimizer.safetensors   AdamW's step, exp_avg, exp_avg_sq per parameter,
                                               one tensor ``{param name}.{slot}`` each
    checkpoints/step-N/state.json              step, RNG states (one per process), data order,
                                               elapsed time, last evaluation

The data order is a pure function of (seed, step) (see ``train.batch_indices``), so the state
only has to name it. Nothing here is pickled.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as safetensors_bytes

from .checkpoint import (
    DIGEST_KEY,
    CheckpointError,
    atomic_write_bytes,
    content_digest,
    read_checkpoint_header,
)

OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "state.json"
OPTIMIZER_FORMAT = "blocklab-optimizer"
OPTIMIZER_VERSION = "1"


def _param_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The name of each parameter in the optimizer's own order (its state-dict indices)."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def save_optimizer_state(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Atomically write the optimizer's per-parameter state as safetensors; the group settings
    (betas, weight decay, ...) go in the header metadata."""
    state = optimizer.state_dict()
    tensors = {}
    for index, name in enumerate(_param_names(model, optimizer)):
        for slot, value in state["state"].get(index, {}).items():
            tensors[f"{name}.{slot}"] = torch.as_tensor(value).detach().cpu().contiguous()
    groups = [{k: v for k, v in g.items() if k != "params"} for g in state["param_groups"]]
    metadata = {"format": OPTIMIZER_FORMAT, "version": OPTIMIZER_VERSION, "param_groups": json.dumps(groups)}
    metadata[DIGEST_KEY] = content_digest(metadata, tensors)  # a flipped bit is caught on load
    atomic_write_bytes(path, safetensors_bytes(tensors, metadata=metadata))


def load_optimizer_state(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Restore what ``save_optimizer_state`` wrote into ``optimizer`` (built over ``model``)."""
    path = Path(path)
    metadata, keys = read_checkpoint_header(path)
    if metadata.get("format") != OPTIMIZER_FORMAT:
        raise CheckpointError(f"{path}: not a blocklab optimizer state (format={metadata.get('format')!r})")
    names = _param_names(model, optimizer)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    by_param: dict[str, dict[str, torch.Tensor]] = {}
    try:
        with safe_open(str(path), framework="pt") as f:
            tensors = {key: f.get_tensor(key) for key in keys}
    except SafetensorError as error:
        raise CheckpointError(f"{path}: corrupt tensor data ({error})") from None
    if DIGEST_KEY in metadata and content_digest(metadata, tensors) != metadata[DIGEST_KEY]:
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


def decode_rng(text: str) -> torch.Tensor:
    """Inverse of ``encode_rng``."""
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()
