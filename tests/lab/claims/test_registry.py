"""The registry: built from the claim modules, every training and init claim measured in a source-like
setup and at least one confound; a tiny end-to-end run whose JSON validates with a verdict per setup;
every task the claims train on reopens with ``blocklab eval``."""

import dataclasses
import json
import pkgutil
from importlib import import_module

import jsonschema
import pytest

import blocklab.lab.claims as claims_package
from blocklab.cli import main
from blocklab.lab.claims import CLAIMS, REGISTRY, VERDICTS, combine, registry, runner, schema
from blocklab.lab.claims.shared import NULL_SEED
from blocklab.lab.executors import Executor

NOT_CLAIMS = {"base", "changelog", "shared", "registry", "rules", "runner", "views"}


def test_the_registry_holds_every_claim_module_once(tiny_claims):
    modules = {m.name for m in pkgutil.iter_modules(claims_package.__path__)} - NOT_CLAIMS
    assert {import_module(f"blocklab.lab.claims.{m}").CLAIM.name for m in modules} == set(REGISTRY)
    assert len(CLAIMS) == len(REGISTRY) == len(modules) == len(tiny_claims)


@pytest.mark.parametrize("claim", CLAIMS, ids=lambda c: c.name)
def test_every_training_claim_has_a_source_setup_and_a_confound(claim):
    roles = [s.role for s in claim.setups]
    if claim.kind == "exact":
        assert roles == ["exact"]
    else:
        assert roles.count("source") == 1 and set(roles) <= {"source", "confound", "sweep"}
    if claim.kind == "training":
        assert "confound" in roles
    assert claim.source.citation and claim.source.section and claim.source.statement and claim.source.reads


# Claims about training stability: their confounds must include a learning rate other than the source's.
# (Not pre-vs-post-warmup: its claim is conditional on a high learning rate, and a lower one leaves the
# claim's scope, so a setup there would score what the claim does not say; issue 25.)
STABILITY = {"pre-norm-depth"}
# The init a source states -> the scheme its source setup must use (a source that states none: blocklab's)
STATED_INIT = {"Xavier": "xavier", "He et al.": "he", "Glorot": "xavier"}


def _changes(claim, field):
    """The setups of ``claim`` whose ModelConfig/TrainConfig ``field`` differs from its source setup's."""
    source = next(s for s in claim.setups if s.role == "source")
    base = {**source.model, **source.train}
    return [s.name for s in claim.setups if {**s.model, **s.train}.get(field, None) != base.get(field, None)]


@pytest.mark.parametrize("claim", [c for c in CLAIMS if c.kind != "exact"], ids=lambda c: c.name)
def test_every_source_setup_uses_the_init_its_source_states(claim):
    """issue 25: training claims used to be forced onto GPT-2's N(0, 0.02); each source setup now draws its
    weights as the source did, and a confound varies the init (or the claim's own variable)."""
    source = next(s for s in claim.setups if s.role == "source")
    stated = claim.source.to_dict()["setup"]["init"]
    expected = next((scheme for word, scheme in STATED_INIT.items() if word in stated), "torch")
    assert source.init == expected, (claim.name, stated)
    if claim.name in STABILITY:
        assert _changes(claim, "lr"), claim.name


def test_claims_quick_end_to_end_gives_a_verdict_per_setup(tmp_path, tiny_claims, capsys):
    out, page = tmp_path / "claims.json", tmp_path / "claims.html"
    argv = [
        "claims",
        "--quick",
        "--jobs",
        "1",
        "--out",
        str(tmp_path / "runs"),
        "--json",
        str(out),
        "--html",
        str(page),
    ]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    jsonschema.validate(report, schema())
    assert [c["name"] for c in report["claims"]] == [c.name for c in tiny_claims]
    for claim, got in zip(tiny_claims, report["claims"], strict=True):
        assert [s["name"] for s in got["setups"]] == [s.name for s in claim.setups_run(quick=True)]
        verdicts = [(s["name"], s["role"], s["verdict"]) for s in got["setups"]]
        assert all(v in VERDICTS for _, _, v in verdicts)
        assert (got["verdict"], got["reason"]) == combine(verdicts)
        runs = [len(claim.runs(claim.quick, s)) if claim.runs else 0 for s in claim.setups_run(quick=True)]
        assert [s["runs"] for s in got["setups"]] == runs
    by_name = {c["name"]: c for c in report["claims"]}
    relu = by_name["relu-sparsity"]["setups"][0]["measurements"]  # 2 seeds of 2 layers
    assert len(relu["init"]) == len(relu["trained"]) == 2 and all(len(layers) == 2 for layers in relu["init"])
    assert all(0 <= x <= 1 for layers in relu["trained"] for x in layers)
    html = page.read_text()
    assert html.count("<img") == sum(len(c.setups_run(quick=True)) for c in tiny_claims)
    assert report["warning"].startswith("a smoke run")
    assert "blocklab claims" in capsys.readouterr().out


def test_claims_rejects_unknown_names(capsys):
    assert main(["claims", "--only", "nope"]) == 2
    assert "unknown claim nope" in capsys.readouterr().err


