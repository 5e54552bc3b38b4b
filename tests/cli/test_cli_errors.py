"""Every user mistake on the command line: one line on stderr, exit status 2, no traceback;
``--debug`` shows the traceback; failures that are not the user's exit 1 with one line."""

from __future__ import annotations

import errno
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from blocklab import Transformer, preset
from blocklab.cli import main
from blocklab.files.folders import RunLock
from blocklab.tasks import get_task
from blocklab.training.checkpoint import save_checkpoint


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """main(argv) in-process: (status, stdout, stderr); argparse's SystemExit gives its code."""
    try:
        status = main(argv)
    except SystemExit as exit_:
        status = exit_.code
    out, err = capsys.readouterr()
    return status, out, err


def one_error(argv: list[str], capsys: pytest.CaptureFixture[str], status: int = 2) -> str:
    """Run ``argv``; assert the status and a single ``blocklab: ...`` stderr line; return its message."""
    got, _, err = run(argv, capsys)
    assert got == status, err
    assert "Traceback" not in err and len(err.splitlines()) == 1 and err.startswith("blocklab: "), err
    return err.strip()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A listops checkpoint (task recorded) and a tiny-lm model with only a tokenizer."""
    root = tmp_path_factory.mktemp("checkpoints")
    task = get_task("listops")
    model = Transformer(preset("listops-seed", **task.config_overrides()))
    save_checkpoint(root / "listops.safetensors", model, tokenizer=task.tokenizer.to_dict(),
                    meta={"task": task.to_dict()})
    save_checkpoint(root / "tokenizer-only.safetensors", Transformer(preset("tiny-lm")),
                    tokenizer=get_task("tiny-lm").tokenizer.to_dict())
    return root


LISTOPS_VOCAB = "vocabulary (18 tokens): <PAD> 0 1 2 3 4 5 6 7 8 9 Max Min First Last ( ) ,"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["params", "--preset", "gpt5"], "error: unknown preset 'gpt5'; presets are: listops-seed, tiny-lm"),
        (["train", "--task", "chess"], "error: unknown task 'chess'; known tasks: listops, tiny-lm"),
        (["params", "--n-heads", "3"], "error: ModelConfig.n_heads=3 must divide d_model=64"),
        (["params", "--activation", "tanh"], "error: ModelConfig.activation='tanh' is not one of: relu"),
        (["params", "--d-ff", "1/0x"], "error: ModelConfig.d_ff='1/0x' must be an integer >= 1 or a ratio"),
        (["params", "--eps", "inf"], "error: ModelConfig.eps=inf must be a finite number > 0"),
        (["train", "--lr", "nan", "--out", "unused"], "error: TrainConfig.lr=nan must be a number > 0"),
        (["train", "--task", "text", "--task-option", "path=/no/such.txt"], "no such file"),
        (["trace", "--preset", "gpt3-175b"], "error: not enough memory: tracing preset gpt3-175b (inference"),
        (["diagnose", "--preset", "gpt3-175b"], "error: not enough memory: diagnosing listops (training"),
    ],
)
def test_bad_names_and_values_are_one_line_naming_the_problem(argv, expected, capsys) -> None:
    assert expected in one_error(argv, capsys)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["params", "--d-model", "x"], "--d-model: 'x' is not an integer; see 'blocklab params --help'"),
        (["train", "--steps", "1.5"], "--steps: '1.5' is not an integer; see 'blocklab train --help'"),
        (["params", "--bias", "maybe"], "--bias: 'maybe' is not true or false; see 'blocklab params --help'"),
        (["eval"], "the following arguments are required: --model/--checkpoint; see 'blocklab eval --help'"),
        (["tarin"], "unknown command 'tarin'; did you mean train? (choose from train, eval, predict, "),
        (["train", "--stpes", "5"],
         "unknown flag --stpes; did you mean --steps?; see 'blocklab train --help'"),
        (["train", "--stpes=5"], "unknown flag --stpes; did you mean --steps?"),
        (["params", "--zzz"], "unknown flag --zzz; see 'blocklab params --help'"),
        (["params", "extra"], "unexpected argument 'extra'; see 'blocklab params --help'"),
        (["eval", "--model", "m", "--split", "tset"], "--split: unknown value 'tset'; did you mean test?"),
        (["--nope"], "no command given; the commands are train, eval, predict, trace, "),
        (["params", "--qqqq"], "unknown flag --qqqq; see 'blocklab params --help'"),
        (["train", "--step", "5"], "unknown flag --step; did you mean --steps?"),  # never abbreviated
    ],
)
def test_argparse_mistakes_are_one_line_with_a_hint(argv, expected, capsys) -> None:
    assert expected in one_error(argv, capsys)


SMALL_RUN = ["--task", "tiny-lm", "--steps", "2", "--warmup", "1", "--batch-size", "4", "-q"]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        # E4: the flag's parser matched its help (an accuracy), not the target rule (none as well)
        (["ablate", *SMALL_RUN[:-1], "--steps-to-accuracy", "none"], "this flag needs an accuracy"),
        (["ablate", *SMALL_RUN[:-1], "--steps-to-accuracy", "off"], "this flag needs an accuracy"),
        # H3: one spec per run was built before anything checked the count (MemoryError)
        (["ablate", *SMALL_RUN[:-1], "--seeds", "99999999999999999999999"],
         "are planned at once: ask for fewer"),
        # torch's "Overflow when unpacking long long"
        (["train", *SMALL_RUN, "--seed", str(10**23)],
         "--seed: '100000000000000000000000' must be an integer"),
        (["diagnose", "--seed", str(10**23)], "must be an integer between 0 and 18446744073709551615"),
        # A2: --overwrite was ignored beside --resume
        (["train", *SMALL_RUN, "--resume", "--overwrite"], "--overwrite: not allowed with argument --resume"),
        # W3: the Ctrl-C hint named another folder
        (["train", *SMALL_RUN, "--out", "run\nrm -rf x"], "holds a control character"),
        # E6: an id beyond the vocabulary was an IndexError in the tracer
        (["trace", "--preset", "gpt2", "--n-layers", "1", "--d-model", "16", "--n-heads", "2",
          "--tokens", "1,2", "--target", "999999", "-q"], "--target '999999' is id 999999, out of range"),
    ],
)
def test_issue_30_inputs_are_refused_in_one_line(argv, expected, capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert expected in one_error(argv, capsys)
    assert list(tmp_path.iterdir()) == []  # refused before anything was made


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        # L1: the message offered "or none", which this flag refuses
        (["ablate", *SMALL_RUN[:-1], "--steps-to-accuracy", "-1"],
         "--steps-to-accuracy: '-1' is not a fraction in (0, 1] like 0.995, a percentage like 99.5%; see"),
        # L2: a newline in a name printed a two-line error; C1 controls and separators were accepted
        (["eval", "--model", "x\ny"], "blocklab: error: x\\ny: no such file"),
        (["train", *SMALL_RUN, "--out", "run\u009bx"], "--out 'run\\x9bx' holds a control character"),
        (["train", *SMALL_RUN, "--out", "run\u2028x"], "--out 'run\\u2028x' holds a control character"),
        (["trace", "--preset", "tiny-lm", "--input", "<BOS>", "-q", "--json", "t\u2029.json"],
         "--json 't\\u2029.json' holds a control character"),
    ],
)
def test_issue_35_messages_are_one_line_and_say_what_is_allowed(argv, expected, capsys, tmp_path,
                                                                 monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert expected in one_error(argv, capsys)
    assert list(tmp_path.iterdir()) == []  # refused before anything was made


@pytest.mark.parametrize("json_path", ["notes.txt/out.json", "/proc/blocklab-out.json"])
def test_an_output_where_no_file_can_be_made_is_refused_before_the_work(tmp_path, monkeypatch, capsys,
                                                                         json_path) -> None:
    """Issue 30: a --json whose folder is a file, or under /proc, passed the up-front check; train did all
    its work, then failed."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    message = one_error(["train", *SMALL_RUN, "--out", "run", "--json", json_path], capsys)
    assert f"--json {json_path}: " in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # no run was trained


