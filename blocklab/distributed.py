"""Multi-process data parallelism: this process's place in a ``torchrun`` job (gloo, CPU).

    torchrun --nproc_per_node 2 -m blocklab train --out runs/ddp

torchrun sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; ``Processes.from_env`` joins
that job. Multi-node runs use torchrun's ``--nnodes``/``--rdzv-*`` flags unchanged.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass
class Processes:
    """This process's place in a torchrun job (rank 0 of 1 without one)."""

    rank: int = 0
    world_size: int = 1
    owns_group: bool = False  # we initialised the process group, so we tear it down

    @classmethod
    def from_env(cls) -> Processes:
        """Join the job the environment describes (gloo backend), or be the only process."""
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1 and not dist.is_initialized():
            return cls()
        owns = not dist.is_initialized()
        if owns:
            dist.init_process_group("gloo")
        return cls(dist.get_rank(), dist.get_world_size(), owns)

    @property
    def main(self) -> bool:
        """Whether this process writes the run folder and the progress bar."""
        return self.rank == 0

    def sum(self, value: float) -> float:
        """``value`` summed over processes (float64)."""
        if self.world_size == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t)

    def gather(self, obj: Any) -> list[Any]:
        """Every process's ``obj``, in rank order."""
        if self.world_size == 1:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def share(self, obj: Any) -> Any:
        """Rank 0's ``obj``, on every process."""
        if self.world_size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def close(self, wait: bool = False) -> None:
        """Leave the job if we joined it (idempotent).

        ``wait=True`` (after a successful run) first waits for every rank: a rank tearing down
        gloo while rank 0 still writes the run folder could abort with "terminate called without
        an active exception". After an error we leave at once: a barrier could wait forever.
        """
        if self.owns_group and dist.is_initialized():
            if wait:
                dist.barrier()
            dist.destroy_process_group()
