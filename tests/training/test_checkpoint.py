"""Safe loading: corrupt, truncated, foreign and pickle-bearing files are refused by name, never unpickled;
non-finite weights are never written; a header cannot make the loader allocate what does not fit."""

from __future__ import annotations

import json
import pickle
import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from blocklab import Transformer, preset
from blocklab.inspect.nonfinite import (
    NonFiniteError,
)
from blocklab.nn.memory import InsufficientMemoryError
from blocklab.training.checkpoint import (
    CheckpointError,
    load_checkpoint,
    load_torch_file,
    save_checkpoint,
    state_tensors,
)

# ---- checkpoints: corrupt, foreign and malicious files ------------------------------------------


@pytest.fixture
def good(tmp_path: Path) -> Path:
    path = tmp_path / "good.safetensors"
    save_checkpoint(path, Transformer(preset("tiny-lm")), meta={"step": 3})
    return path


def _refused(path: Path, *fragments: str) -> str:
    """Loading ``path`` raises CheckpointError: one line, naming the file and every fragment."""
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(str(path))
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_good_checkpoint_round_trips_bit_for_bit(good: Path) -> None:
    torch.manual_seed(0)
    model = Transformer(preset("tiny-lm"))
    save_checkpoint(good, model, meta={"step": 3})
    loaded = load_checkpoint(good)
    assert loaded.meta == {"step": 3}
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[key], value), key


@pytest.mark.parametrize("keep", [0, 5, 8, 100, "half", "all-but-one"])
def test_truncated_checkpoint_is_refused_with_sizes(good: Path, keep: int | str) -> None:
    data = good.read_bytes()
    n = {"half": len(data) // 2, "all-but-one": len(data) - 1}.get(keep, keep)
    cut = good.with_name("cut.safetensors")
    cut.write_bytes(data[:n])
    if n == 0:
        _refused(cut, "is empty")
    else:
        _refused(cut, "truncated", f"{n} bytes" if n < 8 else str(n))


def test_every_sampled_bit_flip_is_caught(good: Path) -> None:
    """Header-length bytes, header JSON (keys, offsets, metadata) and tensor data: all refused."""
    data = good.read_bytes()
    header_end = 8 + int.from_bytes(data[:8], "little")
    rng = random.Random(9)
    header, tensor_data = range(8, header_end), range(header_end, len(data))
    positions = [*range(8), *rng.sample(header, 70), *rng.sample(tensor_data, 70)]
    flipped = good.with_name("flipped.safetensors")
    for pos in positions:
        corrupt = bytearray(data)
        corrupt[pos] ^= 1 << rng.randrange(8)
        flipped.write_bytes(bytes(corrupt))
        with pytest.raises(CheckpointError, match=re.escape(str(flipped))):
            load_checkpoint(flipped)


def test_flip_in_tensor_data_is_reported_as_digest_mismatch(good: Path) -> None:
    data = bytearray(good.read_bytes())
    data[-3] ^= 0x01  # inside the last tensor: still a well-formed safetensors file
    good.write_bytes(bytes(data))
    _refused(good, "is corrupt", "sha256")


def test_trailing_bytes_are_refused(good: Path) -> None:
    good.write_bytes(good.read_bytes() + b"\0" * 16)
    _refused(good, "16 unexpected bytes")


def test_wrong_format_files_say_what_they_are(tmp_path: Path) -> None:
    model = Transformer(preset("tiny-lm"))
    cases = {
        "torch.pt": ("torch.save", "never unpickles"),
        "array.npy": ("NumPy",),
        "notes.txt": ("text file",),
        "config.json": ("text file",),
        "noise.bin": ("not a safetensors file",),
        "hf.safetensors": ("not a blocklab checkpoint",),
    }
    torch.save(model.state_dict(), tmp_path / "torch.pt")
    np.save(tmp_path / "array.npy", np.zeros(3))
    (tmp_path / "notes.txt").write_text("these are not weights\n" * 20)
    (tmp_path / "config.json").write_text(json.dumps(model.config.to_dict()))
    (tmp_path / "noise.bin").write_bytes(bytes(random.Random(0).randrange(256) for _ in range(4096)))
    save_file(state_tensors(model), tmp_path / "hf.safetensors")
    for name, fragments in cases.items():
        _refused(tmp_path / name, *fragments)
    with pytest.raises(CheckpointError, match="is a folder"):
        load_checkpoint(tmp_path)
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "missing.safetensors")


