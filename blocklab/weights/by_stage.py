"""A model's weights named by stage, in a file a learner can write and edit (JSON or safetensors).

The names are the tutorials' and the tracer's, the matrices in PyTorch's layout (``(out, in)``:
``y = x W^T + b``, SPEC.md's convention)::

    embedding                 (vocab, d_model)     the token table E (x0 = E[t] (* scale) + PE[p])
    positions                 (max_seq_len, d)     learned positions only (sinusoidal ones are no weights)
    blocks.0.attn.Wq          (h d_k, d_model)     or per head: blocks.0.attn.Wq.h0 (d_k, d_model), ...
    blocks.0.attn.bq          (h d_k,)             or per head: blocks.0.attn.bq.h0 (d_k,)
    blocks.0.attn.Wk, Wv, bk, bv                   as Wq (their head count is n_kv_heads)
    blocks.0.attn.Wo          (d_model, h d_k)     or per head: blocks.0.attn.Wo.h0 (d_model, d_k), head 0's
                                                   columns; bo (d_model,) is added once, never per head
    blocks.0.ffn.W1, b1, W2, b2 (W3 for a gated FFN)
    blocks.0.ln1.gamma, blocks.0.ln1.beta          each norm's scale and shift (ln_f, embed_ln likewise)
    W_vocab                   (vocab, d_model)     the head (absent when tied to the embedding)

Any other parameter keeps its PyTorch name (``blocks.0.res1.scale``: ReZero's alpha). ``weights_by_stage``
names a model's weights so; ``set_weights_by_stage`` copies such a dict into a model, refusing any entry
missing, misshaped or unknown by name; ``read_weights_file`` / ``write_weights_file`` read and write them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor, nn

from ..files.folders import write_output_file
from ..files.jsonfiles import parse_json
from ..files.reading import read_regular_bytes

# PyTorch's parameter name -> the stage name (a regular expression and its replacement), first match wins
RENAMES: tuple[tuple[str, str], ...] = (
    (r"^embed\.weight$", "embedding"),
    (r"^pos\.weight$", "positions"),
    (r"^head\.weight$", "W_vocab"),
    (r"^(.*\.attn)\.([qkvo])\.weight$", r"\1.W\2"),
    (r"^(.*\.attn)\.([qkvo])\.bias$", r"\1.b\2"),
    (r"^(.*\.ffn)\.w(\d)\.weight$", r"\1.W\2"),
    (r"^(.*\.ffn)\.w(\d)\.bias$", r"\1.b\2"),
)
NORM_RENAMES = {"weight": "gamma", "bias": "beta"}  # a norm module's parameters
HEAD_SPLIT = re.compile(r"\.attn\.(W|b)([qkvo])$")  # the entries that may be given per head
WEIGHTS_LIMIT = 1 << 30  # a weights file read whole: a learner's model, not a checkpoint of billions
FILE_KINDS = ".json or .safetensors"


def _stage_name(param: str, module: nn.Module) -> str:
    """The stage name of parameter ``param`` of ``model`` (``module`` is the module that owns it)."""
    for pattern, replacement in RENAMES:
        if re.match(pattern, param):
            return re.sub(pattern, replacement, param)
    owner, _, leaf = param.rpartition(".")
    if hasattr(module, "stats") and leaf in NORM_RENAMES:  # a norm: LayerNorm, RMSNorm (nn/norms.py)
        return f"{owner}.{NORM_RENAMES[leaf]}" if owner else NORM_RENAMES[leaf]
    return param


def stage_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """Every parameter of ``model`` by its stage name (tied ones once, under the first name)."""
    found = {}
    for name, param in model.named_parameters():
        owner = name.rpartition(".")[0]
        found[_stage_name(name, model.get_submodule(owner) if owner else model)] = param
    return found


def _heads(model: nn.Module, name: str) -> tuple[int, int, bool] | None:
    """For an attention entry that may be split per head (``blocks.0.attn.Wq``): its head count, d_k and
    whether a head is a block of columns (Wo) rather than of rows; None for any other entry."""
    found = HEAD_SPLIT.search(name)
    if found is None or (found.group(1), found.group(2)) == ("b", "o"):
        return None
    attn = model.get_submodule(name[: found.start()] + ".attn")
    n = attn.n_kv_heads if found.group(2) in "kv" else attn.n_heads
    return n, attn.d_k, found.group(2) == "o"


def weights_by_stage(model: nn.Module, per_head: bool = True) -> dict[str, Tensor]:
    """The model's weights by stage name (module docstring), detached float64 copies; with ``per_head``
    attention's matrices and biases one entry per head (``blocks.0.attn.Wq.h0``), as the tutorials show."""
    named: dict[str, Tensor] = {}
    for name, param in stage_parameters(model).items():
        value = param.detach().to("cpu", torch.float64).clone()
        split = _heads(model, name) if per_head else None
        if split is None:
            named[name] = value
            continue
        n, d_k, columns = split
        for h, part in enumerate(value.split(d_k, dim=1 if columns else 0)):
            named[f"{name}.h{h}"] = part.clone()
    return named


