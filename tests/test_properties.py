"""Property tests (hypothesis): any ModelConfig either builds a model that runs and whose analytic
parameter count is exact, or is refused with a ValueError naming a field; any command line ends
in a result or one error line, never a traceback."""

from __future__ import annotations

import os
import re
import stat
import tempfile

import pytest
import torch
from fuzzing import assert_cli_outcome, examples
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from blocklab import ModelConfig, Transformer, count_parameters
from blocklab.cli import main
from blocklab.nn.activations import ACTIVATION_NAMES
from blocklab.nn.config import FIELDS, NORM_POSITIONS, NORMS, POS_ENCODINGS, RESIDUALS
from blocklab.nn.presets import PRESETS

# ---- random ModelConfigs ------------------------------------------------------------------------

JUNK = st.sampled_from([None, "", "abc", -1, 0, 1.5, float("nan"), float("inf"), True, [], {}])
D_FF_RATIOS = ["2x", "8/3x", "1.5x", 2.0, "16", "1e1"]  # ratios and integer strings d_ff accepts
# Values that break a field, beyond JUNK: out of range, non-finite, malformed ratios, unknown names.
BROKEN: dict[str, st.SearchStrategy] = {
    "d_model": st.integers(-2, 24),  # often not divisible by n_heads
    "n_heads": st.integers(-1, 9),
    "d_ff": st.sampled_from(["0x", "-1x", "1/0x", "infx", "nanx", "x", "1e-9x", 1e308, -2.0]),
    "eps": st.sampled_from([0.0, -1e-5, float("inf"), float("nan"), "1e-5"]),
    "dropout": st.sampled_from([1.0, -0.1, float("nan"), "0"]),
    "type_vocab_size": st.integers(-3, -1),
}


@st.composite
def config_kwargs(draw: st.DrawFn) -> dict[str, object]:
    """Keyword arguments for ModelConfig: small shapes, every variant; half the time one field broken."""
    n_heads = draw(st.integers(1, 4))
    kw: dict[str, object] = {
        "vocab_size": draw(st.integers(1, 20)),
        "max_seq_len": draw(st.integers(1, 8)),
        "d_model": n_heads * draw(st.integers(1, 8)),
        "n_heads": n_heads,
        "n_layers": draw(st.integers(1, 3)),
        "d_ff": draw(st.one_of(st.integers(1, 24), st.sampled_from(D_FF_RATIOS))),
        "activation": draw(st.sampled_from(ACTIVATION_NAMES)),
        "norm": draw(st.sampled_from(NORMS)),
        "norm_position": draw(st.sampled_from(NORM_POSITIONS)),
        "residual": draw(st.sampled_from(["add", "add", "add", *RESIDUALS])),
        "eps": draw(st.floats(1e-12, 1e-2)),
        "bias": draw(st.booleans()),
        "causal": draw(st.booleans()),
        "pos_encoding": draw(st.sampled_from(POS_ENCODINGS)),
        "tie_embeddings": draw(st.booleans()),
        "final_norm": draw(st.sampled_from([None, True, False])),
        "dropout": draw(st.sampled_from([0.0, 0.1, 0.5])),
        "type_vocab_size": draw(st.integers(0, 3)),
        "embed_norm": draw(st.booleans()),
    }
    for name in ("fused", "checkpoint_blocks"):  # memory-lean execution switches, when present
        if name in FIELDS:
            kw[name] = draw(st.booleans())
    if kw["residual"] == "rezero":  # valid only without norms: mostly keep it valid
        kw["norm"] = draw(st.sampled_from(["none", "none", "none", "rms"]))
    if kw["residual"] == "deepnorm":  # valid only post-norm with a norm
        kw["norm_position"] = draw(st.sampled_from(["post", "post", "post", "pre"]))
        kw["norm"] = draw(st.sampled_from(["standard", "standard", "rms", "none"]))
    broken = draw(st.one_of(st.none(), st.sampled_from(sorted(kw))))
    if broken is not None:
        kw[broken] = draw(st.one_of(JUNK, BROKEN.get(broken, JUNK), st.text(max_size=4)))
    return {k: v for k, v in kw.items() if k == broken or draw(st.integers(0, 5))}  # defaults too


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config_kwargs(), st.integers(1, 3), st.data())
def test_any_config_builds_and_counts_exactly_or_names_the_bad_field(kwargs, batch, data) -> None:
    try:
        config = ModelConfig(**kwargs)
    except ValueError as error:
        named = re.findall(r"ModelConfig\.(\w+)", str(error))
        assert named and named[0] in FIELDS, str(error)
        assert "\n" not in str(error)
        event(f"refused: {named[0]}")
        return
    event("built")
    model = Transformer(config)
    assert count_parameters(config).total == sum(p.numel() for p in model.parameters())
    T = data.draw(st.integers(1, config.max_seq_len))
    tokens = torch.randint(0, config.vocab_size, (batch, T))
    model.eval()
    logits, loss = model(tokens, tokens)
    assert logits.shape == (batch, T, config.vocab_size)
    assert torch.isfinite(logits).all() and torch.isfinite(loss)


