"""The whole command line under random arguments: hypothesis builds command lines from the real flag
names of every command (read from the parser) and values that are often wrong, runs them in a sandbox
folder (tests/fuzzing.py's ``Sandbox``: the working folder and HOME inside it, another tool's folder
beside it), and asserts: exit 0 or 2 (1 only for a diverged run's own report), one ``blocklab: error:``
line on a mistake, never a traceback or an internal error, nothing outside the sandbox touched (the
other tool's folder, named by ``../outside``, is refused by every command that would write there).

Sizes stay tiny (every number drawn is at most 3, the presets are the two small ones) so that the
commands really run; only ``bench`` (minutes by design) is left out, and ``claims`` runs with
``--list`` (a claim trains for minutes).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import pytest
from fuzzing import Sandbox
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from blocklab import Transformer, preset
from blocklab.cli import build_parser, main
from blocklab.nn.config import CHOICES
from blocklab.tasks import get_task
from blocklab.training.checkpoint import save_checkpoint

PARSER = build_parser()
COMMANDS = {name: PARSER.command_parser(name) for name in PARSER.commands() if name != "bench"}

SMALL_INTS = ["-1", "0", "1", "2", "3", "1.5", "x", "", "1e3"]
NUMBERS = ["0", "0.5", "1", "-1", "nan", "inf", "1e-3", "x", ""]
PATHS = ["out", "sub/deeper", "~/home-out", "", " ", "../outside", ".", "missing/x", "/", "~"]
FILES = ["-", "out.json", "~/j.json", "", "../outside", "sub/", ".", "/"]
BY_DEST: dict[str, list[str]] = {
    "preset": ["listops-seed", "tiny-lm", "nope", ""],
    "task": ["tiny-lm", "listops", "copy", "text", "nope", ""],
    "input": ["Max ( 1 , 2 , 3 )", "<BOS> I like", "", "banana", "I like transformers I like", "1 2"],
    "tokens": ["1,2,3", "", "x", "-1", "1 99"],
    "target": ["3", "<EOS>", "banana", "", "like"],
    "stages": ["blocks.0.*", "*", "nothing", ""],
    "task_options": ["seq_len=3", "n_train=5", "bogus=1", "noequals", "path=~/none.txt", "=1"],
    "vary": ["n_layers=1,2", "lr=1e-3", "nope=1", "seed=1", "n_layers", "d_model=8,x"],
    "only": [",", "nope", "a,,b", ""],
}
BY_METAVAR: dict[str, list[str]] = {
    "N": SMALL_INTS, "K": SMALL_INTS, "ID": SMALL_INTS, "X": NUMBERS, "P": ["0.9", "1", "0", "1.5", "x"],
    "true|false": ["true", "false", "maybe", ""], "true|false|auto": ["auto", "true", "no", "2"],
    "N|RATIO": ["2", "4x", "8/3x", "0", "x", "-2x"],
    "ACCURACY": ["0.5", "1.5", "50%", "none", "x", "0", "99.5"],
    "PATH": PATHS, "FILE": FILES, "TEXT": BY_DEST["input"], "SPLIT": ["test", "train", "dev", ""],
    "DTYPE": ["float32", "bfloat16", "int8"],
}


def values_for(action: argparse.Action) -> st.SearchStrategy[str | None]:
    """Values for a flag: none for a switch, sometimes none for an optional value, else from the pools."""
    if action.nargs == 0:
        return st.none()
    if action.dest in CHOICES:
        pool = [*CHOICES[action.dest], "nope", ""]
    else:
        pool = BY_DEST.get(action.dest) or BY_METAVAR.get(action.metavar or "") or ["x", "", "-", "1"]
    values = st.sampled_from(pool)
    return st.one_of(st.none(), values) if action.nargs == "?" else values


FLAGS = {name: [a for a in p._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]
         for name, p in COMMANDS.items()}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A listops checkpoint (task recorded) and a tiny-lm one, outside every sandbox."""
    root = tmp_path_factory.mktemp("fuzz-models")
    for name in ("listops", "tiny-lm"):
        task = get_task(name)
        config = preset("listops-seed" if name == "listops" else "tiny-lm", **task.config_overrides())
        model = Transformer(config)
        save_checkpoint(root / f"{name}.safetensors", model, tokenizer=task.tokenizer.to_dict(),
                        meta={"task": task.to_dict(), "step": 0})
    return root


