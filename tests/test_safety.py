"""Safe loading (corrupt, foreign and pickle-bearing files), NaN/Inf localisation, the memory guard."""

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

from blocklab import ModelConfig, Transformer, preset
from blocklab.checkpoint import (
    CheckpointError,
    load_checkpoint,
    load_torch_file,
    save_checkpoint,
    state_tensors,
)
from blocklab.nonfinite import (
    NonFiniteError,
    check_gradients,
    check_parameters,
    detect_nonfinite,
    find_first_nonfinite,
)
from blocklab.resources import InsufficientMemoryError, available_memory, check_memory, estimate_memory

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


# ---- NaN / Inf: the first stage, layer and position ---------------------------------------------


@pytest.fixture
def model_and_batch() -> tuple[Transformer, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = Transformer(preset("listops-seed"))
    tokens = torch.randint(0, 18, (3, 8))
    return model, tokens, torch.randint(0, 18, (3, 8))


@pytest.mark.parametrize(
    ("stage", "index", "axes"),
    [
        ("embed", (0, 2, 9), "batch 0, token 2, feature 9"),
        ("blocks.0.attn.q", (2, 1, 4, 3), "layer 0, batch 2, head 1, token 4, feature 3"),
        ("blocks.0.resid_mid", (1, 7, 0), "layer 0, batch 1, token 7, feature 0"),
        ("blocks.1.ffn.hidden", (1, 5, 200), "layer 1, batch 1, token 5, feature 200"),
        ("blocks.1.ln2", (2, 0, 63), "layer 1, batch 2, token 0, feature 63"),
        ("logits", (0, 6, 17), "batch 0, token 6, vocab 17"),
    ],
)
def test_injected_nan_is_localised_to_its_stage(model_and_batch, stage, index, axes) -> None:
    model, tokens, targets = model_and_batch

    def inject(x: torch.Tensor, name: str) -> torch.Tensor:
        x = x.clone()
        x[index] = float("nan")
        return x

    with model.hooks({stage: inject}):
        event = find_first_nonfinite(model, tokens, targets)
        with pytest.raises(NonFiniteError) as info, detect_nonfinite(model):
            model(tokens, targets)
    assert (event.kind, event.name, event.index) == ("activation", stage, index)
    assert event.layer == (int(stage.split(".")[1]) if stage.startswith("blocks") else None)
    assert event.position == index[2 if ".attn.q" in stage else 1]
    assert str(info.value) == event.describe() == f"nan in activation {stage} ({axes})"


def test_nan_in_attention_scores_is_found_on_the_explicit_path(model_and_batch) -> None:
    model, tokens, targets = model_and_batch

    def inject(x: torch.Tensor, name: str) -> torch.Tensor:
        x = x.clone()
        x[1, 2, 3, 4] = float("inf")
        return x

    with model.hooks({"blocks.1.attn.scores": inject}):
        event = find_first_nonfinite(model, tokens, targets)
    # softmax turns one +inf score into a NaN row downstream; the first stage is the scores
    assert (event.name, event.index, event.value) == ("blocks.1.attn.scores", (1, 2, 3, 4), float("inf"))
    assert "query 3, key 4" in event.describe()


def test_overflow_is_localised_where_the_arithmetic_overflows(model_and_batch) -> None:
    """|x| ~ 1 after the embedding; q = x W^T with W = 1e38 exceeds float32's 3.4e38 in q first."""
    model, tokens, targets = model_and_batch
    with torch.no_grad():
        model.blocks[1].attn.q.weight.fill_(1e38)
    event = find_first_nonfinite(model, tokens, targets)
    assert event.kind == "activation" and event.name == "blocks.1.attn.q" and abs(event.value) == float("inf")


def test_nonfinite_gradient_is_localised_in_backward_order(model_and_batch) -> None:
    model, tokens, targets = model_and_batch

    def poison_grad(x: torch.Tensor, name: str) -> None:
        x.register_hook(lambda g: torch.where(torch.arange(g.numel()).view_as(g) == 70, float("nan"), g))

    with model.hooks({"blocks.0.ffn.hidden": poison_grad}):
        event = find_first_nonfinite(model, tokens, targets)
        _, loss = model(tokens, targets)
        loss.backward()
    assert (event.kind, event.name, event.index) == ("gradient", "blocks.0.ffn.hidden", (0, 0, 70))
    # the NaN spreads to the gradient of every parameter upstream of block 0's FFN, none downstream
    bad = {n for n, p in model.named_parameters() if not torch.isfinite(p.grad).all()}
    upstream = {n for n, _ in model.named_parameters()
                if n == "embed.weight" or re.match(r"blocks\.0\.(attn|ln1|ffn\.w1)\.", n)}
    assert bad == upstream
    assert check_gradients(model).name == "embed.weight" and check_parameters(model) is None


def test_parameter_check_names_the_first_bad_parameter(model_and_batch) -> None:
    model, tokens, targets = model_and_batch
    assert check_parameters(model) is None and find_first_nonfinite(model, tokens, targets) is None
    with torch.no_grad():
        model.blocks[1].ln1.weight[7] = float("-inf")
        model.blocks[0].attn.o.bias[3] = float("nan")
    event = find_first_nonfinite(model, tokens, targets)
    assert (event.kind, event.name, event.index) == ("parameter", "blocks.0.attn.o.bias", (3,))


def test_detector_does_not_change_the_numbers(model_and_batch) -> None:
    model, tokens, targets = model_and_batch
    _, plain = model(tokens, targets)
    plain.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with detect_nonfinite(model) as detector:
        _, watched = model(tokens, targets)
        watched.backward()
    assert detector.events == [] and torch.equal(plain, watched)
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters(), strict=True))


