"""blocklab ablate: a tiny grid end to end, its summary against the run folders, and resume."""

import json
import statistics
import sys

import pytest
from processes import assert_interrupted_cleanly, ctrl_c_at

from blocklab.cli import main
from blocklab.cli.args import parse_vary
from blocklab.lab.ablate import cell_name, grid_cells

TINY = ["--task", "listops", "--d-model", "16", "--n-heads", "2", "--d-ff", "32", "--steps", "20",
        "--warmup", "5", "--eval-every", "10", "--log-every", "10", "--batch-size", "32",
        "--checkpoint-every", "0", "--log-diagnostics", "10"]


def test_grid_cells_and_names():
    cells = grid_cells(parse_vary(["n_layers=1,2", "norm-position=post,pre", "lr=1e-3"]))
    assert len(cells) == 4 and cells[1] == {"n_layers": 1, "norm_position": "pre", "lr": 0.001}
    assert cell_name(cells[1]) == "n_layers-1__norm_position-pre__lr-0.001"


def test_grid_cells_keep_the_none_ablations_as_words():
    cells = grid_cells(parse_vary(["residual=add,none", "norm=standard,none"]))
    assert [(c["residual"], c["norm"]) for c in cells] == [("add", "standard"), ("add", "none"),
                                                           ("none", "standard"), ("none", "none")]


def _last_eval(folder):
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "eval_accuracy" in r][-1]


def test_ablate_tiny_grid_end_to_end_and_resume(tmp_path, capsys):
    out = tmp_path / "grid"
    args = ["ablate", *TINY, "--vary", "n_layers=1,2", "--seeds", "2", "--out", str(out),
            "--steps-to-accuracy", "0.05"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert printed.count("skipped") == 0 and "summary.json" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert [c["name"] for c in summary["cells"]] == ["n_layers-1", "n_layers-2"]
    for cell in summary["cells"]:
        runs = [out / cell["name"] / f"seed-{s}" for s in range(2)]
        config = json.loads((runs[0] / "config.json").read_text())
        assert config["model"]["n_layers"] == cell["cell"]["n_layers"] and config["model"]["d_model"] == 16
        accs = [_last_eval(r)["eval_accuracy"] for r in runs]  # read from each run's own metrics.jsonl
        assert cell["accuracy"]["mean"] == pytest.approx(statistics.fmean(accs), abs=1e-12)
        assert cell["accuracy"]["std"] == pytest.approx(statistics.stdev(accs), abs=1e-12)
        assert cell["diverged"] == 0 and cell["seeds"] == 2
        assert not (runs[0] / "report.html").exists()  # per-run reports only with --run-reports
        diag = [json.loads(line) for line in (runs[0] / "metrics.jsonl").read_text().splitlines()]
        assert len([r for r in diag if "diag" in r][-1]["diag"]["grad_resid"]) == cell["cell"]["n_layers"] + 1
    page = (out / "report.html").read_text()
    assert page.count("<img") == 2 and "n_layers-2" in page

    # rerun: every finished run is skipped, nothing is retrained
    before = {p: p.stat().st_mtime_ns for p in out.rglob("metrics.jsonl")}
    assert main(args) == 0
    assert capsys.readouterr().out.count("skipped (done before)") == 4
    assert {p: p.stat().st_mtime_ns for p in out.rglob("metrics.jsonl")} == before

    # an interrupted run (no result.json yet) resumes from its checkpoint to the same numbers
    run = out / "n_layers-2" / "seed-1"
    expected = json.loads((run / "result.json").read_text())
    (run / "result.json").unlink()
    assert main(args) == 0
    assert capsys.readouterr().out.count("skipped (done before)") == 3
    again = json.loads((run / "result.json").read_text())
    assert again["accuracy"] == expected["accuracy"] and again["loss"] == expected["loss"]
    cells = json.loads((out / "summary.json").read_text())["cells"]
    assert [c["accuracy"] for c in cells] == [c["accuracy"] for c in summary["cells"]]


@pytest.fixture(scope="module")
def finished_grid(tmp_path_factory):
    """A one-run grid, trained once: (its command line, its folder)."""
    out = tmp_path_factory.mktemp("grid") / "g"
    args = ["ablate", *TINY, "--steps", "10", "--out", str(out)]
    assert main(args) == 0
    return args, out


@pytest.mark.parametrize(("damage", "named"), [
    (lambda r: r.update(diag=[{"step": 1}]), "diag[0].grad_resid is missing"),  # was KeyError: 'grad_resid'
    (lambda r: r["curve"][0].update(step=10**400), "curve[0] must be an object with an integer step"),
    (lambda r: r.update(steps_to_target=10**400), "steps_to_target=1000"),  # was OverflowError
    (lambda r: r["diag"][0].update(grad_resid=[10**400]), "diag[0].grad_resid=[1000"),
    (lambda r: r.update(loss=-(10**400)), "loss=-1000"),
])
def test_a_damaged_result_json_is_refused_naming_the_field(finished_grid, tmp_path, capsys, damage, named):
    import shutil

    args, out = finished_grid
    copy = tmp_path / "g"
    shutil.copytree(out, copy)
    path = copy / "base" / "seed-0" / "result.json"
    result = json.loads(path.read_text())
    damage(result)
    path.write_text(json.dumps(result))
    capsys.readouterr()
    assert main([*args[:-1], str(copy)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("blocklab: error: ") and "result.json" in err, err
    assert named in err and "Traceback" not in err


def test_ablate_rejects_an_invalid_cell_before_training(tmp_path, capsys):
    code = main(["ablate", *TINY, "--vary", "n_heads=2,3", "--out", str(tmp_path / "g")])
    assert code == 2
    assert "n_heads=3 must divide d_model=16" in capsys.readouterr().err
    assert not (tmp_path / "g").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process tree from /proc")
@pytest.mark.usefixtures("ctrl_c")  # the child must start with Python's own SIGINT handler
def test_ctrl_c_on_ablate_with_two_jobs_while_the_workers_start_is_one_line_and_status_130(tmp_path):
    """Issue 35, F8: a worker interrupted while importing torch printed a KeyboardInterrupt traceback."""
    command = ["ablate", *TINY, "--vary", "n_layers=1,2", "--jobs", "2"]
    assert_interrupted_cleanly(ctrl_c_at(command, tmp_path / "g", "workers importing torch"))


def test_a_curve_without_eval_rows_draws_its_report_without_a_warning(finished_grid, tmp_path):
    """Issue 35, L6: matplotlib's two-line 'No artists with labels found to put in legend' leaked."""
    import shutil

    args, out = finished_grid
    copy = tmp_path / "g"
    shutil.copytree(out, copy)
    path = copy / "base" / "seed-0" / "result.json"
    result = json.loads(path.read_text())
    result["curve"] = [{k: v for k, v in row.items() if k in ("step", "loss")} for row in result["curve"]]
    path.write_text(json.dumps(result))
    import subprocess

    done = subprocess.run([sys.executable, "-m", "blocklab", *args[:-1], str(copy)], capture_output=True,
                          text=True, timeout=300, check=False)  # a process: pytest records warnings itself
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert "<img" in (copy / "report.html").read_text()