def test_resume_needs_a_run_and_nothing_nests_in_a_runs_own_names(tmp_path, monkeypatch, capsys) -> None:
    """A1: --resume on a mistyped --out trained a fresh run; A3: --out run/.lock was accepted, and a
    later --resume of run failed with "Is a directory"."""
    monkeypatch.chdir(tmp_path)
    message = one_error(["train", *SMALL_RUN, "--resume", "--out", "typo"], capsys)
    assert "--resume: typo holds no blocklab run" in message and not (tmp_path / "typo").exists()
    assert run(["train", *SMALL_RUN, "--out", "run"], capsys)[0] == 0
    for name in (".lock", "blocklab-run.json", "checkpoints/x"):
        assert "is inside" in one_error(["train", *SMALL_RUN, "--out", f"run/{name}"], capsys)
    assert run(["train", "--resume", "--out", "run", "--steps", "3", "-q"], capsys)[0] == 0


def test_flags_may_be_spelled_with_underscores_and_tilde_is_expanded(tmp_path, monkeypatch) -> None:
    from blocklab.cli import build_parser

    monkeypatch.setenv("HOME", str(tmp_path))
    args = build_parser().parse_args(["train", "--d_model=32", "--batch_size", "4", "--out=~/run",
                                      "--task-option", "path=~/x_y"])
    assert (args.d_model, args.batch_size, args.out) == (32, 4, str(tmp_path / "run"))
    assert args.task_options == ["path=~/x_y"]  # values are not flags: left as written


