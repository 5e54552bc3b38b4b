"""The Makefile: what each target installs on a fresh clone, read from make's own dry run."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def dry_run(target: str, folder: Path) -> str:
    """What ``make TARGET`` would run in a fresh clone (no .venv yet): make's dry run, nothing executed."""
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, folder / name)
    done = subprocess.run(["make", "-n", target], cwd=folder, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_train_installs_blocklab_without_the_test_extra(tmp_path: Path) -> None:
    """The main job needs blocklab alone: a fresh clone's make train must not pull the test extra
    (transformers, TransformerLens, ray, playwright: a 2.4 GB venv and minutes); make test does."""
    train = dry_run("train", tmp_path)
    assert "pip install --quiet -e ." in train and "blocklab train" in train
    assert "[test]" not in train and "[docs]" not in train
    test = dry_run("test", tmp_path)
    assert "pip install --quiet -e '.[test]'" in test and "pytest" in test