# ---- random command lines -----------------------------------------------------------------------

FLAG_VALUES = {
    "--preset": st.sampled_from([*PRESETS, "nope", ""]),
    "--d-model": st.sampled_from(["0", "-3", "8", "12", "x", "1e3", "64"]),
    "--n-heads": st.sampled_from(["0", "3", "4", "2", "-1", "two"]),
    "--n-layers": st.sampled_from(["0", "1", "2", "-5"]),
    "--d-ff": st.sampled_from(["0", "8/3x", "4x", "1/0x", "infx", "nan", "-2x", "32", "abc", "1e3"]),
    "--activation": st.sampled_from([*ACTIVATION_NAMES, "tanh", ""]),
    "--norm": st.sampled_from([*NORMS, "batch"]),
    "--norm-position": st.sampled_from([*NORM_POSITIONS, "middle"]),
    "--residual": st.sampled_from([*RESIDUALS, "mul"]),
    "--eps": st.sampled_from(["1e-5", "0", "-1", "inf", "nan", "e"]),
    "--dropout": st.sampled_from(["0", "0.1", "1", "nan", "-0.5"]),
    "--vocab-size": st.sampled_from(["0", "1", "18", "50257", "-1"]),
    "--max-seq-len": st.sampled_from(["0", "1", "8", "99999999"]),
    "--final-norm": st.sampled_from(["auto", "true", "false", "maybe"]),
    "--bias": st.sampled_from(["true", "false", "0", "yes", "perhaps"]),
    "--json": st.none(),
}


@st.composite
def params_argv(draw: st.DrawFn) -> list[str]:
    """``blocklab params`` with random flags and values (often invalid), sometimes junk tokens."""
    argv = ["params"]
    for flag in draw(st.lists(st.sampled_from(sorted(FLAG_VALUES)), max_size=6)):
        value = draw(FLAG_VALUES[flag])
        argv += [flag] if value is None else [flag, value]
    if draw(st.integers(0, 9)) == 0:
        argv.insert(draw(st.integers(0, len(argv))), draw(st.sampled_from(["--nope", "extra", "-x", "--"])))
    return argv


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """main(argv) in-process: (status, stdout, stderr); argparse's SystemExit gives its code."""
    try:
        status = main(argv)
    except SystemExit as exit_:
        status = exit_.code if isinstance(exit_.code, int) else 2
    out, err = capsys.readouterr()
    return status, out, err


def assert_clean_failure(status: int, err: str) -> None:
    """Exit 0 or 2, never an internal error or a traceback; an error is one blocklab line, the last,
    after any warning lines (fuzzing.assert_cli_outcome)."""
    assert status in (0, 2), (status, err)
    assert_cli_outcome(status, err)