def _joined(model: nn.Module, weights: Mapping[str, Tensor], params: Mapping[str, nn.Parameter]
            ) -> tuple[dict[str, Tensor], list[str]]:
    """``weights`` with per-head entries (``.h0``, ``.h1``, ...) joined into their whole matrix; the
    problems found joining them (a head missing or misshaped, an entry given both whole and per head)."""
    joined, problems, parts = {}, [], {}
    for key, value in weights.items():
        base, _, head = key.rpartition(".h")
        if base in params and head.isdigit() and _heads(model, base) is not None:
            parts.setdefault(base, {})[int(head)] = value
        else:
            joined[key] = value
    for base, heads in parts.items():
        n, d_k, columns = _heads(model, base)
        full = tuple(params[base].shape)
        one = (full[0], d_k) if columns else (d_k, *full[1:])
        if base in joined:
            problems.append(f"{base} is given both whole and per head; give one")
            continue
        wrong = sorted(set(heads) - set(range(n)))
        lacking = [f"{base}.h{h}" for h in range(n) if h not in heads]
        bad = [f"{base}.h{h} is {_shape(v)}, expected {_shape(one)}" for h, v in sorted(heads.items())
               if h < n and tuple(v.shape) != one]
        problems += [f"{base}.h{h} is no head: the model has heads h0..h{n - 1}" for h in wrong]
        problems += [f"missing {name}" for name in lacking] + bad
        if not (wrong or lacking or bad):
            joined[base] = torch.cat([heads[h] for h in range(n)], dim=1 if columns else 0)
    return joined, problems


def _shape(value: Tensor | tuple[int, ...]) -> str:
    shape = tuple(value.shape) if isinstance(value, Tensor) else value
    return f"({shape[0]},)" if len(shape) == 1 else f"({', '.join(map(str, shape))})"


def _misshaped(name: str, value: Tensor, expected: tuple[int, ...]) -> str:
    """Why an entry does not fit: its shape and the one expected, naming the transpose when it is one."""
    hint = ""
    if value.dim() == 2 and tuple(value.shape[::-1]) == expected and expected[0] != expected[1]:
        hint = " (that is the transpose: matrices are (out, in), y = x W^T + b)"
    return f"{name} is {_shape(value)}, expected {_shape(expected)}{hint}"