def base_argv(command: str, models: Path) -> list[str]:
    """A command line that works, at tiny sizes; the random flags come after it (and may override it)."""
    listops, tiny = str(models / "listops.safetensors"), str(models / "tiny-lm.safetensors")
    small_run = ["--task", "tiny-lm", "--steps", "2", "--warmup", "1", "--batch-size", "2",
                 "--eval-every", "1"]
    return {
        "train": [*small_run, "-q", "--no-report"],
        "eval": ["--model", listops],
        "predict": ["--model", listops, "--input", "Max ( 1 , 2 , 3 )"],
        "trace": ["--input", "Max ( 1 , 2 , 3 )", "-q"],
        "diagnose": ["--batch-size", "2"],
        "ablate": [*small_run, "--jobs", "1", "--log-diagnostics", "0"],
        "claims": ["--list"],
        "import": [tiny, "--out", "imported.safetensors"],
        "embed": ["--model", tiny, "--input", "I like"],
        "generate": ["--model", tiny, "--input", "<BOS> I", "--max-new-tokens", "2"],
        "params": [],
    }[command]


@st.composite
def command_lines(draw: st.DrawFn, models: Path) -> list[str]:
    command = draw(st.sampled_from(sorted(COMMANDS)))
    argv = [command, *base_argv(command, models)]
    for action in draw(st.lists(st.sampled_from(FLAGS[command]), max_size=4)):
        flag = draw(st.sampled_from(action.option_strings))
        value = draw(values_for(action))
        argv += [flag] if value is None else [flag, value]
    if draw(st.integers(0, 9)) == 0:  # a stray or mistyped token
        stray = draw(st.sampled_from(["--stpes", "extra", "-x", "--", "-"]))
        argv.insert(draw(st.integers(1, len(argv))), stray)
    return argv


def snapshot(folder: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in folder.rglob("*")}


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        status = main(argv)
    except SystemExit as exit_:  # --help and --version exit 0 through argparse
        status = exit_.code if isinstance(exit_.code, int) else 2
    out, err = capsys.readouterr()
    return status, out, err


@settings(max_examples=50, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_random_command_lines_exit_0_or_2_and_write_only_in_their_sandbox(
        data, models, tmp_path, monkeypatch, capsys) -> None:
    argv = data.draw(command_lines(models))
    sandbox = Sandbox(Path(tempfile.mkdtemp(dir=tmp_path)))
    (sandbox.inside / "home").mkdir()
    monkeypatch.chdir(sandbox.inside)  # "../outside" is the other tool's folder
    monkeypatch.setenv("HOME", str(sandbox.inside / "home"))
    monkeypatch.setattr("blocklab.lab.grid.default_jobs", lambda: 1)  # a 2-core machine, shared
    before = snapshot(models)
    status, _, err = run_cli(argv, capsys)
    event(f"{argv[0]} exit {status}")
    assert "Traceback" not in err and "internal error" not in err, (argv, err)
    errors = [line for line in err.splitlines() if line.startswith("blocklab: error")]
    if status == 1:  # a run that diverged reports it in its own line
        assert len(errors) == 1 and "training stopped at step" in errors[0], (argv, err)
    else:
        assert status in (0, 2), (argv, status, err)
        assert len(errors) == (status == 2), (argv, err)
    assert sandbox.untouched() and snapshot(models) == before, argv


def test_the_fuzz_reaches_every_command_but_bench() -> None:
    assert set(COMMANDS) == set(PARSER.commands()) - {"bench"}
    assert all(FLAGS[name] for name in COMMANDS)
