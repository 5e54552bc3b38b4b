"""The cores a process may use and the threads "auto" gives it (issue 38 item 4): the CPU affinity, the
cgroup quota (v2 and v1 files written here as the kernel writes them), OMP_NUM_THREADS when the user set
it, and the processes sharing the machine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from blocklab.training import resources
from blocklab.training.resources import available_cores, cgroup_cpus, resolve_threads


def _v2(root: Path, text: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cpu.max").write_text(text)
    return root


def _v1(root: Path, quota: int, period: int) -> Path:
    (root / "cpu").mkdir(parents=True, exist_ok=True)
    (root / "cpu" / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    (root / "cpu" / "cpu.cfs_period_us").write_text(f"{period}\n")
    return root


def test_the_cgroup_quota_is_read_from_v2_then_v1(tmp_path):
    assert cgroup_cpus(_v2(tmp_path / "a", "150000 100000\n")) == 1.5
    assert cgroup_cpus(_v2(tmp_path / "b", "max 100000\n")) is None
    assert cgroup_cpus(_v1(tmp_path / "c", 200000, 100000)) == 2.0
    assert cgroup_cpus(_v1(tmp_path / "d", -1, 100000)) is None
    assert cgroup_cpus(tmp_path / "none") is None
    assert cgroup_cpus(_v2(tmp_path / "e", "garbled")) is None


def test_available_cores_are_the_affinity_capped_by_the_quota(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert available_cores(tmp_path / "none") == 4
    assert available_cores(_v2(tmp_path / "a", "150000 100000")) == 2  # 1.5 CPUs: 2 threads, part time
    assert available_cores(_v2(tmp_path / "b", "800000 100000")) == 4  # a quota above the affinity
    assert available_cores(_v2(tmp_path / "c", "10000 100000")) == 1


@pytest.mark.parametrize(("omp", "side_by_side", "want"), [
    (None, 1, 4), ("1", 1, 1), ("2", 1, 2), ("16", 1, 4),  # never more than the cores
    (None, 2, 2), ("1", 2, 1), ("", 1, 4), ("junk", 1, 4), ("0", 1, 4),
])
def test_auto_threads_honour_omp_num_threads_and_the_processes_sharing(monkeypatch, omp, side_by_side, want):
    monkeypatch.setattr(resources, "available_cores", lambda: 4)
    monkeypatch.setattr(resources, "_side_by_side", side_by_side)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    assert resolve_threads(0) == want
    assert resolve_threads(3) == 3  # a number the user gave is kept


def test_the_real_machine_gives_at_least_one_core_and_no_more_than_it_has():
    assert 1 <= available_cores() <= (os.cpu_count() or 1)