def test_version_prints_the_version(capsys) -> None:
    from blocklab import __version__

    assert run(["--version"], capsys)[:2] == (0, f"blocklab {__version__}\n")


def test_input_outside_the_vocabulary_lists_the_vocabulary(checkpoints: Path, capsys) -> None:
    ckpt = str(checkpoints / "listops.safetensors")
    message = one_error(["predict", "--checkpoint", ckpt, "--input", "Max ( 3 , 9 , banana )"], capsys)
    assert "unknown token 'banana' at position 6" in message and message.endswith(LISTOPS_VOCAB)
    ckpt = str(checkpoints / "tokenizer-only.safetensors")
    message = one_error(["predict", "--checkpoint", ckpt, "--input", "I like pizza"], capsys)
    assert message.endswith("unknown token 'pizza' at position 2; "
                            "vocabulary (6 tokens): <PAD> <BOS> <EOS> I like transformers")


def test_sequence_longer_than_max_seq_len_and_empty_input(checkpoints: Path, capsys) -> None:
    ckpt = str(checkpoints / "tokenizer-only.safetensors")
    too_long = one_error(["predict", "--checkpoint", ckpt, "--input", "I like transformers I like"], capsys)
    assert too_long == "blocklab: error: sequence length 5 exceeds max_seq_len=4"
    trace = one_error(["trace", "--preset", "tiny-lm", "--input", "I like transformers I like"], capsys)
    assert trace == ("blocklab: error: the input is 5 tokens and the model takes at most max_seq_len=4; "
                     "preset tiny-lm is built for each run: --max-seq-len 5 builds it long enough")
    for empty in ("", "   "):
        message = one_error(["predict", "--checkpoint", ckpt, "--input", empty], capsys)
        assert message == f"blocklab: error: empty input {empty!r}: nothing to tokenize"


def test_missing_corrupt_and_pickle_checkpoints(tmp_path: Path, checkpoints: Path, capsys) -> None:
    missing = tmp_path / "nope.safetensors"
    assert one_error(["eval", "--checkpoint", str(missing)], capsys) == \
        f"blocklab: error: {missing}: no such file, folder or installed model package"
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes((checkpoints / "listops.safetensors").read_bytes()[:5000])
    message = one_error(["predict", "--checkpoint", str(truncated), "--input", "Max ( 1 , 2 , 3 )"], capsys)
    assert message.startswith(f"blocklab: error: {truncated}: is truncated: 5000 of ")
    marker = tmp_path / "pwned"
    evil = tmp_path / "model.safetensors"
    evil.write_bytes(pickle.dumps({"w": _Payload(marker)}))
    message = one_error(["eval", "--checkpoint", str(evil)], capsys)
    assert "is a Python pickle" in message and "never unpickles" in message and not marker.exists()


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_locked_run_folder_is_refused(tmp_path: Path, capsys) -> None:
    with RunLock(tmp_path):  # another live run holds the folder
        message = one_error(["train", "--task", "tiny-lm", "--out", str(tmp_path), "-q"], capsys)
    assert message.startswith(f"blocklab: error: {tmp_path} is in use by another blocklab run (pid ")
    assert "choose another --out" in message


