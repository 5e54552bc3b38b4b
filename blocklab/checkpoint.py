"""Model checkpoints: one safetensors file holding the weights, the config and the tokenizer.

Format (version 1): a ``.safetensors`` file whose header metadata has
``format = "blocklab-checkpoint"``, ``version``, ``config`` (ModelConfig JSON), ``tokenizer``
(JSON of ``{"kind": ..., ...}`` or ``null``) and ``meta`` (free JSON: task, step, ...). A tied
LM head is stored once (``embed.weight``). Writes are atomic: temp file, fsync, rename.
Loading never unpickles and checks every key, shape and dtype against the config.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as safetensors_bytes

from .config import ModelConfig, from_dict
from .model import Transformer

FORMAT = "blocklab-checkpoint"
VERSION = "1"


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used: names the file and the problem."""


@dataclass
class Checkpoint:
    """What a checkpoint holds: the rebuilt model, its config, tokenizer spec and metadata."""

    model: Transformer
    config: ModelConfig
    tokenizer: dict[str, Any] | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so a crash leaves either the old file or the new one, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)  # make the rename itself durable


def fsync_dir(path: str | Path) -> None:
    """Flush a directory's entries (new names, renames) to disk."""
    dir_fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def state_tensors(model: Transformer) -> dict[str, torch.Tensor]:
    """The state dict as safetensors wants it: contiguous, CPU, tied head stored once."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_embeddings:
        tensors.pop("head.weight", None)
    return tensors


def save_checkpoint(
    path: str | Path,
    model: Transformer,
    tokenizer: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
) -> None:
    """Atomically write the model's weights, config, tokenizer spec and metadata to ``path``."""
    metadata = {
        "format": FORMAT,
        "version": VERSION,
        "config": json.dumps(model.config.to_dict()),
        "tokenizer": json.dumps(tokenizer),
        "meta": json.dumps(meta or {}),
    }
    atomic_write_bytes(path, safetensors_bytes(state_tensors(model), metadata=metadata))


def _fail(path: Path, problem: str) -> CheckpointError:
    return CheckpointError(f"{path}: {problem}")


def read_checkpoint_header(path: str | Path) -> tuple[dict[str, str], list[str]]:
    """The metadata and tensor names of a checkpoint file, without reading the weights."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(2, "no such checkpoint file", str(path))
    if path.is_dir():
        raise _fail(path, "is a folder, not a checkpoint file (.safetensors)")
    try:
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {}), list(f.keys())
    except (SafetensorError, OSError, ValueError) as error:
        raise _fail(path, f"not a readable safetensors file ({error}); truncated, corrupt or another format?") from None


def load_checkpoint(path: str | Path, map_location: str = "cpu") -> Checkpoint:
    """Rebuild the model from a checkpoint, validating every key, shape and dtype."""
    path = Path(path)
    metadata, _ = read_checkpoint_header(path)
    if metadata.get("format") != FORMAT:
        raise _fail(path, f"is a safetensors file but not a blocklab checkpoint (format={metadata.get('format')!r})")
    if metadata.get("version") != VERSION:
        raise _fail(path, f"checkpoint version {metadata.get('version')!r} is not supported (expected {VERSION})")
    try:
        config = from_dict(json.loads(metadata["config"]))
        tokenizer = json.loads(metadata.get("tokenizer", "null"))
        meta = json.loads(metadata.get("meta", "{}"))
    except (KeyError, json.JSONDecodeError, TypeError) as error:
        raise _fail(path, f"damaged metadata ({error})") from None
    except ValueError as error:
        raise _fail(path, f"invalid config: {error}") from None
    model = Transformer(config)
    expected = state_tensors(model)
    try:
        with safe_open(str(path), framework="pt", device=map_location) as f:
            found = set(f.keys())
            missing = sorted(set(expected) - found)
            extra = sorted(found - set(expected))
            if missing or extra:
                parts = ([f"missing {', '.join(missing)}"] if missing else []) + (
                    [f"unexpected {', '.join(extra)}"] if extra else [])
                raise _fail(path, f"weights do not match the config: {'; '.join(parts)}")
            loaded = {}
            for key, want in expected.items():
                tensor = f.get_tensor(key)
                if tensor.shape != want.shape:
                    raise _fail(path, f"{key} has shape {tuple(tensor.shape)}, the config needs {tuple(want.shape)}")
                if not tensor.dtype.is_floating_point:
                    raise _fail(path, f"{key} has dtype {tensor.dtype}, expected a floating-point tensor")
                loaded[key] = tensor
    except SafetensorError as error:
        raise _fail(path, f"corrupt tensor data ({error})") from None
    model.load_state_dict(loaded, strict=False)  # strict on our side: keys were checked above
    return Checkpoint(model, config, tokenizer, meta)
