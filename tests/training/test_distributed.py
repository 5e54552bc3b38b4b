"""Tests for blocklab.training.distributed: leaving a torchrun job leaves nothing of gloo running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from processes import failure_text

# Each rank trains a tiny model under DDP (what ``blocklab train`` does under torchrun) and writes the
# names of its gloo threads to rank-N.json in the folder it is given (torchrun runs the ranks with -u,
# so their printed lines could interleave): during the run (rank 0, from a callback) and as
# Processes.close returns.
RANK = """
import json, os, sys
from pathlib import Path
import blocklab as bl
from blocklab.tasks import get_task
from blocklab.training.distributed import Processes
from blocklab.training.loop import TrainConfig, train

def gloo_threads():
    names = (task / "comm" for task in Path("/proc/self/task").iterdir())
    return sorted(name for name in (path.read_text().strip() for path in names) if "gloo" in name)

during, after_close, close = [], [], Processes.close

def recorded_close(procs, wait=False):
    close(procs, wait)
    after_close.append(gloo_threads())

Processes.close = recorded_close
task = get_task("listops")
config = bl.preset("listops-seed", **task.config_overrides(), d_model=16, n_heads=2, n_layers=1, d_ff=32)
train(config, TrainConfig(steps=2, batch_size=16, eval_every=2, target_accuracy=None), task,
      callbacks=[lambda ctx: during.extend(gloo_threads())], progress=False, report=False)
rank = os.environ["RANK"]
(Path(sys.argv[1]) / f"rank-{rank}.json").write_text(json.dumps({"during": during, "after": after_close[0]}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads thread names from /proc/self/task")
def test_closing_a_torchrun_rank_joins_its_gloo_threads(tmp_path: Path) -> None:
    """Processes.close destroys the group train() joined, which joins gloo's worker threads. Kept
    alive past destroy_process_group (torch.distributed.nn.functional, first imported by DDP, took
    the live group as a default argument), they ran into interpreter shutdown, where a worker freeing
    a collective's tensors needs the GIL and aborts the rank ("terminate called without an active
    exception"): the intermittent SIGABRT of the torchrun test. Destroyed later by DDP's reducer,
    GIL held, the join deadlocked with a worker waiting for the GIL (Processes.close)."""
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script),
         str(tmp_path)],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )
    assert run.returncode == 0, failure_text(run.stderr)
    ranks = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in (0, 1)]
    assert ranks[0]["during"], "no gloo thread seen during the run: the check below would see none either"
    assert [row["after"] for row in ranks] == [[], []]