class _Payload:
    """Unpickling this calls open(marker, "w"): a stand-in for arbitrary code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_pickle_payloads_are_refused_and_never_run(tmp_path: Path) -> None:
    proof = tmp_path / "proof"
    pickle.loads(pickle.dumps(_Payload(proof))).close()  # the payload is live: unpickling runs it
    assert proof.exists()

    marker = tmp_path / "pwned"
    raw = tmp_path / "raw.safetensors"
    raw.write_bytes(pickle.dumps({"weights": _Payload(marker)}))
    zipped = tmp_path / "zipped.safetensors"
    torch.save({"weights": _Payload(marker)}, zipped)  # torch.save's zip with the payload inside
    legacy = tmp_path / "legacy.bin"
    torch.save({"weights": _Payload(marker)}, legacy, _use_new_zipfile_serialization=False)

    _refused(raw, "pickle", "never unpickles")
    _refused(zipped, "torch.save", "never unpickles")
    _refused(legacy, "pickle")
    for path in (raw, zipped, legacy):
        with pytest.raises(CheckpointError, match="refused"):
            load_torch_file(path)  # torch.load(weights_only=True) rejects the callable
    assert not marker.exists()


def test_load_torch_file_reads_plain_tensors(tmp_path: Path) -> None:
    state = {"w": torch.arange(6.0).reshape(2, 3), "step": 7}
    torch.save(state, tmp_path / "state.pt")
    loaded = load_torch_file(tmp_path / "state.pt")
    assert loaded["step"] == 7 and torch.equal(loaded["w"], state["w"])
    (tmp_path / "short.pt").write_bytes((tmp_path / "state.pt").read_bytes()[:100])
    with pytest.raises(CheckpointError, match="short.pt: not a readable PyTorch file"):
        load_torch_file(tmp_path / "short.pt")


def test_wrong_key_and_shape_are_named(tmp_path: Path) -> None:
    model = Transformer(preset("tiny-lm"))
    save_checkpoint(tmp_path / "a.safetensors", model)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "a.safetensors"), "pt") as f:
        metadata = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    missing = dict(tensors)
    del missing["blocks.1.ffn.w1.bias"]
    save_file(missing, tmp_path / "missing.safetensors", metadata)
    _refused(tmp_path / "missing.safetensors", "missing blocks.1.ffn.w1.bias")
    reshaped = {**tensors, "blocks.0.attn.q.weight": torch.zeros(16, 8)}
    save_file(reshaped, tmp_path / "shape.safetensors", metadata)
    _refused(tmp_path / "shape.safetensors", "blocks.0.attn.q.weight has shape (16, 8)", "(16, 16)")


def test_nonfinite_weights_are_never_written_over_a_good_checkpoint(good: Path) -> None:
    before = good.read_bytes()
    model = load_checkpoint(good).model
    with torch.no_grad():
        model.blocks[1].ffn.w2.weight[2, 5] = float("nan")
    with pytest.raises(NonFiniteError, match=r"blocks\.1\.ffn\.w2\.weight \(layer 1, row 2, column 5\)"):
        save_checkpoint(good, model)
    assert good.read_bytes() == before
    assert list(good.parent.glob(".*.tmp")) == []
    save_checkpoint(good.with_name("debug.safetensors"), model, allow_nonfinite=True)  # explicit opt-in



def test_a_header_claiming_a_huge_config_is_refused_before_allocating(good: Path) -> None:
    from safetensors import safe_open

    with safe_open(str(good), "pt") as f:
        metadata, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    metadata["config"] = json.dumps(preset("gpt3-175b").to_dict())  # 650 GB of weights, claimed in 30 KB
    save_file(tensors, good, metadata)
    with pytest.raises(InsufficientMemoryError, match=f"not enough memory: loading {re.escape(str(good))}"):
        load_checkpoint(good)


def test_flipped_bit_in_optimizer_state_is_caught(tmp_path: Path) -> None:
    from blocklab.training.loop import TrainConfig, make_optimizer
    from blocklab.training.state import load_optimizer_state, save_optimizer_state

    model = Transformer(preset("tiny-lm"))
    optimizer = make_optimizer(model, TrainConfig())
    model(torch.randint(0, 6, (2, 4)), torch.randint(0, 6, (2, 4)))[1].backward()
    optimizer.step()
    path = tmp_path / "optimizer.safetensors"
    save_optimizer_state(path, model, optimizer)
    load_optimizer_state(path, model, make_optimizer(model, TrainConfig()))  # intact: loads
    data = bytearray(path.read_bytes())
    data[-7] ^= 0x10  # inside the last exp_avg_sq tensor
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"{re.escape(str(path))}: is corrupt: .* sha256"):
        load_optimizer_state(path, model, make_optimizer(model, TrainConfig()))


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("tokenizer", "[1, 2]", "its tokenizer metadata: must be an object or null, found an array"),
        ("tokenizer", '"vocab"', "its tokenizer metadata: must be an object or null, found a string"),
        ("meta", "3", "its meta metadata: must be an object, found a number"),
        ("config", '["d_model"]', "its config metadata: must be an object, found an array"),
        ("config", '{"d_model": "64"}', "invalid config: ModelConfig.d_model='64' must be an integer >= 1"),
        ("meta", "[" * 100000, "its meta metadata: JSON nested deeper than 64 levels"),
        ("meta", "[" * 65 + "]" * 65, "its meta metadata: JSON nested deeper than 64 levels"),
    ],
)
def test_metadata_of_the_wrong_shape_is_refused_in_one_line(
    good: Path, key: str, value: str, fragment: str
) -> None:
    from safetensors import safe_open

    with safe_open(str(good), "pt") as f:
        metadata, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}  # not a dict
    save_file(tensors, good, {**metadata, key: value})
    _refused(good, fragment)
