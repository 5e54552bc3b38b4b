"""Tests for blocklab.cli.explore: which models the flags name (the server itself: tests/explore)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import blocklab as bl
from blocklab.cli import build_parser
from blocklab.cli.defaults import SHIPPED_LM
from blocklab.cli.explore import models_for_args
from blocklab.errors import UsageError


def served(*flags: str) -> dict:
    return models_for_args(build_parser().parse_args(["explore", *flags]))


def test_vary_serves_each_variant_of_the_preset_with_the_same_seed() -> None:
    models = served("--preset", "listops-seed", "--seed", "3", "--vary", "norm_position=post,pre,sandwich",
                    "--d-ff", "128")
    assert list(models) == ["listops-seed", "listops-seed norm_position=pre",
                            "listops-seed norm_position=sandwich"]
    tokens = torch.tensor([[11, 15, 2, 17]])
    for name, fields in (("listops-seed", {}),
                         ("listops-seed norm_position=sandwich", {"norm_position": "sandwich"})):
        torch.manual_seed(3)
        oracle = bl.Transformer(bl.preset("listops-seed", d_ff=128, **fields)).eval()
        with torch.no_grad():
            assert torch.equal(models[name].subject.model(tokens), oracle(tokens))
    assert models["listops-seed norm_position=pre"].subject.model.config.norm_position == "pre"


@pytest.mark.parametrize(("vary", "field", "values"), [("residual=add,none", "residual", ["add", "none"]),
                                                     ("norm=standard,none", "norm", ["standard", "none"])])
def test_vary_serves_the_none_ablations_beside_the_preset(vary: str, field: str, values: list[str]) -> None:
    """The docs' with-and-without-the-residual comparison: both values served, not add twice."""
    models = served("--preset", "listops-seed", "--vary", vary)
    assert [m.subject.model.config.__getattribute__(field) for m in models.values()] == values


def test_no_flag_serves_the_shipped_model_a_flag_listops_seed_and_names_stay_unique() -> None:
    assert list(served()) == ["coriolanus-char-lm.safetensors"]
    varied = ["listops-seed", "listops-seed norm_position=pre"]
    assert list(served("--vary", "norm_position=pre,post")) == varied
    assert list(served("--preset", "tiny-lm", "--preset", "tiny-lm")) == ["tiny-lm", "tiny-lm (2)"]


@pytest.mark.parametrize("flags, message", [
    (["--vary", "lr=1e-3,1e-2"], "explore varies ModelConfig fields only"),
    (["--preset", "nope"], "unknown preset 'nope'"),
    (["--vary", "norm_position=pre,bogus"], "norm_position"),
])
def test_bad_model_flags_are_refused_before_serving(flags: list[str], message: str) -> None:
    with pytest.raises((ValueError, UsageError), match=message):
        served(*flags)


def test_the_models_are_summed_against_the_memory_before_any_is_built() -> None:
    """Issue 35, F6: each model was checked against the available memory on its own, so a grid of models
    that each fit was built one after another until the machine ran out. Here six variants each need
    between a quarter and a half of what is available (each passes the check alone; the preset as built
    is one of them, post-norm with tied embeddings): refused before building, naming the total."""
    from blocklab.inspect.trace.subject import preset_config
    from blocklab.nn.memory import InsufficientMemoryError, available_memory, estimate_memory

    found = available_memory()
    if found is None:
        pytest.skip("this machine does not say how much memory is available")
    available = found[0]
    need = lambda d: estimate_memory(preset_config("listops-seed", {"d_model": d, "d_ff": 4 * d}), 1,
                                     training=False).total
    d = 64
    while need(d) < available / 4:
        d *= 2
    assert need(d) < available / 2 < 6 * need(d)  # each fits alone; the six do not
    with pytest.raises(InsufficientMemoryError, match=r"explore's 6 preset models need about .* in total"):
        served("--d-model", str(d), "--d-ff", str(4 * d), "--vary", "norm_position=pre,post,sandwich",
               "--vary", "tie_embeddings=true,false")


@pytest.fixture
def two_files(tmp_path):
    """A blocklab checkpoint (tiny-lm at d_model 64) and a Hugging Face GPT-2 folder written by
    transformers, with the configs they hold (the checkpoint's from the model written, GPT-2's by hand)."""
    import transformers

    from blocklab.training.checkpoint import save_checkpoint

    torch.manual_seed(0)
    ours = bl.Transformer(bl.preset("tiny-lm", d_model=64, d_ff=256))
    save_checkpoint(tmp_path / "tiny.safetensors", ours)
    hf = transformers.GPT2Config(vocab_size=320, n_positions=64, n_embd=32, n_layer=2, n_head=2)
    transformers.GPT2LMHeadModel(hf).save_pretrained(str(tmp_path / "gpt2-small"))
    gpt2 = bl.ModelConfig(vocab_size=320, max_seq_len=64, d_model=32, n_layers=2, n_heads=2, d_ff=128,
                          activation="gelu_tanh", norm_position="pre", pos_encoding="learned",
                          tie_embeddings=True, causal=True)
    return tmp_path, {"tiny.safetensors": ours.config, "gpt2-small": gpt2}, ours


