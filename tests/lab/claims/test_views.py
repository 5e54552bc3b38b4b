"""A report shown as a table, Markdown and HTML: every setup's verdict, tests (effects, intervals, margins
and their origin, sensitivity) and training settings appear."""

import html

import jsonschema
import pytest

from blocklab.lab.claims import (
    REGISTRY,
    claims_details_markdown,
    claims_html,
    claims_markdown,
    claims_summary_markdown,
    claims_table,
    combine,
    gelu_approximations,
    pre_norm_depth,
    schema,
)
from blocklab.lab.claims.runner import training_settings


def _setup(claim, setup, m):
    specs = claim.runs(claim.full, setup) if claim.runs else []
    return {**setup.to_dict(), "runs": len(specs), "seconds": 0.0, "training": training_settings(specs),
            "headline": claim.headline(m), **claim.verdict(m).to_dict(), "measurements": m}  # fmt: skip


@pytest.fixture
def report(arm, spread):
    """pre-norm-depth in its three setups (holds, fails, inconclusive) and gelu-approximations (holds)."""
    numbers = lambda post: {
        "depths": [6, 20, 30],
        "deep": 20,
        "trains_at": 0.5,
        "pre": [arm(spread(0.95))] * 3,
        "post": [arm(spread(c)) for c in post],
        "null": arm(list(reversed(spread(post[0], width=0.012)))),
    }
    depth = [numbers((0.95, 0.15, 0.15)), numbers((0.95, 0.95, 0.95)), numbers((0.2, 0.15, 0.15))]
    gelu = {"tanh": {"max_err": 4.7e-4, "at": 2.7, "relative": 1.8e-4},
            "sigmoid": {"max_err": 2.03e-2, "at": 2.27, "relative": 9.1e-3}}  # fmt: skip
    claims = []
    for module, measured in ((pre_norm_depth, depth), (gelu_approximations, [gelu])):
        c = module.CLAIM
        setups = [_setup(c, s, m) for s, m in zip(c.setups, measured, strict=True)]
        verdict, reason = combine([(s["name"], s["role"], s["verdict"]) for s in setups])
        claims.append({
            "name": c.name, "kind": c.kind, "statement": c.statement, "source": c.source.to_dict(),
            "method": c.method, "notes": c.notes, "params": {}, "runs": 0, "seconds": 0.0, "verdict": verdict,
            "reason": reason, "sensitivity": setups[0]["sensitivity"], "setups": setups,
        })  # fmt: skip
    return {
        "schema_version": 4, "mode": "full", "registry": "0123456789abcdef", "code": "fedcba9876543210",
        "jobs": 2, "seconds": 1.0, "training": {"runs": 40, "kept": 30, "seconds": 1234.4},
        "load_average": {"mean": 1.0, "min": 0.5, "max": 1.5},
        "machine": {"python": "3.11", "torch": "2", "cpus": 2, "platform": "linux"}, "claims": claims,
    }  # fmt: skip


def test_a_synthetic_report_validates_and_a_disagreeing_confound_makes_the_claim_depend(report):
    jsonschema.validate(report, schema())
    depth = report["claims"][0]
    assert [s["verdict"] for s in depth["setups"]] == ["holds", "fails", "inconclusive"]
    assert depth["verdict"] == "depends"


def test_markdown_has_a_row_per_setup_with_its_numbers(report):
    lines = claims_markdown(report).splitlines()
    assert len(lines) == 2 + 3 + 1 + 2
    caption = (
        "*blocklab claims (full, 40 training runs, 1234 s of training summed over runs, 30 read back "
        "from an earlier invocation; 1 s, 2 jobs, load average 1.0 (max 1.5) on 2 cpus; registry "
        "0123456789abcdef, code fedcba9876543210); torch 2, Python 3.11.*"
    )
    assert lines[-1] == caption
    assert lines[2].startswith("| `pre-norm-depth` | **depends** (fragile) | xavier (source) | holds | ")
    assert "torch-init (confound) | fails" in lines[3]
    assert "fails: pre-norm trains better than post-norm at depth 20" in lines[3]
    # post-norm trains as pre-norm does at every depth: no effect under the condition, so "needs" fails
    assert (
        "(needs: under +0 [+0, +0], 5 seeds; without +0 [+0, +0], 5 seeds; margin 0.0432 (seed noise))"
        in lines[3]
    )
    assert (
        "low-lr (confound) | inconclusive" in lines[4] and "control: post-norm trains at depth 6" in lines[4]
    )
    assert lines[5].startswith("| `gelu-approximations` | **holds** (robust) | exact (exact) | holds |")


def test_html_has_a_plot_per_setup_the_source_and_the_training_settings(report):
    page = claims_html(report)
    assert page.count("<img") == 4 and "Wang et al. 2019" in page and "depends" in page
    assert "<span class=inconclusive>inconclusive</span>" in page
    assert "control &#10007; post-norm trains at depth 6" in page
    assert "training: AdamW" in page and "grad_clip 1.0" in page and "varied: n_layers" not in page
    assert html.escape(REGISTRY["pre-norm-depth"].source.citation) in page
    assert "The test reads" in page


def test_details_name_each_setup_its_tests_settings_controls_and_sensitivity(report):
    text = claims_details_markdown(report)
    assert "### `pre-norm-depth` — depends" in text and "Wang et al. 2019" in text
    assert "- **torch-init** (confound; " in text and "): **fails** — depth 6 20 30:" in text
    assert '`{"init": "torch"}`' not in text  # blocklab's default init is not a change
    assert '`{"train": {"lr": 0.001}, "init": "xavier"}`' in text
    assert "    - control not met: post-norm trains at depth 6 (accuracy >= 50%; 0 of 5 seeds)" in text
    assert "    - holds: pre-norm trains better than post-norm at depth 20" in text
    assert "    - training: AdamW (weight decay on matrices and embeddings" in text
    assert "weight_decay 0.01" in text and "steps 400" in text
    assert (
        "Verdict: holds in the source setup (xavier), the opposite in torch-init; confounds: torch-init "
        "fails, low-lr inconclusive. Sensitivity: **fragile** (margin x0.5 holds, margin x2 holds, one "
        "evaluation earlier fails, half the budget fails)"
        in text
    )
    assert text.count("The source's setup") == 1  # not for the exact claim


def test_summary_has_a_row_per_claim_linking_to_its_details(report):
    lines = claims_summary_markdown(report, "docs/lab.md").splitlines()
    assert lines[:2] == ["| claim | verdict | sensitivity | per setup |", "|---|---|---|---|"]
    assert lines[2] == (
        "| [`pre-norm-depth`](docs/lab.md#pre-norm-depth): Pre-norm trains deep stacks where post-norm "
        "fails. | **depends** | fragile | xavier holds, torch-init fails, low-lr inconclusive |"
    )
    assert lines[3].endswith("| **holds** | robust | exact holds |")
    assert '<a id="pre-norm-depth"></a>' in claims_details_markdown(report)


def test_the_terminal_table_names_the_sensitivity(report):
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(claims_table(report))
    text = console.export_text()
    assert "depends (fragile)" in text and "registry 0123456789abcdef" in text
