"""Model checkpoints: one safetensors file holding the weights, the config and the tokenizer.

Format (version 1): a ``.safetensors`` file whose header metadata has
``format = "blocklab-checkpoint"``, ``version``, ``config`` (ModelConfig JSON), ``tokenizer``
(JSON of ``{"kind": ..., ...}`` or ``null``) and ``meta`` (free JSON: task, step, ...). A tied
LM head is stored once (``embed.weight``), and ``sha256`` is a digest of the other metadata
and every tensor's name, dtype, shape and bytes, so a flipped bit anywhere is caught. Writes
are atomic: temp file, fsync, rename. Non-finite weights are refused on save.

Loading never unpickles: a file that is not safetensors is refused with what it looks like
(pickle, torch.save zip, text, empty, truncated); then every key, shape and dtype is checked
against the config and the digest is verified. ``load_torch_file`` reads the other PyTorch
files blocklab may meet with ``torch.load(weights_only=True)`` (tensors only, no code).
"""

from __future__ import annotations

import hashlib
import json
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as safetensors_bytes

from ..files.atomic import atomic_write_bytes
from ..inspect.nonfinite import NonFiniteError, check_parameters
from ..nn.config import ModelConfig, from_saved_dict
from ..nn.memory import check_memory
from ..nn.model import Transformer

