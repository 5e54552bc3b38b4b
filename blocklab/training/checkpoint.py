"""Model checkpoints: one safetensors file holding the weights, the config and the tokenizer.

Format (version 1): a ``.safetensors`` file whose header metadata has
``format = "blocklab-checkpoint"``, ``version``, ``config`` (ModelConfig JSON), ``tokenizer``
(JSON of ``{"kind": ..., ...}`` or ``null``) and ``meta`` (free JSON: task, step, ...). A tied
LM head is stored once (``embed.weight``), and ``sha256`` is a digest of the other metadata
and every tensor's name, dtype, shape and bytes, so a flipped bit anywhere is caught. Writes
are atomic: temp file, fsync, rename. Non-finite weights are refused on save.

Loading never unpickles: a file that is not safetensors is refused with what it looks like
(pickle, torch.save zip, text, empty, truncated); then every key, shape and dtype is checked
against the config from the header, before any weight is read or allocated, the digest is verified,
and a NaN or Inf weight is refused naming it (unless ``allow_nonfinite``). ``load_torch_file`` reads
the other PyTorch files blocklab may meet with ``torch.load(weights_only=True)`` (tensors only, no code).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as safetensors_bytes

from ..files.atomic import atomic_write_bytes
from ..files.jsonfiles import json_type, parse_json
from ..files.reading import open_to_read
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


# Bytes per value of each safetensors dtype.
DTYPE_BYTES: dict[str, int] = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
                               "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


@dataclass(frozen=True)
class TensorInfo:
    """What a safetensors header declares for one tensor, before a byte of it is read."""

    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """The bytes the tensor needs."""
        return math.prod(self.shape) * DTYPE_BYTES[self.dtype]


_DTYPE_NAMES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
                torch.uint8: "U8", torch.bool: "BOOL"}


def tensor_info(tensor: torch.Tensor) -> TensorInfo:
    """A tensor's dtype (safetensors' name for it) and shape, as a header would declare them."""
    return TensorInfo(_DTYPE_NAMES.get(tensor.dtype, str(tensor.dtype)), tuple(tensor.shape))


def _size(n: Any) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 0


def _entry_problem(name: str, entry: Any) -> str | None:
    """Why a header entry is not ``{"dtype", "shape", "data_offsets"}`` agreeing with each other."""
    if not isinstance(entry, dict):
        return f"tensor {name!r} is described by {type(entry).__name__}, not an object"
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPE_BYTES:
        return f"tensor {name!r} has dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}"
    if not (isinstance(shape, list) and all(map(_size, shape))):
        return f"tensor {name!r} has shape {shape!r}, not a list of sizes >= 0"
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_size, offsets))
            and offsets[0] <= offsets[1]):
        return f"tensor {name!r} has data_offsets {offsets!r}, not [begin, end] with 0 <= begin <= end"
    need = TensorInfo(dtype, tuple(shape)).nbytes
    if offsets[1] - offsets[0] != need:
        return (f"tensor {name!r} declares shape {tuple(shape)} of {dtype} ({need:,} bytes) but "
                f"{offsets[1] - offsets[0]:,} bytes of data")
    return None


def _header_problem(header: Any) -> str | None:
    """The safetensors header's schema: an object of tensor entries and string ``__metadata__``."""
    if not isinstance(header, dict):
        return f"its header is {type(header).__name__}, not a JSON object"
    metadata = header.get("__metadata__", {})
    if not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        return "its __metadata__ is not an object of strings"
    return next((p for k, v in header.items() if k != "__metadata__" and (p := _entry_problem(k, v))), None)