@settings(max_examples=examples(150), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(argv=params_argv())
def test_random_params_command_lines_never_trace_back(argv, capsys) -> None:
    status, out, err = run_cli(argv, capsys)
    assert_clean_failure(status, err)
    event(f"exit {status}")
    if status == 0:
        assert out and not err


# ---- random queries to a model, and random training command lines ------------------------------

OPS = ["Max", "Min", "First", "Last"]
QUERY_TOKENS = [*OPS, "(", ")", ",", "<PAD>", *"0123456789", "banana", "12", "é", "\t"]
DIGIT = st.sampled_from("0123456789")
VALID_QUERY = st.builds(lambda op, a, b, c: f"{op} ( {a} , {b} , {c} )".split(), st.sampled_from(OPS), DIGIT,
                        DIGIT, DIGIT)


@pytest.fixture(scope="module")
def listops_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> str:
    from blocklab import preset
    from blocklab.tasks import get_task
    from blocklab.training.checkpoint import save_checkpoint

    task = get_task("listops")
    path = tmp_path_factory.mktemp("ckpt") / "listops.safetensors"
    save_checkpoint(path, Transformer(preset("listops-seed", **task.config_overrides())),
                    tokenizer=task.tokenizer.to_dict(), meta={"task": task.to_dict()})
    return str(path)


@settings(max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=st.one_of(VALID_QUERY, st.lists(st.sampled_from(QUERY_TOKENS), max_size=12)),
       command=st.sampled_from(["predict", "trace"]))
def test_random_queries_get_an_answer_or_one_error_line(words, command, listops_checkpoint, capsys) -> None:
    text = " ".join(words)
    argv = ["predict", "--checkpoint", listops_checkpoint, "--input", text] if command == "predict" else [
        "trace", "--checkpoint", listops_checkpoint, "--input", text, "-q", "--json", os.devnull]
    status, out, err = run_cli(argv, capsys)
    assert_clean_failure(status, err)
    event(f"{command} exit {status}")
    if status == 0 and command == "predict":
        assert out.startswith(f"{text} -> ")
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)  # --json /dev/null wrote into it, never over it


TRAIN_VALUES = {
    "--steps": st.sampled_from(["0", "1", "2", "-1", "x"]),
    "--batch-size": st.sampled_from(["0", "1", "3", "-2"]),
    "--lr": st.sampled_from(["3e-3", "0", "-1", "nan", "inf", "1e30"]),
    "--warmup": st.sampled_from(["0", "1", "5", "-1"]),
    "--eval-every": st.sampled_from(["0", "1", "2"]),
    "--checkpoint-every": st.sampled_from(["0", "1", "-1"]),
    "--target-accuracy": st.sampled_from(["none", "0.5", "150", "0", "x", "99%"]),
    "--seed": st.sampled_from(["0", "-1", "7", str(2**64)]),
    "--grad-clip": st.sampled_from(["0", "1", "-1", "nan"]),
    "--task": st.sampled_from(["tiny-lm", "copy", "nope", "text"]),
    "--task-option": st.sampled_from(["seq_len=0", "length=3", "length=x", "bogus=1", "path=/no/such.txt",
                                      "n_train=5", "noequals"]),
    "--d-model": st.sampled_from(["8", "0", "6"]),
    "--n-heads": st.sampled_from(["2", "3", "0"]),
    "--norm-position": st.sampled_from(["pre", "post", "middle"]),
    "--log-diagnostics": st.sampled_from(["0", "1", "-1"]),
    "--resume": st.none(),
    "--overwrite": st.none(),
    "--detect-nonfinite": st.none(),
}


@settings(max_examples=examples(30), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flags=st.lists(st.sampled_from(sorted(TRAIN_VALUES)), max_size=5), data=st.data())
def test_random_train_command_lines_never_trace_back(flags, data, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr("blocklab.training.report.write_report", lambda *a, **k: None)  # not tested here
    out = tempfile.mkdtemp(dir=tmp_path)
    argv = ["train", "--task", "tiny-lm", "--steps", "2", "--out", out, "-q"]
    for flag in flags:
        value = data.draw(TRAIN_VALUES[flag])
        argv += [flag] if value is None else [flag, value]
    status, _, err = run_cli(argv, capsys)
    assert_cli_outcome(status, err, argv)  # exit 1: a diverged run, the trainer's own one-line report
    event(f"train exit {status}")
