"""The claims runner keeps every finished training run in its folder: a run killed midway continues
where it stopped (only the unfinished runs train again, the finished ones are read back), and a kept
result made from another spec is trained again; Ctrl-C stops the queued training runs at once."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from processes import MOMENTS, assert_interrupted_cleanly, ctrl_c_at, descendants

from blocklab.lab import grid
from blocklab.lab.claims import Claim, Setup, Source, registry
from blocklab.lab.claims.runner import run_claims
from blocklab.lab.executors import Executor
from blocklab.lab.grid import RunSpec

CLAIM = "relu-sparsity"
# In a child process: the tiny registry; the first run trains, every later one hangs until it is killed.
CHILD = """
import dataclasses, sys, time
from blocklab.cli import main
from blocklab.lab import grid
from blocklab.lab.claims import registry
sizes = {sizes!r}
registry.CLAIMS = [dataclasses.replace(c, quick=sizes) if c.name == {claim!r} else c for c in registry.CLAIMS]
trained = grid.run_one
calls = []
def run_one(spec, target=0.9):
    calls.append(spec.key)
    if len(calls) > 1:
        time.sleep(3600)
    return trained(spec, target)
grid.run_one = run_one
sys.exit(main(["claims", "--quick", "--only", {claim!r}, "--jobs", "1", "--out", {out!r}, "--json", "-"]))
"""


def _kept(folder: Path) -> dict[str, int]:
    return {str(p.parent.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("result.json")}


@pytest.fixture
def trained(monkeypatch):
    """The keys of the runs trained in this process (``grid.run_one`` counted)."""
    keys = []
    real = grid.run_one

    def counted(spec, target=0.9):
        keys.append(spec.key)
        return real(spec, target)

    monkeypatch.setattr(grid, "run_one", counted)
    return keys


def test_a_claims_run_killed_midway_trains_only_its_unfinished_runs_again(tmp_path, tiny_claims, trained):
    out = tmp_path / "claims"
    sizes = registry.REGISTRY[CLAIM].quick
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(sizes=sizes, claim=CLAIM, out=str(out))],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 300  # a guard against a hang, not a measurement
        while not _kept(out) and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert child.poll() is None, child.stderr.read().decode()
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    before = _kept(out)
    claim = registry.REGISTRY[CLAIM]
    keys = [spec.key for setup in claim.setups_run(quick=True) for spec in claim.runs(sizes, setup)]
    assert len(before) == 1 and len(keys) > 1

    report = registry.run_claims([CLAIM], quick=True, executor=Executor(jobs=1), out=out, progress=False)
    assert sorted(trained) == sorted(set(keys) - set(before))  # the finished run was read back
    assert {k: v for k, v in _kept(out).items() if k in before} == before  # and left as it was
    assert sorted(_kept(out)) == sorted(keys)

    trained.clear()
    again = registry.run_claims([CLAIM], quick=True, executor=Executor(jobs=1), out=out, progress=False)
    assert trained == []
    measurements = lambda r: [s["measurements"] for c in r["claims"] for s in c["setups"]]
    assert measurements(again) == measurements(report)


def test_a_kept_result_of_another_spec_or_a_damaged_one_is_trained_again(tmp_path, tiny_claims, trained):
    out = tmp_path / "claims"
    registry.run_claims([CLAIM], quick=True, executor=Executor(jobs=1), out=out, progress=False)
    first, second, *_ = sorted(out.rglob("result.json"))
    stale = json.loads(first.read_text())
    stale["spec"]["train"]["steps"] += 1
    first.write_text(json.dumps(stale))
    second.write_text("{not json")
    trained.clear()
    registry.run_claims([CLAIM], quick=True, executor=Executor(jobs=1), out=out, progress=False)
    assert sorted(trained) == sorted(str(p.parent.relative_to(out)) for p in (first, second))
    assert json.loads(first.read_text())["spec"]["train"]["steps"] == stale["spec"]["train"]["steps"] - 1


def test_a_kept_result_made_by_other_code_is_trained_again(tmp_path, tiny_claims, trained, monkeypatch):
    """Issue 36: the cache is keyed by the code version too; a changed kernel, loop or task reruns."""
    from blocklab.lab.claims import runner

    out = tmp_path / "claims"
    first = registry.run_claims([CLAIM], quick=True, executor=Executor(jobs=1), out=out, progress=False)
    kept = [json.loads(p.read_text()) for p in out.rglob("result.json")]
    assert kept and {(r["code"], r["registry"]) for r in kept} == {(first["code"], first["registry"])}
    trained.clear()
    monkeypatch.setattr(runner, "code_version", lambda: "0123456789abcdef")
    again = registry.run_claims([CLAIM], quick=True, executor=Executor(jobs=1), out=out, progress=False)
    assert (
        len(trained) == len(kept) and again["training"]["kept"] == 0 and again["code"] == "0123456789abcdef"
    )


def test_the_code_version_follows_the_training_code_and_not_the_claims(tmp_path):
    from blocklab.lab.claims.runner import code_version

    package = tmp_path / "blocklab"
    for part in ("nn", "lab/claims", "cli"):
        (package / part).mkdir(parents=True)
        (package / part / "x.py").write_text("A = 1\n")
    before = code_version(package)
    (package / "lab/claims/x.py").write_text("A = 2\n")  # a claim's verdict: measured again every run
    (package / "cli/x.py").write_text("A = 2\n")
    assert code_version(package) == before
    (package / "nn/x.py").write_text("A = 2\n")  # a kernel: every run it trained is stale
    assert code_version(package) != before


def test_the_registry_hash_follows_what_is_stated_before_the_runs_and_not_the_notes():
    import dataclasses

    from blocklab.lab.claims.runner import registry_hash

    claims = list(registry.CLAIMS)
    index = next(i for i, c in enumerate(claims) if c.name == CLAIM)
    before = registry_hash(claims)
    noted = (
        claims[:index]
        + [dataclasses.replace(claims[index], notes="written after the run")]
        + claims[index + 1 :]
    )
    assert registry_hash(noted) == before
    claim = claims[index]
    moved = dataclasses.replace(claim, full={**claim.full, "steps": claim.full["steps"] + 1})
    assert registry_hash(claims[:index] + [moved] + claims[index + 1 :]) != before
    source = claim.setups[0]
    other = dataclasses.replace(claim, setups=(dataclasses.replace(source, init="he"), *claim.setups[1:]))
    assert registry_hash(claims[:index] + [other] + claims[index + 1 :]) != before


def test_training_settings_are_every_trainconfig_field_that_trains():
    from blocklab.lab.claims.runner import training_settings
    from blocklab.training.train_config import TrainConfig

    claim = registry.REGISTRY["pre-vs-post-warmup"]
    settings = training_settings(claim.runs(claim.full, claim.setups[0]))
    common = settings["common"]
    assert (common["weight_decay"], common["grad_clip"], common["beta1"], common["beta2"]) == (
        TrainConfig.weight_decay,
        TrainConfig.grad_clip,
        TrainConfig.beta1,
        TrainConfig.beta2,
    )
    assert (common["lr"], common["steps"], common["init"], common["dtype"]) == (
        1e-3,
        600,
        "xavier",
        "float32",
    )
    assert settings["varied"] == {"warmup": [0, 100]} and "AdamW" in settings["optimizer"]
    assert "seed" not in common and "threads" not in common


def test_a_claims_folder_is_only_one_blocklab_made_for_claims(tmp_path, capsys):
    from blocklab.cli import main

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("precious")
    assert main(["claims", "--quick", "--only", "layernorm-moments", "--out", str(tmp_path / "mine")]) == 2
    assert "is not empty and was not written by blocklab" in capsys.readouterr().err
    assert (tmp_path / "mine" / "notes.txt").read_text() == "precious"


# H1: a claim that only trains, its runs long enough to be interrupted
TRAIN = {
    "steps": 300,
    "batch_size": 8,
    "log_every": 1,
    "eval_every": 10**6,
    "checkpoint_every": 0,
    "target_accuracy": None,
}


def _claim(out: Path, runs: int) -> Claim:
    def specs(params: dict, setup: Setup) -> list[RunSpec]:
        return [
            RunSpec(
                key=f"fake/{setup.name}/{i}",
                preset="tiny-lm",
                task={"name": "tiny-lm"},
                train={**TRAIN, "seed": i},
                out_dir=str(out / setup.name / str(i)),
            )
            for i in range(runs)
        ]

    return Claim(
        name="fake",
        kind="training",
        statement="a claim that only trains",
        method="train",
        source=Source("a test", "-", "-", "-"),
        quick={},
        full={},
        setups=(Setup("a", "source", "the runs"), Setup("b", "confound", "more runs")),
        measure=lambda params, setup, results: {},
        verdict=lambda m: None,
        headline=None,
        plot=None,
        runs=specs,
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process tree from /proc")
@pytest.mark.usefixtures("ctrl_c")
def test_ctrl_c_stops_the_queued_runs_at_once(tmp_path: Path) -> None:
    """Issue 30, H1: the runs were waited for in a background thread, so Ctrl-C ended the main thread
    while every queued run still trained (the process exited minutes later). Ctrl-C stops the workers
    before run_claims returns, and the queue is never drained."""
    claim = _claim(tmp_path, runs=4)  # 8 runs, 2 at a time
    training = threading.Event()

    def press_ctrl_c_once_a_run_trains() -> None:
        while not any(tmp_path.rglob("metrics.jsonl")):
            if training.wait(0.05):
                return
        os.kill(os.getpid(), signal.SIGINT)

    presser = threading.Thread(target=press_ctrl_c_once_a_run_trains, daemon=True)
    presser.start()
    with pytest.raises(KeyboardInterrupt):
        run_claims([claim], quick=True, executor=Executor(jobs=2), progress=False)
    training.set()
    workers = [
        pid
        for pid in descendants(os.getpid())  # (multiprocessing's resource tracker may stay)
        if b"spawn_main" in (Path("/proc") / str(pid) / "cmdline").read_bytes()
    ]
    assert workers == []  # no worker left training
    finished = [p for p in tmp_path.rglob("checkpoints") if any(p.iterdir())]
    assert len(finished) < 8  # the queue was not drained


# ---- Ctrl-C to the whole process group (what a terminal sends) at several moments -----------------


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process tree from /proc")
@pytest.mark.parametrize("moment", list(MOMENTS))
@pytest.mark.usefixtures("ctrl_c")  # the child must start with Python's own SIGINT handler
def test_ctrl_c_on_claims_with_two_jobs_is_the_interrupted_line_and_status_130(tmp_path: Path, moment: str):
    """Issue 35, F8: workers interrupted while importing torch printed a KeyboardInterrupt traceback each,
    and the claims measured beside the training runs (residual-gradient) were left inside torch when
    the interpreter exited: 'terminate called without an active exception', SIGABRT."""
    command = ["claims", "--quick", "--only", "gelu-vs-relu,residual-gradient", "--jobs", "2"]
    assert_interrupted_cleanly(ctrl_c_at(command, tmp_path / "c", moment))