def read_safetensors_header(path: str | Path) -> tuple[dict[str, str], dict[str, TensorInfo]]:
    """The metadata and the declared tensors of a safetensors file, from its header alone (no weight is
    read or allocated). CheckpointError naming the file when it is not a complete safetensors file: a
    pickle, a torch.save zip, text, empty, truncated, a damaged header, declared tensors that do not
    fill the file exactly; a folder, a pipe or a device is refused before a byte is read."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(2, "no such checkpoint file", str(path))
    try:
        fd = open_to_read(path, "a .safetensors file")
    except ValueError as error:
        raise CheckpointError(str(error)) from None
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(fd).st_size
        if size == 0:
            raise _fail(path, "is empty (0 bytes); an interrupted copy?")
        head = f.read(16)
        for magic, what in _MAGIC.items():
            if head.startswith(magic):
                why = _NO_PICKLE if "pickle" in what else "refused"
                raise _fail(path, f"is {what}, not safetensors; {why}")
        if head[:1] == b"\x80" and head[1:2] and 2 <= head[1] <= 5:
            raise _fail(path, f"is a Python pickle (protocol {head[1]}; legacy torch.save?), refused: "
                              f"{_NO_PICKLE}")
        if size < 8:
            raise _fail(path, f"is truncated: {size} bytes, too short for a safetensors header")
        n = int.from_bytes(head[:8], "little")
        if not (0 < n <= _HEADER_LIMIT and head[8:9] in (b"{", b"")):  # b"": cut right after the length
            if _looks_like_text(head):
                raise _fail(path, "is a text file, not a safetensors checkpoint")
            raise _fail(path, f"is not a safetensors file (it starts with bytes {head[:8].hex(' ')})")
        if 8 + n > size:
            raise _fail(path, f"is truncated: the header alone needs {8 + n} bytes, the file has {size}")
        f.seek(8)
        try:
            header = parse_json(f.read(n), "header", _header_problem)
        except ValueError as error:
            raise _fail(path, f"has a damaged safetensors {error}") from None
    tensors = {k: TensorInfo(v["dtype"], tuple(v["shape"])) for k, v in header.items() if k != "__metadata__"}
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end > size:
        raise _fail(path, f"is truncated: {size} of {8 + n + end} bytes (an interrupted write or copy?)")
    if 8 + n + end < size:
        raise _fail(path, f"has {size - 8 - n - end} unexpected bytes after the tensor data")
    return dict(header.get("__metadata__", {})), tensors


def read_checkpoint_header(path: str | Path) -> tuple[dict[str, str], list[str]]:
    """The metadata and tensor names of a checkpoint file, without reading the weights."""
    metadata, tensors = read_safetensors_header(path)
    return metadata, list(tensors)


def _metadata_json(path: Path, metadata: dict[str, str], key: str, default: str | None,
                   allowed: tuple[type, ...]) -> Any:
    """One JSON value of the header's metadata, of the ``allowed`` types (CheckpointError naming the file)."""
    text = metadata.get(key, default)
    if text is None:
        raise _fail(path, f"damaged metadata: no {key!r}")
    what = "an object" + (" or null" if type(None) in allowed else "")
    try:
        return parse_json(text, f"its {key} metadata",
                          lambda value: None if isinstance(value, allowed) else f"must be {what}, found "
                                                                                f"{json_type(value)}")
    except ValueError as error:
        raise _fail(path, str(error)) from None


def check_declared(path: Path, declared: dict[str, TensorInfo], expected: dict[str, torch.Tensor]) -> None:
    """Refuse (naming the key) a file whose header declares other tensors, shapes or a non-floating dtype
    than ``expected``: checked before any tensor is read, so a header cannot make blocklab allocate."""
    missing, extra = sorted(set(expected) - set(declared)), sorted(set(declared) - set(expected))
    if missing or extra:
        parts = ([f"missing {', '.join(missing)}"] if missing else []) + (
            [f"unexpected {', '.join(extra)}"] if extra else [])
        raise _fail(path, f"weights do not match the config: {'; '.join(parts)}")
    for key, want in expected.items():
        info = declared[key]
        if info.shape != tuple(want.shape):
            raise _fail(path, f"{key} has shape {info.shape}, the config needs {tuple(want.shape)}")
        if info.dtype not in FLOAT_DTYPES:
            raise _fail(path, f"{key} has dtype {info.dtype}, expected a floating-point tensor")


FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")


def refuse_nonfinite(model: Transformer, path: str | Path, allow: bool) -> None:
    """NonFiniteError naming the first weight holding NaN/Inf (unless ``allow``: the user inspects it)."""
    bad = None if allow else check_parameters(model)
    if bad:
        raise NonFiniteError(bad, f" in {path}; a model with non-finite weights computes nothing useful (to "
                                  "inspect it anyway: --allow-nonfinite, in Python allow_nonfinite=True)")


def _header_config(path: Path, metadata: dict[str, str]) -> ModelConfig:
    """The config a checkpoint's header metadata declares (CheckpointError naming the file)."""
    if metadata.get("format") != FORMAT:
        raise _fail(path, "is a safetensors file but not a blocklab checkpoint "
                          f"(format={metadata.get('format')!r})")
    if metadata.get("version") != VERSION:
        raise _fail(path, f"checkpoint version {metadata.get('version')!r} is not supported "
                          f"(expected {VERSION})")
    config_dict = _metadata_json(path, metadata, "config", None, (dict,))
    try:
        return from_saved_dict(config_dict)
    except (ValueError, TypeError) as error:
        raise _fail(path, f"invalid config: {error}") from None


def checkpoint_config(path: str | Path) -> ModelConfig:
    """The config of the checkpoint file at ``path``, read from its header: no weight read, nothing built."""
    path = Path(path)
    return _header_config(path, read_safetensors_header(path)[0])


def load_checkpoint(path: str | Path, map_location: str = "cpu", allow_nonfinite: bool = False) -> Checkpoint:
    """Rebuild the model from a checkpoint, validating every key, shape and dtype (from the header, before
    anything is allocated), the digest, and that every weight is finite (unless ``allow_nonfinite``)."""
    path = Path(path)
    metadata, declared = read_safetensors_header(path)
    config = _header_config(path, metadata)
    tokenizer = _metadata_json(path, metadata, "tokenizer", "null", (dict, type(None)))
    meta = _metadata_json(path, metadata, "meta", "{}", (dict,))
    # a header can claim any config: refuse one that cannot fit before building it
    check_memory(config, 1, training=False, what=f"loading {path}", force_flag=False, loading=True)
    model = Transformer(config)
    expected = state_tensors(model)
    check_declared(path, declared, expected)
    try:
        with safe_open(str(path), framework="pt", device=map_location) as f:
            loaded = {key: f.get_tensor(key) for key in expected}
    except SafetensorError as error:
        raise _fail(path, f"corrupt tensor data ({error})") from None
    if DIGEST_KEY not in metadata:
        raise _fail(path, f"has no {DIGEST_KEY} digest, so its integrity cannot be checked; re-save it")
    if content_digest(metadata, loaded) != metadata[DIGEST_KEY]:
        raise _fail(path, f"is corrupt: its content does not match its {DIGEST_KEY} digest (flipped bits?)")
    model.load_state_dict(loaded, strict=False)  # strict on our side: keys were checked above
    refuse_nonfinite(model, path, allow_nonfinite)
    return Checkpoint(model, config, tokenizer, meta)


def load_torch_file(path: str | Path, map_location: str = "cpu") -> Any:
    """A ``torch.save`` file read with ``weights_only=True``: tensors and plain data, never code."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(2, "no such file", str(path))
    try:
        fd = open_to_read(path, "a PyTorch weights file")
    except ValueError as error:
        raise CheckpointError(str(error)) from None
    try:
        with os.fdopen(fd, "rb") as f:  # a file object: torch.load never dispatches on the name
            return torch.load(f, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise _fail(path, f"refused: it holds more than tensors and plain data ({first}); "
                          f"{_NO_PICKLE}") from None
    except (RuntimeError, EOFError, OSError, ValueError) as error:
        raise _fail(path, f"not a readable PyTorch file ({type(error).__name__}: {error}); "
                          "truncated or another format?") from None