# ---- memory guard -------------------------------------------------------------------------------


def _peak_step_bytes(model: Transformer, tokens: torch.Tensor) -> int:
    """Peak bytes allocated during one steady-state AdamW step, from PyTorch's profiler."""
    from torch.profiler import ProfilerActivity, profile

    optimizer = torch.optim.AdamW(model.parameters())
    for step in range(2):  # step 0 creates the optimizer state; profile step 1
        if step:
            prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            prof.__enter__()
        _, loss = model(tokens, tokens)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    prof.__exit__(None, None, None)
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    now = peak = 0
    for event in events:
        now += event.nbytes()
        peak = max(peak, now)
    return peak


@pytest.mark.parametrize(
    "config",
    [
        ModelConfig(vocab_size=50, max_seq_len=64, d_model=128, n_heads=4, n_layers=3, d_ff="8/3x",
                    activation="swiglu", norm_position="pre"),
        pytest.param(ModelConfig(vocab_size=500, max_seq_len=64, d_model=128, n_heads=4, n_layers=2, d_ff=512,
                                 causal=True, checkpoint_blocks=True), marks=pytest.mark.slow),
    ],
)
def test_memory_estimate_is_close_to_the_profiled_peak(config: ModelConfig) -> None:
    model = Transformer(config)
    estimate = estimate_memory(config, batch_size=4)
    assert estimate.parameters == 4 * sum(p.numel() for p in model.parameters()) + 4 * sum(
        b.numel() for b in model.buffers())
    assert estimate.optimizer == 2 * estimate.gradients == 2 * 4 * sum(p.numel() for p in model.parameters())
    measured = _peak_step_bytes(model, torch.randint(0, config.vocab_size, (4, config.max_seq_len)))
    ratio = (estimate.gradients + estimate.activations) / measured
    assert 0.85 <= ratio <= 1.6, (ratio, measured)


def test_guard_refuses_what_cannot_fit_and_force_overrides() -> None:
    available = available_memory()
    assert available is not None and 0 < available[0]
    with pytest.raises(InsufficientMemoryError) as info:
        check_memory(preset("gpt3-175b"), batch_size=8, what="gpt3-175b")
    message = str(info.value)
    assert "needs about" in message and "parameters 650.5 GB" in message and "--force" in message
    assert check_memory(preset("gpt3-175b"), batch_size=8, force=True).total > available[0]
    assert check_memory(preset("listops-seed"), batch_size=256).total < 50 * 2**20


def test_a_header_claiming_a_huge_config_is_refused_before_allocating(good: Path) -> None:
    from safetensors import safe_open

    with safe_open(str(good), "pt") as f:
        metadata, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    metadata["config"] = json.dumps(preset("gpt3-175b").to_dict())  # 650 GB of weights, claimed in 30 KB
    save_file(tensors, good, metadata)
    with pytest.raises(InsufficientMemoryError, match=f"not enough memory: loading {re.escape(str(good))}"):
        load_checkpoint(good)


# ---- the trainer under --detect-nonfinite --------------------------------------------------------


