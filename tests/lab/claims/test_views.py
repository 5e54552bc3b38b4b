"""A report shown as a table, Markdown and HTML: every setup's verdict and numbers appear."""

import html

import jsonschema
import pytest

from blocklab.lab.claims import (
    REGISTRY,
    claims_details_markdown,
    claims_html,
    claims_markdown,
    claims_summary_markdown,
    combine,
    gelu_approximations,
    pre_norm_depth,
    schema,
)


def _setup(setup, m, verdict_fn, headline):
    return {**setup.to_dict(), "runs": 0, "seconds": 0.0, "headline": headline(m), **verdict_fn(m).to_dict(),
            "measurements": m}  # fmt: skip


@pytest.fixture
def report(arm):
    """pre-norm-depth in its three setups (holds, partly, inconclusive) and gelu-approximations (holds)."""
    trains, fails = arm([0.99] * 3), arm([0.11, 0.12, None])
    depth = {"depths": [6, 20, 30], "pre": [trains] * 3, "post": [trains, fails, fails], "trains_at": 0.5}
    shallow = {**depth, "post": [trains] * 3}  # post-norm trains at depth: partly
    broken = {**depth, "post": [fails] * 3}  # post-norm's baseline does not train: inconclusive
    gelu = {"tanh": {"max_err": 4.7e-4, "at": 2.7, "relative": 1.8e-4},
            "sigmoid": {"max_err": 2.03e-2, "at": 2.27, "relative": 9.1e-3}}  # fmt: skip
    claims = []
    for module, numbers in ((pre_norm_depth, [depth, shallow, broken]), (gelu_approximations, [gelu])):
        c = module.CLAIM
        setups = [_setup(s, m, c.verdict, c.headline) for s, m in zip(c.setups, numbers, strict=True)]
        verdict, reason = combine({s["name"]: s["verdict"] for s in setups})
        claims.append({
            "name": c.name, "kind": c.kind, "statement": c.statement, "source": c.source.to_dict(),
            "method": c.method, "notes": c.notes, "params": {}, "runs": 0, "seconds": 0.0, "verdict": verdict,
            "reason": reason, "setups": setups,
        })  # fmt: skip
    return {
        "schema_version": 3, "mode": "full", "jobs": 2, "seconds": 1.0,
        "training": {"runs": 40, "kept": 30, "seconds": 1234.4},
        "load_average": {"mean": 1.0, "min": 0.5, "max": 1.5},
        "machine": {"python": "3.11", "torch": "2", "cpus": 2, "platform": "linux"}, "claims": claims,
    }  # fmt: skip


def test_a_synthetic_report_validates_and_a_disagreeing_claim_depends(report):
    jsonschema.validate(report, schema())
    depth = report["claims"][0]
    assert [s["verdict"] for s in depth["setups"]] == ["holds", "partly", "inconclusive"]
    assert depth["verdict"] == "depends"


def test_markdown_has_a_row_per_setup_with_its_numbers(report):
    lines = claims_markdown(report).splitlines()
    assert len(lines) == 2 + 3 + 1 + 2
    caption = ("*blocklab claims (full, 40 training runs, 1234 s of training summed over runs, 30 read back "
               "from an earlier invocation; 1 s, 2 jobs, load average 1.0 (max 1.5) on 2 cpus); torch 2, "
               "Python 3.11.*")
    assert lines[-1] == caption
    first = ("| `pre-norm-depth` | **depends** | xavier (source) | holds | "
             "depth 6 20 30: pre 99% 99% 99%, post 99% 11% 11% (medians) | - |")
    assert lines[2] == first  # medians over seeds: a diverged run counts as 0
    assert "torch-init (confound) | partly" in lines[3]
    assert "post-norm fails to train from depth 20 on" in lines[3]
    assert "low-lr (confound) | inconclusive" in lines[4]
    assert "control: post-norm trains at depth 6" in lines[4]
    assert lines[5].startswith("| `gelu-approximations` | **holds** | exact (exact) | holds |")


def test_html_has_a_plot_per_setup_and_the_source(report):
    page = claims_html(report)
    assert page.count("<img") == 4 and "Wang et al. 2019" in page and "depends" in page
    assert "<span class=inconclusive>inconclusive</span>" in page
    assert "control &#10007; post-norm trains at depth 6" in page
    assert "<li class=obs>observation: the shortfall" not in page  # gelu has none; layernorm is not here
    assert html.escape(REGISTRY["pre-norm-depth"].source.citation) in page


def test_details_name_each_setup_its_verdict_the_source_controls_and_observations(report):
    text = claims_details_markdown(report)
    assert "### `pre-norm-depth` — depends" in text and "Wang et al. 2019" in text
    assert "- **torch-init** (confound; " in text and "): **partly** — depth 6 20 30: pre 99% 99% 99%" in text
    assert '`{"init": "torch"}`' not in text  # blocklab's default init is not a change
    assert "fairseq's Transformer init, the source's code); `{\"init\": \"xavier\"}`): **holds**" in text
    assert '`{"train": {"lr": 0.001}, "init": "xavier"}`' in text
    assert "    - control not met: post-norm trains at depth 6 (accuracy >= 50%; 0 of 3 seeds)" in text
    verdict = (
        "the verdict depends on the setup: holds in xavier; partly in torch-init "
        "(low-lr inconclusive, left out)."
    )
    assert verdict in text
    assert "The source's setup: depth" in text
    assert text.count("The source's setup") == 1  # not for the exact claim


def test_summary_has_a_row_per_claim_linking_to_its_details(report):
    lines = claims_summary_markdown(report, "docs/lab.md").splitlines()
    assert lines[:2] == ["| claim | verdict | per setup |", "|---|---|---|"]
    assert lines[2] == (
        "| [`pre-norm-depth`](docs/lab.md#pre-norm-depth): Pre-norm trains deep stacks where post-norm "
        "fails. | **depends** | xavier holds, torch-init partly, low-lr inconclusive |"
    )
    assert lines[3].startswith("| [`gelu-approximations`](docs/lab.md#gelu-approximations): ")
    assert lines[3].endswith("| **holds** | exact holds |")
    assert len(lines) == 2 + 2 + 2
    assert '<a id="pre-norm-depth"></a>' in claims_details_markdown(report)
