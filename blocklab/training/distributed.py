"""Multi-process data parallelism: this process's place in a ``torchrun`` job.

    torchrun --nproc_per_node 2 -m blocklab train --out runs/ddp
    torchrun --nproc_per_node 4 -m blocklab train --device cuda --out runs/ddp    # one GPU each

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; ``Processes.from_env``
joins that job: NCCL when the processes compute on CUDA (each on GPU LOCAL_RANK), gloo otherwise.
Multi-node runs use torchrun's ``--nnodes``/``--rdzv-*`` flags unchanged.
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
    device: torch.device = torch.device("cpu")  # where the collectives' tensors live (NCCL: this GPU)

    @classmethod
    def from_env(cls, device: torch.device | None = None) -> Processes:
        """Join the job the environment describes, or be the only process. ``device``: where this
        process computes; CUDA joins with NCCL (this process's GPU made current), anything else gloo."""
        device = torch.device("cpu") if device is None else device
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1 and not dist.is_initialized():
            return cls(device=device)
        owns = not dist.is_initialized()
        if device.type == "cuda":
            torch.cuda.set_device(device)  # NCCL's object collectives use the current GPU
        if owns:
            dist.init_process_group(backend_for(device))
        collectives = device if dist.get_backend() == "nccl" else torch.device("cpu")
        return cls(dist.get_rank(), dist.get_world_size(), owns, collectives)

    @property
    def main(self) -> bool:
        """Whether this process writes the run folder and the progress bar."""
        return self.rank == 0

    def sum(self, value: float) -> float:
        """``value`` summed over processes (float64)."""
        if self.world_size == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
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


def backend_for(device: torch.device) -> str:
    """The process-group backend for processes computing on ``device``: NCCL for CUDA, gloo otherwise."""
    return "nccl" if device.type == "cuda" else "gloo"