FORMAT = "blocklab-checkpoint"
VERSION = "1"
DIGEST_KEY = "sha256"


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used: names the file and the problem."""


@dataclass
class Checkpoint:
    """What a checkpoint holds: the rebuilt model, its config, tokenizer spec and metadata."""

    model: Transformer
    config: ModelConfig
    tokenizer: dict[str, Any] | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def state_tensors(model: Transformer) -> dict[str, torch.Tensor]:
    """The state dict as safetensors wants it: contiguous, CPU, tied head stored once. A model whose
    weights were processed for analysis (``fold_ln`` and the like) is refused: it no longer has the
    layout its config describes (a folded norm's head bias, an untied head)."""
    if getattr(model, "weights_processed", None):
        raise ValueError(f"this model's weights were processed ({', '.join(model.weights_processed)}) for "
                         "analysis and no longer match its config; save the model before processing it")
    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_embeddings:
        tensors.pop("head.weight", None)
    return tensors


def content_digest(metadata: dict[str, str], tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over the metadata (but the digest itself) and each tensor's name, dtype, shape, bytes."""
    h = hashlib.sha256()
    for key in sorted(metadata):
        if key != DIGEST_KEY:
            h.update(f"{key}\0{metadata[key]}\0".encode())
    for key in sorted(tensors):
        t = tensors[key].detach().cpu().contiguous()
        h.update(f"{key}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())  # the raw bytes, any dtype
    return h.hexdigest()


def save_checkpoint(
    path: str | Path,
    model: Transformer,
    tokenizer: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
    allow_nonfinite: bool = False,
) -> None:
    """Atomically write the model's weights, config, tokenizer spec and metadata to ``path``.

    Refuses (NonFiniteError, the file untouched) when a weight is NaN/Inf, unless ``allow_nonfinite``.
    """
    bad = None if allow_nonfinite else check_parameters(model)
    if bad:
        raise NonFiniteError(bad, f"; refusing to write {path} (the previous checkpoint is kept)")
    metadata = {
        "format": FORMAT,
        "version": VERSION,
        "config": json.dumps(model.config.to_dict()),
        "tokenizer": json.dumps(tokenizer),
        "meta": json.dumps(meta or {}),
    }
    tensors = state_tensors(model)
    metadata[DIGEST_KEY] = content_digest(metadata, tensors)
    atomic_write_bytes(path, safetensors_bytes(tensors, metadata=metadata))


def _fail(path: Path, problem: str) -> CheckpointError:
    return CheckpointError(f"{path}: {problem}")


# Leading bytes of formats people mistake for a checkpoint (pickles are checked separately).
_MAGIC: dict[bytes, str] = {
    b"PK\x03\x04": "a zip archive, the format of torch.save (it holds a pickle)",
    b"\x93NUMPY": "a NumPy .npy file",
    b"\x89HDF": "an HDF5 file (Keras/TensorFlow weights?)",
    b"GGUF": "a GGUF file (llama.cpp)",
    b"\x1f\x8b": "a gzip file",
}
_NO_PICKLE = "blocklab never unpickles (a pickle can run any code); save the weights as safetensors"
_HEADER_LIMIT = 100_000_000  # safetensors' own limit on the JSON header


def _looks_like_text(head: bytes) -> bool:
    for cut in range(4):  # the 16 bytes may end inside a multi-byte character
        try:
            text = head[: len(head) - cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
        return all(ch.isprintable() or ch in "\t\r\n" for ch in text)
    return False


def sniff_problem(path: Path) -> str | None:
    """Why ``path`` is not a complete safetensors file, from its bytes alone (None: looks fine)."""
    size = path.stat().st_size
    if size == 0:
        return "is empty (0 bytes); an interrupted copy?"
    with open(path, "rb") as f:
        head = f.read(16)
        for magic, what in _MAGIC.items():
            if head.startswith(magic):
                return f"is {what}, not safetensors; " + (_NO_PICKLE if "pickle" in what else "refused")
        if head[:1] == b"\x80" and head[1:2] and 2 <= head[1] <= 5:
            return f"is a Python pickle (protocol {head[1]}; legacy torch.save?), refused: {_NO_PICKLE}"
        if size < 8:
            return f"is truncated: {size} bytes, too short for a safetensors header"
        n = int.from_bytes(head[:8], "little")
        if not (0 < n <= _HEADER_LIMIT and head[8:9] in (b"{", b"")):  # b"": cut right after the length
            if _looks_like_text(head):
                return "is a text file, not a safetensors checkpoint"
            return f"is not a safetensors file (it starts with bytes {head[:8].hex(' ')})"
        if 8 + n > size:
            return f"is truncated: the header alone needs {8 + n} bytes, the file has {size}"
        f.seek(8)
        try:
            header = json.loads(f.read(n))
            ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
            end = max(ends, default=0)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, UnicodeDecodeError) as error:
            return f"has a damaged safetensors header ({type(error).__name__}: {error})"
    if 8 + n + end > size:
        return f"is truncated: {size} of {8 + n + end} bytes (an interrupted write or copy?)"
    if 8 + n + end < size:
        return f"has {size - 8 - n - end} unexpected bytes after the tensor data"
    return None


def read_checkpoint_header(path: str | Path) -> tuple[dict[str, str], list[str]]:
    """The metadata and tensor names of a checkpoint file, without reading the weights."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(2, "no such checkpoint file", str(path))
    if path.is_dir():
        raise _fail(path, "is a folder, not a checkpoint file (.safetensors)")
    problem = sniff_problem(path)
    if problem:
        raise _fail(path, problem)
    try:
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {}), list(f.keys())
    except (SafetensorError, OSError, ValueError) as error:
        raise _fail(path, f"not a readable safetensors file ({error}); corrupt?") from None


def load_checkpoint(path: str | Path, map_location: str = "cpu") -> Checkpoint:
    """Rebuild the model from a checkpoint, validating every key, shape and dtype."""
    path = Path(path)
    metadata, _ = read_checkpoint_header(path)
    if metadata.get("format") != FORMAT:
        raise _fail(path, "is a safetensors file but not a blocklab checkpoint "
                          f"(format={metadata.get('format')!r})")
    if metadata.get("version") != VERSION:
        raise _fail(path, f"checkpoint version {metadata.get('version')!r} is not supported "
                          f"(expected {VERSION})")
    try:
        config_dict = json.loads(metadata["config"])
        tokenizer = json.loads(metadata.get("tokenizer", "null"))
        meta = json.loads(metadata.get("meta", "{}"))
    except (KeyError, ValueError, RecursionError) as error:
        raise _fail(path, f"damaged metadata ({type(error).__name__}: {error})") from None
    objects = (("config", config_dict, (dict,)), ("tokenizer", tokenizer, (dict, type(None))),
               ("meta", meta, (dict,)))
    for name, value, allowed in objects:
        if not isinstance(value, allowed):
            what = "an object" + (" or null" if type(None) in allowed else "")
            raise _fail(path, f"its {name} metadata must be {what}, found {type(value).__name__}")
    try:
        config = from_saved_dict(config_dict)
    except (ValueError, TypeError) as error:
        raise _fail(path, f"invalid config: {error}") from None
    # a header can claim any config: refuse one that cannot fit before building it
    check_memory(config, 1, training=False, what=f"loading {path}", force_flag=False)
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
                    raise _fail(path, f"{key} has shape {tuple(tensor.shape)}, "
                                      f"the config needs {tuple(want.shape)}")
                if not tensor.dtype.is_floating_point:
                    raise _fail(path, f"{key} has dtype {tensor.dtype}, expected a floating-point tensor")
                loaded[key] = tensor
    except SafetensorError as error:
        raise _fail(path, f"corrupt tensor data ({error})") from None
    if DIGEST_KEY not in metadata:
        raise _fail(path, f"has no {DIGEST_KEY} digest, so its integrity cannot be checked; re-save it")
    if content_digest(metadata, loaded) != metadata[DIGEST_KEY]:
        raise _fail(path, f"is corrupt: its content does not match its {DIGEST_KEY} digest (flipped bits?)")
    model.load_state_dict(loaded, strict=False)  # strict on our side: keys were checked above
    return Checkpoint(model, config, tokenizer, meta)


def load_torch_file(path: str | Path, map_location: str = "cpu") -> Any:
    """A ``torch.save`` file read with ``weights_only=True``: tensors and plain data, never code."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(2, "no such file", str(path))
    try:
        with open(path, "rb") as f:  # a file object: torch.load never dispatches on the name
            return torch.load(f, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise _fail(path, f"refused: it holds more than tensors and plain data ({first}); "
                          f"{_NO_PICKLE}") from None
    except (RuntimeError, EOFError, OSError, ValueError) as error:
        raise _fail(path, f"not a readable PyTorch file ({type(error).__name__}: {error}); "
                          "truncated or another format?") from None