def set_weights_by_stage(model: nn.Module, weights: Mapping[str, Tensor],
                         source: str = "the weights") -> None:
    """Copy ``weights`` (stage name -> tensor, whole or per head) into ``model``; ValueError listing every
    entry missing, misshaped or unknown (nothing is copied then)."""
    params = stage_parameters(model)
    joined, problems = _joined(model, weights, params)
    for name in joined:
        if name not in params:
            why = " (the positions are the fixed sinusoidal code, no weights)" if name == "positions" else ""
            problems.append(f"unknown entry {name}{why}")
    problems += [f"missing {name}" for name in params if name not in joined
                 and not any(k.startswith(f"{name}.h") for k in weights)]
    problems += [_misshaped(name, joined[name], tuple(p.shape)) for name, p in params.items()
                 if name in joined and tuple(joined[name].shape) != tuple(p.shape)]
    problems += [f"{name} holds a value that is not finite" for name, v in joined.items()
                 if name in params and not bool(torch.isfinite(v).all())]
    if problems:
        shown = "; ".join(problems[:8]) + (f"; and {len(problems) - 8} more" if len(problems) > 8 else "")
        raise ValueError(f"{source} do not fit the model: {shown}. "
                         "'blocklab trace --write-weights FILE' writes every entry the model takes")
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(joined[name].to(param.dtype))


def read_weights_file(path: str | Path) -> dict[str, Tensor]:
    """The entries of a weights file (``.json``: an object of name -> number or nested arrays of numbers;
    ``.safetensors``: its tensors), as float64 tensors; ValueError naming the file and the entry at fault."""
    path = Path(path)
    data = read_regular_bytes(path, "weights file", WEIGHTS_LIMIT)
    if path.suffix == ".safetensors":
        from safetensors.torch import load as load_safetensors

        try:
            return {k: v.to(torch.float64) for k, v in load_safetensors(data).items()}
        except Exception as e:  # safetensors raises its own error types for a damaged header
            raise ValueError(f"{path}: not a readable safetensors file ({e})") from None
    if path.suffix != ".json":
        raise ValueError(f"{path}: a weights file is {FILE_KINDS}")
    is_object = lambda value: None if isinstance(value, dict) else \
        "a weights file holds one JSON object of name -> array of numbers"
    entries = parse_json(data, str(path), is_object)  # strict, depth-capped JSON: one line when it is not
    return {name: _tensor(path, name, value) for name, value in entries.items()}


def _tensor(path: Path, name: str, value: object) -> Tensor:
    """One JSON entry as a float64 tensor; ValueError naming it when it is no rectangular array of numbers."""
    def numbers(v: object) -> bool:
        return (isinstance(v, (int, float)) and not isinstance(v, bool)) or (
            isinstance(v, list) and all(numbers(x) for x in v))

    if numbers(value):
        try:
            return torch.tensor(value, dtype=torch.float64)
        except (ValueError, TypeError):
            pass
    raise ValueError(f"{path}: entry {name} is not a number or a rectangular array of numbers")


def write_weights_file(path: str | Path, weights: Mapping[str, Tensor], flag: str = "path") -> None:
    """Write ``weights`` (``weights_by_stage``) to ``path``, .json or .safetensors (``weights_file_bytes``);
    an existing file of another kind than a weights file is refused (``check_output_file``)."""
    write_output_file(path, weights_file_bytes(path, weights), flag=flag)


def weights_file_bytes(path: str | Path, weights: Mapping[str, Tensor]) -> bytes:
    """The bytes of a weights file for ``weights`` in the format ``path``'s suffix names: JSON with one
    matrix row per line, to be read and edited; or safetensors."""
    suffix = Path(path).suffix
    if suffix == ".safetensors":
        from safetensors.torch import save

        return save({k: v.contiguous() for k, v in weights.items()})
    if suffix != ".json":
        raise ValueError(f"{path}: a weights file is {FILE_KINDS}")
    lines = [f"  {json.dumps(name)}: {_json_value(value)}" for name, value in weights.items()]
    return ("{\n" + ",\n".join(lines) + "\n}\n").encode()


def _json_value(value: Tensor) -> str:
    """A tensor as JSON, a matrix one row per line (float64 values written exactly)."""
    if value.dim() < 2:
        return json.dumps(value.tolist())
    rows = ",\n    ".join(json.dumps(row) for row in value.tolist())
    return f"[\n    {rows}\n  ]"