def test_every_task_a_claim_trains_on_reopens_with_blocklab_eval(tmp_path, capsys, tiny_claims):
    tasks = {
        json.dumps(spec.task, sort_keys=True)
        for c in tiny_claims
        if c.runs
        for s in c.setups
        for spec in c.runs(c.quick, s)
    }
    assert {json.loads(t)["name"] for t in tasks} == {"listops", "listops-padded", "text"}
    for i, task in enumerate(map(json.loads, sorted(tasks))):
        out = tmp_path / str(i)
        args = ["train", "--task", task["name"], "--d-model", "16", "--n-heads", "2", "--d-ff", "32",
                "--steps", "2", "--eval-every", "2", "--batch-size", "8", "--no-report", "-q",
                "--out", str(out)]  # fmt: skip
        args += [flag for k, v in task.items() if k != "name" for flag in ("--task-option", f"{k}={v}")]
        assert main(args) == 0
        capsys.readouterr()
        assert main(["eval", "--checkpoint", str(out), "--json"]) == 0
        result = json.loads(capsys.readouterr().out)
        assert result["task"] == {**result["task"], **task} and 0 <= result["accuracy"] <= 1


def test_a_failed_training_run_is_raised_by_run_claims(tiny_claims):
    # an lr train() refuses: the worker thread's ValueError reaches the caller, not "did not finish"
    claim = registry.REGISTRY["relu-sparsity"]
    broken = dataclasses.replace(claim, quick={**claim.quick, "lr": -1.0})
    with pytest.raises(ValueError, match="lr"):
        runner.run_claims([broken], quick=True, executor=Executor(jobs=1), progress=False)


def test_seeds_reach_every_claim_measured_over_seeds_and_refuse_where_none_is(capsys):
    counts, gelu = registry.with_seeds(registry.select(["gelu-vs-relu", "param-counts"]), 5, quick=False)
    assert gelu.full["seeds"] == 5 and counts.full == REGISTRY["param-counts"].full
    seeds = {s.train["seed"] for s in gelu.runs(gelu.full, gelu.setups[0])}
    assert seeds == {*range(5), *range(NULL_SEED, NULL_SEED + 5)}  # the arms' and the null arm's
    assert registry.with_seeds(CLAIMS, None, quick=True) == CLAIMS
    with pytest.raises(ValueError, match="applies to claims measured over seeds; none of param-counts"):
        registry.with_seeds(registry.select(["param-counts"]), 2, quick=False)
    assert main(["claims", "--only", "param-counts", "--seeds", "2"]) == 2
    assert "none of param-counts is" in capsys.readouterr().err
    assert main(["claims", "--only", "gelu-vs-relu", "--seeds", "0"]) == 2
    assert "--seeds" in capsys.readouterr().err


def _own_lines(path) -> list[str]:
    """A claim file's lines, stripped, without blank lines, import lists (which name what it uses) and
    lines of brackets alone."""
    lines, in_import = [], False
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith(("from ", "import ")):
            in_import = stripped.endswith("(")
            continue
        if in_import:
            in_import = stripped != ")"
            continue
        if stripped.strip("()[]{},"):
            lines.append(stripped)
    return lines


def test_no_two_claim_files_share_six_lines():
    """Issue 26: 23 of 36 duplicate pairs were claim boilerplate (setups, the Claim(...) tail); what claims
    share lives in base.py (Claim.of) and shared.py (setups, arms, plots), so no claim file repeats
    another's run of six lines."""
    import difflib
    from itertools import combinations
    from pathlib import Path

    files = sorted(p for p in Path(claims_package.__path__[0]).glob("*.py") if p.stem not in NOT_CLAIMS)
    own = {p.stem: _own_lines(p) for p in files if p.stem != "__init__"}
    for a, b in combinations(own, 2):
        blocks = difflib.SequenceMatcher(None, own[a], own[b], autojunk=False).get_matching_blocks()
        longest = max(blocks, key=lambda m: m.size)
        assert longest.size < 6, (a, b, own[a][longest.a : longest.a + longest.size])


def test_seeds_are_capped_as_ablate_caps_its_runs_before_any_run_is_planned(capsys):
    """Issue 35, F7: --seeds 99999999999 planned its runs one spec at a time (RSS grew 120 MB/s)."""
    from blocklab.cli import main
    from blocklab.lab.grid import MAX_RUNS

    (gelu,) = registry.select(["gelu-vs-relu"])
    per_seed = sum(len(gelu.runs({**gelu.params(True), "seeds": 1}, s)) for s in gelu.setups)
    most = MAX_RUNS // per_seed
    (kept,) = registry.with_seeds([gelu], most, quick=True)
    assert sum(len(kept.runs(kept.params(True), s)) for s in kept.setups) == most * per_seed <= MAX_RUNS
    refused = f"--seeds {most + 1:,} makes {(most + 1) * per_seed:,} training runs; at most {MAX_RUNS:,}"
    with pytest.raises(ValueError, match=refused):
        registry.with_seeds([gelu], most + 1, quick=True)
    assert main(["claims", "--quick", "--only", "gelu-vs-relu", "--seeds", "99999999999"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("blocklab: error: --seeds 99,999,999,999 makes ") and len(err.splitlines()) == 1
