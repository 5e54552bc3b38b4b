"""NaN/Inf: the first stage, layer and position, in the forward and backward pass, and the trainer's
--detect-nonfinite stop that keeps the last good weights."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from blocklab import Transformer, preset
from blocklab.inspect.nonfinite import (
    NonFiniteError,
    check_gradients,
    check_parameters,
    detect_nonfinite,
    find_first_nonfinite,
)
from blocklab.training.checkpoint import (
    load_checkpoint,
)

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


# ---- the trainer under --detect-nonfinite --------------------------------------------------------


def _train_tiny(out: Path, callbacks=(), **train_fields):  # TrainResult
    from blocklab.tasks import get_task
    from blocklab.training.loop import TrainConfig, train

    task = get_task("tiny-lm")
    fields = {"steps": 6, "warmup": 0, "eval_every": 100, "target_accuracy": None, **train_fields}
    config = TrainConfig(**fields)
    return train(preset("tiny-lm", **task.config_overrides()), config, task, out, callbacks=callbacks,
                 report=False, detect_nonfinite=True)


def _checkpoint_steps(out: Path) -> list[int]:
    from blocklab.training.runfiles import checkpoint_dirs

    return [step for step, _ in checkpoint_dirs(out)]


def test_nan_mid_training_stops_at_its_stage_and_checkpoints_the_last_good_weights(tmp_path: Path) -> None:
    from blocklab.files.folders import MODEL_FILE
    from blocklab.nn.hooks import hook_points
    from blocklab.training.loop import TrainingDiverged
    from blocklab.training.runfiles import latest_checkpoint, read_metrics

    def poison(x: torch.Tensor, name: str) -> torch.Tensor:
        x = x.clone()
        x[2, 1, 40] = float("nan")
        return x

    def inject_after_step_3(ctx) -> None:  # StepContext
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
    from blocklab.training.loop import TrainingDiverged

    def poison_weight(ctx) -> None:  # StepContext
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
    from blocklab.training.loop import TrainingDiverged

    with pytest.raises(TrainingDiverged, match=r"step 2: -?inf in activation blocks\.0\.attn\.q \(layer 0"):
        _train_tiny(tmp_path, lr=1e30, checkpoint_every=100)
    assert _checkpoint_steps(tmp_path) == [1]


def test_detect_nonfinite_is_refused_under_torchrun_before_joining(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun sets it; nothing may block waiting for rank 1
    with pytest.raises(ValueError, match="--detect-nonfinite needs a single process"):
        _train_tiny(tmp_path)
    assert not (tmp_path / "config.json").exists()


# ---- finite weights that overflow float32: no NaN returned as a result --------------------------------


@pytest.fixture(scope="module")
def overflowing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny-lm checkpoint whose blocks.0.ffn.w1 is filled with 3e38: every weight finite (the weight
    guard passes it, the digest is valid), the forward overflowing float32 (issue 35, F4)."""
    from blocklab.tasks import get_task
    from blocklab.training.checkpoint import save_checkpoint

    task = get_task("tiny-lm")
    torch.manual_seed(0)
    model = Transformer(preset("tiny-lm", **task.config_overrides()))
    with torch.no_grad():
        model.blocks[0].ffn.w1.weight.fill_(3e38)
    assert check_parameters(model) is None
    tokens = torch.tensor([task.tokenizer.encode("<BOS> I like")])
    assert not torch.isfinite(torch.nn.functional.linear(  # the overflow, by hand: 3e38 x 16 features
        torch.ones(model.config.d_model), model.blocks[0].ffn.w1.weight)).all()
    assert not torch.isfinite(model(tokens)).all()  # the plain forward's logits
    path = tmp_path_factory.mktemp("overflow") / "model.safetensors"
    save_checkpoint(path, model, tokenizer=task.tokenizer.to_dict())
    return path


@pytest.mark.parametrize("command", [
    ["generate", "--input", "<BOS> I", "--max-new-tokens", "3"],  # greedy returned id 0, exit 0
    ["generate", "--input", "<BOS> I", "--max-new-tokens", "3", "--sample"],  # an internal error
    ["generate", "--input", "<BOS> I", "--max-new-tokens", "3", "--json", "-"],
    ["embed", "--input", "<BOS> I like", "--input", "I"],  # +nan embeddings and cosines, exit 0
    ["trace", "--input", "<BOS> I like", "-q"],  # "cannot convert float NaN to integer"
    ["predict", "--input", "<BOS> I like"],
])
def test_a_forward_that_overflows_is_refused_naming_its_first_non_finite_stage(
        overflowing: Path, command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from blocklab.cli import main

    assert main([command[0], "--model", str(overflowing), *command[1:]]) == 2
    out, err = capsys.readouterr()
    assert out == ("<BOS> I\n" if command[0] == "generate" and "--json" not in command else "")  # the prompt
    assert re.fullmatch(r"blocklab: error: -?(nan|inf) in activation blocks\.0\.ffn\.hidden \(layer 0, "
                        r"batch 0, token 0, .*\); the (logits|sentence embeddings) are not finite, so there "
                        r"is no result to give\n", err), err