def _train_tiny(out: Path, callbacks=(), **train_fields):  # noqa: ANN202 - TrainResult
    from blocklab.tasks import get_task
    from blocklab.train import TrainConfig, train

    task = get_task("tiny-lm")
    fields = {"steps": 6, "warmup": 0, "eval_every": 100, "target_accuracy": None, **train_fields}
    config = TrainConfig(**fields)
    return train(preset("tiny-lm", **task.config_overrides()), config, task, out, callbacks=callbacks,
                 report=False, detect_nonfinite=True)


def _checkpoint_steps(out: Path) -> list[int]:
    from blocklab.runfolder import checkpoint_dirs

    return [step for step, _ in checkpoint_dirs(out)]


def test_nan_mid_training_stops_at_its_stage_and_checkpoints_the_last_good_weights(tmp_path: Path) -> None:
    from blocklab.hooks import hook_points
    from blocklab.runfolder import MODEL_FILE, latest_checkpoint, read_metrics
    from blocklab.train import TrainingDiverged

    def poison(x: torch.Tensor, name: str) -> torch.Tensor:
        x = x.clone()
        x[2, 1, 40] = float("nan")
        return x

    def inject_after_step_3(ctx) -> None:  # noqa: ANN001 - StepContext
        if ctx.step == 3:  # from step 4 on, the FFN pre-activation of layer 1 carries a NaN
            hook_points(ctx.model)["blocks.1.ffn.hidden"].fns.append(poison)

    with pytest.raises(TrainingDiverged) as info:
        _train_tiny(tmp_path, callbacks=[inject_after_step_3], checkpoint_every=100)
    message = str(info.value)
    assert "step 4: nan in activation blocks.1.ffn.hidden (layer 1, batch 2, token 1, feature 40)" in message
    assert message.endswith(f"the last good checkpoint is {tmp_path / 'checkpoints' / 'step-000003'}")
    assert _checkpoint_steps(tmp_path) == [3]  # written at the stop: checkpoint_every would not have
    model = load_checkpoint(latest_checkpoint(tmp_path) / MODEL_FILE).model
    _train_tiny(tmp_path / "reference", checkpoint_every=3)  # the same run without the NaN
    reference = load_checkpoint(tmp_path / "reference" / "checkpoints" / "step-000003" / MODEL_FILE).model
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference.state_dict().values(),
                                                  strict=True))
    assert read_metrics(tmp_path)[-1]["nonfinite"].startswith("nan in activation blocks.1.ffn.hidden")


def test_nonfinite_weights_after_an_update_keep_the_previous_checkpoint(tmp_path: Path) -> None:
    from blocklab.train import TrainingDiverged

    def poison_weight(ctx) -> None:  # noqa: ANN001 - StepContext
        if ctx.step == 3:
            with torch.no_grad():
                ctx.model.blocks[1].ffn.w2.weight[0, 5] = float("nan")

    with pytest.raises(TrainingDiverged) as info:
        _train_tiny(tmp_path, callbacks=[poison_weight], checkpoint_every=2)
    message = str(info.value)
    assert "step 3: nan in parameter blocks.1.ffn.w2.weight (layer 1, row 0, column 5) (after the" in message
    assert message.endswith(f"the last good checkpoint is {tmp_path / 'checkpoints' / 'step-000002'}")
    assert _checkpoint_steps(tmp_path) == [2]


def test_overflow_from_a_huge_learning_rate_is_named_where_it_overflows(tmp_path: Path) -> None:
    """After one AdamW step with lr 1e30 the weights are ~1e30: the embedding is still finite, and
    the first product of two of them, q = x Wq^T in layer 0, exceeds float32's 3.4e38."""
    from blocklab.train import TrainingDiverged

    with pytest.raises(TrainingDiverged, match=r"step 2: inf in activation blocks\.0\.attn\.q \(layer 0"):
        _train_tiny(tmp_path, lr=1e30, checkpoint_every=100)
    assert _checkpoint_steps(tmp_path) == [1]


def test_flipped_bit_in_optimizer_state_is_caught(tmp_path: Path) -> None:
    from blocklab.train import TrainConfig, make_optimizer
    from blocklab.trainstate import load_optimizer_state, save_optimizer_state

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


def test_detect_nonfinite_is_refused_under_torchrun_before_joining(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun sets it; nothing may block waiting for rank 1
    with pytest.raises(ValueError, match="--detect-nonfinite needs a single process"):
        _train_tiny(tmp_path)
    assert not (tmp_path / "config.json").exists()