def test_models_given_by_path_are_summed_from_their_headers_before_any_weight_is_read(two_files,
                                                                                         monkeypatch) -> None:
    """Issue 35, F6 for --model: each file was checked alone as it was loaded. Their configs are read
    from the checkpoint's header and the folder's config.json; with a budget that each fits alone but not
    the two with the preset, the one-line refusal names the total, each model's share (inference, one
    sequence) and the second copy of the larger file's weights while it is read, before any is read."""
    from blocklab.inspect.trace.subject import preset_config
    from blocklab.nn.memory import InsufficientMemoryError, estimate_memory, format_bytes

    folder, configs, written = two_files
    configs = {"listops-seed": preset_config("listops-seed", {}), **configs}
    held = {name: estimate_memory(c, 1, training=False).total for name, c in configs.items()}
    # the copy read from a file: its float32 parameters once more (P counted from the weights transformers
    # wrote for GPT-2, tied head counted once; ours from the model written)
    gpt2_params = sum(p.numel() for p in transformers_gpt2(folder / "gpt2-small").parameters())
    assert estimate_memory(configs["gpt2-small"], 1, training=False, loading=True).total \
        - held["gpt2-small"] == 4 * gpt2_params
    copies = {"tiny.safetensors": 4 * bl.count_parameters(configs["tiny.safetensors"]).total,
              "gpt2-small": 4 * gpt2_params}
    larger = max(copies, key=copies.__getitem__)
    total = sum(held.values()) + copies[larger]
    budget = total - 1
    assert max(held[n] + copies.get(n, 0) for n in held) < budget  # each alone passes its own check
    monkeypatch.setattr("blocklab.nn.memory.available_memory", lambda: (budget, "a test limit"))
    monkeypatch.setattr("blocklab.weights.load.read", lambda *a, **k: pytest.fail("weights read"))
    flags = ["--preset", "listops-seed", "--model", str(folder / "tiny.safetensors"),
             "--model", str(folder / "gpt2-small")]
    with pytest.raises(InsufficientMemoryError) as refused:
        served(*flags)
    shares = ", ".join(f"{name} {format_bytes(held[name])}" for name in configs)
    copy = format_bytes(copies[larger])
    assert str(refused.value) == (
        f"not enough memory: explore's 1 preset model and 2 --model models need about {format_bytes(total)} "
        f"in total ({shares}; reading {larger}'s weights holds a second copy, {copy}) "
        f"but {format_bytes(budget)} is available (a test limit); serve fewer (--preset, --vary, --model) or "
        "smaller ones")
    monkeypatch.undo()
    monkeypatch.setattr("blocklab.nn.memory.available_memory", lambda: (total, "a test limit"))
    models = served(*flags)  # exactly enough: all three served, the files' weights as written
    assert list(models) == list(configs)
    loaded = models["tiny.safetensors"].subject.model.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in written.state_dict().items())
    with torch.no_grad():
        tokens = torch.tensor([[1, 2, 3]])
        expected = transformers_gpt2(folder / "gpt2-small")(tokens).logits
        assert torch.allclose(models["gpt2-small"].subject.model(tokens), expected, atol=1e-5)


def transformers_gpt2(folder):
    import transformers

    return transformers.GPT2LMHeadModel.from_pretrained(str(folder)).eval()


RANDOM = ("the weights are random: preset listops-seed drawn with seed 0, not trained, so what it predicts "
          "means nothing")


def test_with_nothing_named_explore_serves_the_readmes_run_when_it_exists(main_run_folder) -> None:
    models = served()
    assert list(models) == ["listops"]
    subject = models["listops"].subject
    assert str(main_run_folder) in subject.source and subject.notes == [] and subject.next_token


def test_without_the_run_explore_serves_the_shipped_language_model_and_says_so_and_how_to_train() -> None:
    models = served()
    assert list(models) == ["coriolanus-char-lm.safetensors"]
    subject = models["coriolanus-char-lm.safetensors"].subject
    assert str(SHIPPED_LM) in subject.source and subject.next_token
    (shipped,) = subject.notes
    assert shipped.startswith("this is the character-level language model blocklab ships")
    assert "There is no trained model in " in shipped and "`blocklab train`" in shipped
    named = served("--preset", "listops-seed")["listops-seed"]  # named: the run is not sought
    assert named.subject.notes == [RANDOM]


def test_explore_prints_the_notes_of_what_it_serves_in_the_terminal(tmp_path) -> None:
    """Started in a folder without the README's run: the terminal says it serves the language model blocklab
    ships, and how to train the README's model."""
    pytest.importorskip("uvicorn")
    proc = subprocess.Popen([sys.executable, "-m", "blocklab", "explore", "--port", "0"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(bl.__file__).parent.parent)})
    try:
        lines = [proc.stdout.readline() for _ in range(2)]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert lines[0].startswith("blocklab explore: 1 model (coriolanus-char-lm.safetensors) at http://"), lines
    assert lines[1].startswith("blocklab explore: note (coriolanus-char-lm.safetensors): this is the "
                               "character-level language model blocklab ships"), lines
    assert "There is no trained model in runs/listops: `blocklab train`" in lines[1]


