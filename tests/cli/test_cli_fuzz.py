"""The whole command line under random arguments: hypothesis builds command lines from the real flag
names of every command (read from the parser) and values that are often wrong, runs them in a sandbox
folder (tests/fuzzing.py's ``Sandbox``: the working folder and HOME inside it, another tool's folder
beside it), and asserts: exit 0 or 2 (1 only for a diverged run's own report), one ``blocklab: error:``
line on a mistake, never a traceback or an internal error, nothing outside the sandbox touched (the
other tool's folder, named by ``../outside``, is refused by every command that would write there).

Sizes stay tiny (every number drawn is at most 3, the presets are the two small ones) so that the
commands really run; only ``bench`` (minutes by design) and ``explore`` (it serves a page until
stopped; tests/explore tests its requests) are left out, and ``claims`` runs with ``--list`` (a claim
trains for minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from fuzzing import (
    DEEP_JSON,
    WRONG_TYPED_JSON,
    Sandbox,
    assert_cli_outcome,
    checksums,
    examples,
    plant_fifo,
    plant_link,
    plant_oversized,
    sparse_safetensors,
)
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from blocklab import Transformer, preset
from blocklab.cli import build_parser, main
from blocklab.nn.config import CHOICES
from blocklab.tasks import get_task
from blocklab.training.checkpoint import save_checkpoint

PARSER = build_parser()
LEFT_OUT = {"bench", "explore"}  # minutes by design; serves until stopped
COMMANDS = {name: PARSER.command_parser(name) for name in PARSER.commands() if name not in LEFT_OUT}

SMALL_INTS = ["-1", "0", "1", "2", "3", "1.5", "x", "", "1e3", "99999999999999999999999"]
NUMBERS = ["0", "0.5", "1", "-1", "nan", "inf", "1e-3", "x", ""]
# link.json: a symbolic link to the other tool's canary; pipe: a named pipe nothing writes to (planted in
# every sandbox; a pipe is only an input here, an output named as a pipe is written into and would wait)
PATHS = ["out", "sub/deeper", "~/home-out", "", " ", "../outside", ".", "missing/x", "/", "~", "link.json",
         "pipe", "out\nx"]
FILES = ["-", "out.json", "~/j.json", "", "../outside", "sub/", ".", "/", "link.json", "/proc/x.json"]
BY_DEST: dict[str, list[str]] = {
    "preset": ["listops-seed", "tiny-lm", "nope", ""],
    "task": ["tiny-lm", "listops", "copy", "text", "nope", ""],
    "input": ["Max ( 1 , 2 , 3 )", "<BOS> I like", "", "banana", "I like transformers I like", "1 2"],
    "tokens": ["1,2,3", "", "x", "-1", "1 99"],
    "target": ["3", "<EOS>", "banana", "", "like"],
    "stages": ["blocks.0.*", "*", "nothing", ""],
    "task_options": ["seq_len=3", "n_train=5", "bogus=1", "noequals", "path=~/none.txt", "=1", "path=pipe",
                     "path=link.json"],
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
        "explain": ["norm", "4,2,0,-2"],
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


@settings(max_examples=examples(50), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_random_command_lines_exit_0_or_2_and_write_only_in_their_sandbox(
        data, models, tmp_path, monkeypatch, capsys) -> None:
    argv = data.draw(command_lines(models))
    sandbox = Sandbox(Path(tempfile.mkdtemp(dir=tmp_path)))
    (sandbox.inside / "home").mkdir()
    (sandbox.inside / "link.json").symlink_to(sandbox.outside / "canary")
    os.mkfifo(sandbox.inside / "pipe")
    monkeypatch.chdir(sandbox.inside)  # "../outside" is the other tool's folder
    monkeypatch.setenv("HOME", str(sandbox.inside / "home"))
    monkeypatch.setattr("blocklab.lab.grid.default_jobs", lambda: 1)  # a 2-core machine, shared
    before = snapshot(models)
    status, _, err = run_cli(argv, capsys)
    event(f"{argv[0]} exit {status}")
    assert_cli_outcome(status, err, argv)
    assert sandbox.untouched() and snapshot(models) == before, argv


def test_the_fuzz_reaches_every_command_but_bench_and_explore() -> None:
    assert set(COMMANDS) == set(PARSER.commands()) - LEFT_OUT
    assert all(FLAGS[name] for name in COMMANDS)


# ---- issue 30's classes, planted at every path a command writes, locks or reads ----------------------------
#
# Each attack copies the pieces it needs (a trained run, an ablation grid, a Hugging Face folder with its
# tokenizer files, a checkpoint file) into a fresh box, plants one thing, runs one command line and asserts:
# exit 2, one line on stderr naming what was wrong, and not one entry of the box changed (checksums of
# every file, link and pipe before and after), the victim a planted link names included.

RUN_FLAGS = ["--task", "tiny-lm", "--steps", "2", "--warmup", "1", "--batch-size", "4", "--eval-every", "1",
             "--checkpoint-every", "1", "--log-diagnostics", "0", "-q"]
GRID_FLAGS = ["--task", "tiny-lm", "--steps", "2", "--warmup", "1", "--batch-size", "4", "--jobs", "1",
              "--log-diagnostics", "0"]
RESUME = ["train", "--resume", "--out", "run", "--steps", "3", "-q"]  # one more step: writes everything
OVERWRITE = ["train", "--overwrite", "--out", "run", *RUN_FLAGS]
ABLATE = ["ablate", *GRID_FLAGS, "--out", "grid"]
IMPORT = ["import", "hf", "--out", "imported.safetensors"]
CKPT = "run/checkpoints/step-000002"
GPT2_SHAPED = dict(vocab_size=11, max_seq_len=8, d_model=8, n_heads=2, n_layers=1, d_ff=16,
                   norm_position="pre", pos_encoding="learned", causal=True, tie_embeddings=True,
                   activation="gelu_tanh", final_norm=True, embed_scale="none", embed_std=0.02)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """run/ (a tiny-lm run, checkpoints at steps 1 and 2), grid/ (a finished one-cell grid), hf/ (a GPT-2
    folder with vocab.json, merges.txt and its tokenizer's JSON files), model.safetensors (a checkpoint)."""
    import shutil

    from blocklab.nn.config import ModelConfig
    from blocklab.weights import save_pretrained

    root = tmp_path_factory.mktemp("pristine")
    for argv in (["train", *RUN_FLAGS, "--out", str(root / "run")], [*ABLATE[:-1], str(root / "grid")]):
        assert main(argv) == 0, argv
    save_pretrained(Transformer(ModelConfig(**GPT2_SHAPED)), root / "hf")
    tokens = ["a", "b", "c", "d", "e", "ab", "cd", "abc", "de", "bc", "<|endoftext|>"]
    (root / "hf" / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}))
    (root / "hf" / "merges.txt").write_text("#version: 0.2\na b\nc d\nab c\nd e\nb c\n")
    (root / "hf" / "special_tokens_map.json").write_text('{"eos_token": "<|endoftext|>"}')
    (root / "hf" / "tokenizer_config.json").write_text('{"model_max_length": 8}')
    shutil.copy(root / CKPT / "model.safetensors", root / "model.safetensors")
    return root


