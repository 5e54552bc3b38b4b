"""A report shown as a table, Markdown and HTML: every setup's verdict and numbers appear."""

import html

import jsonschema

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


def _report():
    depth = {"depths": [6, 48], "pre": [0.99, 0.98], "post": [0.99, 0.11], "trains_at": 0.5}
    shallow = {**depth, "post": [0.99, 0.97]}
    gelu = {"tanh": {"max_err": 4.7e-4, "at": 2.7}, "sigmoid": {"max_err": 2.03e-2, "at": -2.27}}
    claims = []
    four = [depth, shallow, shallow, depth]  # default, learned-positions, tokens-0.02, low-lr
    for module, numbers in ((pre_norm_depth, four), (gelu_approximations, [gelu])):
        c = module.CLAIM
        setups = [_setup(s, m, c.verdict, c.headline) for s, m in zip(c.setups, numbers, strict=True)]
        verdict, reason = combine({s["name"]: s["verdict"] for s in setups})
        claims.append({
            "name": c.name, "kind": c.kind, "statement": c.statement, "source": c.source.to_dict(),
            "method": c.method, "notes": c.notes, "params": {}, "runs": 0, "seconds": 0.0, "verdict": verdict,
            "reason": reason, "setups": setups,
        })  # fmt: skip
    return {
        "schema_version": 2, "mode": "full", "jobs": 2, "seconds": 1.0,
        "load_average": {"mean": 1.0, "min": 0.5, "max": 1.5},
        "machine": {"python": "3.11", "torch": "2", "cpus": 2, "platform": "linux"}, "claims": claims,
    }  # fmt: skip


def test_a_synthetic_report_validates_and_a_disagreeing_claim_depends():
    report = _report()
    jsonschema.validate(report, schema())
    depth = report["claims"][0]
    assert [s["verdict"] for s in depth["setups"]] == ["holds", "partly", "partly", "holds"]
    assert depth["verdict"] == "depends"


def test_markdown_has_a_row_per_setup_with_its_numbers():
    lines = claims_markdown(_report()).splitlines()
    assert len(lines) == 2 + 4 + 1 + 2
    caption = ("*blocklab claims (full, 1 s, 2 jobs, "
               "load average 1.0 (max 1.5) on 2 cpus); torch 2, Python 3.11.*")
    assert lines[-1] == caption
    first = "| `pre-norm-depth` | **depends** | default (source) | holds | depth 6 48: pre 99% 98%"
    assert lines[2].startswith(first)
    assert "learned-positions (confound) | partly" in lines[3] and "at depth 48 post-norm ends" in lines[3]
    assert "tokens-0.02 (confound) | partly" in lines[4]
    assert lines[6].startswith("| `gelu-approximations` | **partly** | exact (exact) | partly |")


def test_html_has_a_plot_per_setup_and_the_source():
    page = claims_html(_report())
    assert page.count("<img") == 5 and "Wang et al. 2019" in page and "depends" in page
    assert html.escape(REGISTRY["pre-norm-depth"].source.citation) in page


def test_details_name_each_setup_its_verdict_and_the_source():
    text = claims_details_markdown(_report())
    assert "### `pre-norm-depth` — depends" in text and "Wang et al. 2019" in text
    assert "- **learned-positions** (confound; " in text and "): **partly** — depth 6 48: pre 99% 98%" in text
    assert "the position signal next to the tokens'; `{\"model\": {\"pos_encoding\": \"learned\"}}`)" in text
    assert '`{"train": {"lr": 0.001}}`' in text and "- **default** (source; blocklab's listops model" in text
    verdict = (
        "the verdict depends on the setup: holds in default, low-lr; "
        "partly in learned-positions, tokens-0.02."
    )
    assert verdict in text
    assert "The source's setup: depth" in text
    assert text.count("The source's setup") == 1  # not for the exact claim


def test_summary_has_a_row_per_claim_linking_to_its_details():
    lines = claims_summary_markdown(_report(), "docs/lab.md").splitlines()
    assert lines[:2] == ["| claim | verdict | per setup |", "|---|---|---|"]
    assert lines[2] == (
        "| [`pre-norm-depth`](docs/lab.md#pre-norm-depth): Pre-norm trains deep stacks where post-norm "
        "struggles. | **depends** | default holds, learned-positions partly, tokens-0.02 partly, "
        "low-lr holds |"
    )
    assert lines[3].startswith("| [`gelu-approximations`](docs/lab.md#gelu-approximations): ")
    assert lines[3].endswith("| **partly** | exact partly |")
    assert len(lines) == 2 + 2 + 2
    assert '<a id="pre-norm-depth"></a>' in claims_details_markdown(_report())