def test_memory_guard_refuses_before_allocating_and_force_passes(tmp_path: Path, monkeypatch, capsys) -> None:
    out = tmp_path / "huge"
    argv = ["train", "--task", "tiny-lm", "--d-model", "16384", "--n-heads", "16", "--n-layers", "48",
            "--out", str(out), "-q"]
    message = one_error(argv, capsys)
    assert "not enough memory: training on tiny-lm (training, batch 64 x 4 tokens) needs about" in message
    assert "but " in message and "--force" in message and not out.exists()

    seen = {}

    def fake_train(*args, **kwargs):
        seen.update(kwargs)
        raise ValueError("stop here")

    monkeypatch.setattr("blocklab.cli.training.train", fake_train)
    one_error([*argv, "--force", "--detect-nonfinite"], capsys)
    assert seen["force"] is True and seen["detect_nonfinite"] is True


def test_debug_anywhere_shows_the_traceback(capsys) -> None:
    with pytest.raises(ValueError, match="n_heads=3 must divide"):
        main(["params", "--n-heads", "3", "--debug"])
    with pytest.raises(ValueError, match="n_heads=3 must divide"):
        main(["--debug", "params", "--n-heads", "3"])


@pytest.mark.parametrize(
    ("error", "status", "expected"),
    [
        (KeyError("components"), 1,
         "blocklab: internal error: KeyError: 'components' (a bug in blocklab; rerun with --debug for the "
         "traceback)"),
        (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 9 bytes"), 1,
         "blocklab: out of memory (DefaultCPUAllocator: can't allocate memory"),
        (OSError(errno.ENOSPC, "No space left on device", "runs/x/metrics.jsonl"), 2,
         "blocklab: error: runs/x/metrics.jsonl: No space left on device (free some disk space"),
        (PermissionError(errno.EACCES, "Permission denied", "/root/x"), 2,
         "blocklab: error: /root/x: Permission denied"),
        (KeyboardInterrupt(), 130, "blocklab: interrupted"),
    ],
)
def test_failures_that_are_not_usage_mistakes(error, status, expected, monkeypatch, capsys) -> None:
    def fail(config):  # stands in for count_parameters, which cmd_params calls
        raise error

    monkeypatch.setattr("blocklab.nn.params.count_parameters", fail)
    assert one_error(["params"], capsys, status=status).startswith(expected)


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["params", "--n-heads", "3"], "ModelConfig.n_heads=3 must divide d_model=64"),
        (["eval", "--checkpoint", "{tmp}/torch.pt"], "is a zip archive, the format of torch.save"),
    ],
)
def test_real_processes_print_one_line_and_exit_2(argv, fragment, tmp_path: Path) -> None:
    import torch

    torch.save({"w": torch.zeros(2)}, tmp_path / "torch.pt")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    done = subprocess.run([sys.executable, "-m", "blocklab", *argv], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and fragment in done.stderr and "Traceback" not in done.stderr


def test_a_recorded_task_of_the_wrong_type_is_one_line(tmp_path: Path, capsys) -> None:
    """Issue 30, E3: metadata {"task": {"name": ["x"]}} (with a valid digest) was an internal error,
    "unhashable type: 'list'", in eval and predict."""
    path = tmp_path / "m.safetensors"
    save_checkpoint(path, Transformer(preset("tiny-lm")), tokenizer=get_task("tiny-lm").tokenizer.to_dict(),
                    meta={"task": {"name": ["x"]}})
    for argv in (["eval", "--model", str(path)], ["predict", "--model", str(path), "--input", "I like"]):
        assert "unknown task ['x']; known tasks: listops" in one_error(argv, capsys)
