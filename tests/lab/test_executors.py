"""Executors: a small grid and a small claims run give the same JSON on Ray (a local instance of 2 CPUs,
started here) as on local worker processes; contradictory executor flags are refused in one line."""

import json
from pathlib import Path

import pytest

from blocklab.cli import main
from blocklab.lab.ablate import ablate
from blocklab.lab.claims import registry
from blocklab.lab.executors import Executor

ray = pytest.importorskip("ray")  # in the test extra; the skip says so where it is not installed

TIMES = {"seconds", "tokens_per_s", "load_average", "machine"}  # what a run's clock or machine decides
GRID = {
    "task": {"name": "tiny-lm"},
    "vary": {"norm_position": ["post", "pre"]},
    "seeds": 2,
    "model": {"d_model": 16, "n_heads": 2, "d_ff": 32},
    "train": {"steps": 6, "warmup": 2, "eval_every": 3, "log_every": 3, "batch_size": 8,
              "checkpoint_every": 0},
}


def _without_times(value):
    if isinstance(value, dict):
        return {k: _without_times(v) for k, v in value.items() if k not in TIMES}
    if isinstance(value, list):
        return [_without_times(v) for v in value]
    return value


def _results(folder: Path) -> dict[str, dict]:
    """Every run's result.json in ``folder``, the folder's own path written as OUT."""
    return {str(p.relative_to(folder)): _without_times(json.loads(p.read_text().replace(str(folder), "OUT")))
            for p in sorted(folder.rglob("result.json"))}


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray instance of 2 CPUs for this module (the executor uses it rather than starting one)."""
    ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False)
    yield
    ray.shutdown()


def test_a_grid_gives_the_same_json_on_ray_as_on_local_workers(tmp_path, local_ray):
    local = ablate(out=tmp_path / "local", executor=Executor("local", jobs=2), **GRID)
    on_ray = ablate(out=tmp_path / "ray", executor=Executor("ray"), **GRID)
    assert _without_times(on_ray) == _without_times(local)
    assert _results(tmp_path / "ray") == _results(tmp_path / "local")
    assert len(_results(tmp_path / "local")) == 4


def test_claims_give_the_same_report_on_ray_as_on_local_workers(tmp_path, local_ray, tiny_claims):
    names = ["relu-sparsity", "layernorm-moments"]  # no timing among their numbers
    local = registry.run_claims(names, quick=True, executor=Executor("local", jobs=2),
                                out=tmp_path / "local", progress=False)
    on_ray = registry.run_claims(names, quick=True, executor=Executor("ray"), out=tmp_path / "ray",
                                 progress=False)
    assert _without_times(on_ray) == _without_times(local)
    assert _results(tmp_path / "ray") == _results(tmp_path / "local")


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--address", "127.0.0.1:6379"],
         "--address 127.0.0.1:6379 names a Ray cluster, but the executor is 'local': add --executor ray"),
        (["--executor", "ray", "--address", "auto", "--jobs", "2"],
         "--jobs 2 sets the CPUs of a Ray instance"),
    ],
)
def test_contradictory_executor_flags_are_refused_in_one_line(tmp_path, capsys, flags, message):
    argv = ["claims", "--quick", "--only", "layernorm-moments", "--out", str(tmp_path / "c"), *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "c").exists()