def attack(pristine: Path, box: Path, argv: list[str], plant: Callable[[Path, Path], None],
           says: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Copy the pristine pieces into box/inside, plant, run ``argv`` there: exit 2, one line saying
    ``says``, nothing in the box changed."""
    import shutil

    inside, outside = box / "inside", box / "outside"
    shutil.copytree(pristine, inside, symlinks=True)
    (outside / "dir").mkdir(parents=True)
    (outside / "victim.txt").write_text("precious")
    (outside / "dir" / "keep.txt").write_text("precious too")
    plant(inside, outside)
    before = checksums(box)
    monkeypatch.chdir(inside)
    status, _, err = run_cli(argv, capsys)
    assert status == 2 and err.count("\n") == 1 and err.startswith("blocklab: error: "), (argv, status, err)
    assert says in err, (argv, err)
    assert checksums(box) == before, argv


def _link(name: str, to: str = "victim.txt") -> Callable[[Path, Path], None]:
    return lambda inside, outside: plant_link(inside / name, outside / to)


def _unlinked(name: str, then: Callable[[Path, Path], None]) -> Callable[[Path, Path], None]:
    """Remove ``name`` first (a grid run without its result.json is resumed), then plant."""
    def plant(inside: Path, outside: Path) -> None:
        (inside / name).unlink()
        then(inside, outside)
    return plant


LINKS = [  # (what, argv, the name planted as a link, where it points)
    ("resume", RESUME, name, to) for name, to in [
        (".lock", "victim.txt"), ("blocklab-run.json", "victim.txt"), ("config.json", "victim.txt"),
        ("metrics.jsonl", "victim.txt"), ("report.html", "victim.txt"), ("checkpoints", "dir"),
        ("checkpoints/step-000002", "dir"), ("checkpoints/.tmp-step-000003-1", "dir")]
] + [
    ("overwrite", OVERWRITE, name, to) for name, to in [
        (".lock", "victim.txt"), ("metrics.jsonl", "victim.txt"), ("report.html", "victim.txt"),
        ("checkpoints", "dir"), ("checkpoints/step-000001", "dir")]
] + [
    ("ablate", ABLATE, name, to) for name, to in [
        (".lock", "victim.txt"), ("blocklab-run.json", "victim.txt"), ("summary.json", "victim.txt"),
        ("report.html", "victim.txt"), ("base", "dir"), ("base/seed-0", "dir")]
]


@pytest.mark.parametrize(("what", "argv", "name", "to"), LINKS, ids=[f"{w}:{n}" for w, _, n, _ in LINKS])
def test_a_link_planted_where_a_command_writes_or_locks_is_refused_naming_it(
        pristine, tmp_path, monkeypatch, capsys, what, argv, name, to) -> None:
    folder = "grid" if what == "ablate" else "run"
    attack(pristine, tmp_path, argv, _link(f"{folder}/{name}", to), f"{folder}/{name}", monkeypatch, capsys)


@pytest.mark.parametrize("name", ["config.json", "metrics.jsonl", "checkpoints", ".lock"])
def test_a_link_inside_a_grid_run_being_resumed_is_refused(pristine, tmp_path, monkeypatch, capsys,
                                                            name) -> None:
    plant = _unlinked("grid/base/seed-0/result.json", _link(f"grid/base/seed-0/{name}",
                                                            "dir" if name == "checkpoints" else "victim.txt"))
    attack(pristine, tmp_path, ABLATE, plant, f"seed-0/{name}", monkeypatch, capsys)


@pytest.mark.parametrize(("argv", "name"), [
    (IMPORT, "imported.safetensors"),
    (["eval", "--model", "model.safetensors", "--json", "out.json"], "out.json"),
    (["trace", "--preset", "tiny-lm", "--input", "I like", "-q", "--html", "page.html"], "page.html"),
    (["claims", "--list", "--json", "claims.json"], "claims.json"),
])
def test_a_link_named_as_an_output_file_is_refused_naming_it(pristine, tmp_path, monkeypatch, capsys, argv,
                                                             name) -> None:
    attack(pristine, tmp_path, argv, _link(name), f"{name} is a symbolic link", monkeypatch, capsys)


JSON_FILES = [  # (a file a command reads, the command)
    ("run/config.json", RESUME), ("run/blocklab-run.json", RESUME), (f"{CKPT}/state.json", RESUME),
    ("grid/base/seed-0/result.json", ABLATE), ("grid/blocklab-run.json", ABLATE),
    ("hf/config.json", IMPORT), ("hf/vocab.json", IMPORT), ("hf/special_tokens_map.json", IMPORT),
    ("hf/tokenizer_config.json", IMPORT),
]


def _text(name: str, text: str) -> Callable[[Path, Path], None]:
    return lambda inside, outside: (inside / name).write_text(text)


@pytest.mark.parametrize("kind", ["deep", "wrong-typed", "oversized"])
@pytest.mark.parametrize(("name", "argv"), JSON_FILES, ids=[n for n, _ in JSON_FILES])
def test_deep_wrong_typed_or_oversized_json_is_one_line(pristine, tmp_path, monkeypatch, capsys, name, argv,
                                                        kind) -> None:
    plant = {"deep": _text(name, DEEP_JSON), "wrong-typed": _text(name, WRONG_TYPED_JSON),
             "oversized": lambda inside, outside: plant_oversized(inside / name, 300 * 2**20)}[kind]
    attack(pristine, tmp_path, argv, plant, name, monkeypatch, capsys)


@pytest.mark.parametrize("kind", ["deep", "wrong-typed"])
def test_a_metrics_line_deep_or_wrong_typed_is_one_line(pristine, tmp_path, monkeypatch, capsys,
                                                        kind) -> None:
    bad = DEEP_JSON if kind == "deep" else WRONG_TYPED_JSON

    def plant(inside: Path, outside: Path) -> None:
        lines = (inside / "run" / "metrics.jsonl").read_text().splitlines()
        (inside / "run" / "metrics.jsonl").write_text("\n".join([lines[0], bad, *lines[1:]]) + "\n")

    attack(pristine, tmp_path, RESUME, plant, "metrics.jsonl line 2", monkeypatch, capsys)


@pytest.mark.parametrize("key", ["config", "tokenizer", "meta"])
def test_deep_json_in_checkpoint_metadata_is_one_line(pristine, tmp_path, monkeypatch, capsys, key) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    def plant(inside: Path, outside: Path) -> None:
        path = inside / "model.safetensors"
        with safe_open(str(path), "pt") as f:
            metadata, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
        save_file(tensors, str(path), {**metadata, key: DEEP_JSON})

    attack(pristine, tmp_path, ["eval", "--model", "model.safetensors"], plant,
           f"its {key} metadata: JSON nested", monkeypatch, capsys)


def test_deep_json_as_a_safetensors_header_is_one_line(pristine, tmp_path, monkeypatch, capsys) -> None:
    def plant(inside: Path, outside: Path) -> None:
        header = ('{"a":' + DEEP_JSON + "}").encode()  # a tensor entry nested 100,000 deep
        (inside / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)

    attack(pristine, tmp_path, ["eval", "--model", "model.safetensors"], plant, "model.safetensors",
           monkeypatch, capsys)


@pytest.mark.parametrize(("where", "argv"), [
    ("model.safetensors", ["eval", "--model", "model.safetensors"]), ("hf/model.safetensors", IMPORT),
], ids=["checkpoint", "hugging-face"])
def test_a_sparse_file_declaring_a_huge_tensor_is_refused_before_any_allocation(
        pristine, tmp_path, monkeypatch, capsys, where, argv) -> None:
    """Issue 30, R1: 12 GB declared in a file of a few KB on disk was allocated before the shape check.
    Here every tensor is declared at its shape but the token embedding, 12.8 GB of float32."""
    from blocklab.training.checkpoint import read_safetensors_header

    metadata, declared = read_safetensors_header(pristine / where)
    shapes = {name: info.shape for name, info in declared.items()}
    embedding = next(name for name in shapes if name.endswith(("embed.weight", "wte.weight")))
    huge = {**shapes, embedding: (100_000_000, 32)}
    plant = lambda inside, outside: sparse_safetensors(inside / where, huge, metadata)
    shown = embedding.removeprefix("transformer.")  # the Hugging Face name without its prefix
    attack(pristine, tmp_path, argv, plant, f"{shown} has shape (100000000, 32)", monkeypatch, capsys)


@pytest.mark.parametrize("command", ["eval", "predict", "trace", "generate", "embed", "import"])
def test_nan_weights_are_refused_naming_the_tensor(pristine, tmp_path, monkeypatch, capsys, command) -> None:
    """Issue 30, W1: a checkpoint with a NaN weight and a valid digest loaded; generate printed <PAD>s and
    eval "loss": null, exit 0. --allow-nonfinite loads it for inspection."""
    import torch

    from blocklab.training.checkpoint import load_checkpoint

    def plant(inside: Path, outside: Path) -> None:
        loaded = load_checkpoint(inside / "model.safetensors")
        with torch.no_grad():
            loaded.model.blocks[0].ffn.w1.weight[3, 1] = float("nan")
        save_checkpoint(inside / "model.safetensors", loaded.model, tokenizer=loaded.tokenizer,
                        meta=loaded.meta, allow_nonfinite=True)

    text = {"eval": [], "predict": ["--input", "I like"], "trace": ["--input", "I like", "-q"],
            "generate": ["--input", "<BOS> I", "--max-new-tokens", "2"], "embed": ["--input", "I like"]}
    argv = (["import", "model.safetensors", "--out", "copy.safetensors"] if command == "import"
            else [command, "--model", "model.safetensors", *text[command]])
    attack(pristine, tmp_path, argv, plant, "nan in parameter blocks.0.ffn.w1.weight", monkeypatch, capsys)
    if command == "eval":  # the same file, inspected on purpose
        status, out, _ = run_cli([*argv, "--allow-nonfinite", "--json"], capsys)
        assert status == 0 and json.loads(out)["loss"] is None


JSON_INSIDE = [  # a --json path inside the folder the command is about to create, and the command
    (["train", *RUN_FLAGS, "--out", "new"], path) for path in
    ["new/out.json", "new/blocklab-run.json", "new/config.json",
     "new/checkpoints/step-000002/model.safetensors"]
] + [
    ([*ABLATE[:-1], "new"], path) for path in ["new/summary.json", "new/blocklab-run.json",
                                               "new/base/seed-0/result.json"]
] + [(["train", *RUN_FLAGS], "runs/tiny-lm/report.json"),  # the default --out
      (["claims", "--quick", "--only", "param-counts", "--out", "new"], "new/param-counts/x.json")]


@pytest.mark.parametrize(("argv", "path"), JSON_INSIDE, ids=[f"{a[0]}:{p}" for a, p in JSON_INSIDE])
def test_every_json_path_inside_the_folder_being_created_is_refused(pristine, tmp_path, monkeypatch, capsys,
                                                                   argv, path) -> None:
    """Issue 30, D2: the check ran before the folder was known, so the marker, config.json or a model file
    were overwritten by the JSON summary."""
    attack(pristine, tmp_path, [*argv, "--json", path], lambda inside, outside: None,
           f"--json {path} is inside", monkeypatch, capsys)


JSON_ABOVE = [  # an output file that is a folder above the one the command creates, or above another output
    (["train", *RUN_FLAGS, "--out", "x6.json/run", "--json", "x6.json"], "--json x6.json is a folder above"),
    ([*ABLATE[:-1], "g.json/grid", "--json", "g.json"], "--json g.json is a folder above"),
    (["claims", "--quick", "--only", "param-counts", "--out", "c.json/c", "--json", "c.json"],
     "--json c.json is a folder above"),
    (["trace", "--preset", "tiny-lm", "--input", "<BOS> I", "-q", "--json", "t", "--html", "t/p.html"],
     "--html t/p.html would be inside the --json file t"),
]


@pytest.mark.parametrize(("argv", "says"), JSON_ABOVE, ids=[a[0] for a, _ in JSON_ABOVE])
def test_an_output_path_above_another_output_is_refused_before_any_work(pristine, tmp_path, monkeypatch,
                                                                        capsys, argv, says) -> None:
    """Issue 35, F12: train --out x6.json/run --json x6.json trained and saved the run, then failed
    'x6.json is a folder'."""
    attack(pristine, tmp_path, argv, lambda inside, outside: None, says, monkeypatch, capsys)


# Every file a command reads, replaced by a named pipe nothing writes to. A blocking open would wait
# forever, so the commands run in a child process that the test waits for (a hang fails the test).
FIFOS = [
    ("run/config.json", RESUME), ("run/metrics.jsonl", RESUME), ("run/blocklab-run.json", RESUME),
    (f"{CKPT}/state.json", RESUME), (f"{CKPT}/model.safetensors", RESUME),
    (f"{CKPT}/optimizer.safetensors", RESUME), ("run/metrics.jsonl", OVERWRITE),
    ("grid/base/seed-0/result.json", ABLATE), ("grid/blocklab-run.json", ABLATE),
    ("model.safetensors", ["eval", "--model", "model.safetensors"]),
    (f"{CKPT}/model.safetensors", ["eval", "--model", "run"]),
    ("hf/config.json", IMPORT), ("hf/model.safetensors", IMPORT), ("hf/vocab.json", IMPORT),
    ("hf/merges.txt", IMPORT), ("hf/special_tokens_map.json", IMPORT), ("hf/tokenizer_config.json", IMPORT),
    ("text.txt", ["train", *RUN_FLAGS[2:], "--task", "text", "--task-option", "path=text.txt", "--out", "t"]),
]
CHILD = """
import contextlib, io, json, os, sys
from blocklab.cli import main
results = []
for folder, argv in json.loads(sys.argv[1]):
    os.chdir(folder)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = main(argv)
    results.append((status, err.getvalue()))
print(json.dumps(results))
"""


def test_a_pipe_at_every_path_a_command_reads_is_refused_without_waiting(pristine, tmp_path) -> None:
    """Issue 30, H2/H4: an import naming a pipe in its shard index, a pipe as metrics.jsonl or result.json
    blocked forever."""
    import shutil
    import subprocess
    import sys

    cases, before = [], []
    for index, (name, argv) in enumerate(FIFOS):
        box = tmp_path / f"box{index}"
        shutil.copytree(pristine, box, symlinks=True)
        (box / "text.txt").write_text("to be or not to be\n" * 20)
        plant_fifo(box / name)
        cases.append((str(box), argv))
        before.append(checksums(box))
    child = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cases)], capture_output=True, text=True,
                           timeout=600, check=False)
    assert child.returncode == 0, child.stderr[-3000:]
    for (name, argv), (status, err), (box, _), seen in zip(FIFOS, json.loads(child.stdout), cases, before,
                                                          strict=True):
        assert status == 2 and err.count("\n") == 1 and "named pipe" in err and name.split("/")[-1] in err, \
            (name, argv, err)
        assert checksums(Path(box)) == seen, (name, argv)
