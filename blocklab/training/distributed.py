"""Multi-process data parallelism: this process's place in a ``torchrun`` job.

    torchrun --nproc_per_node 2 -m blocklab train --out runs/ddp
    torchrun --nproc_per_node 4 -m blocklab train --device cuda --out runs/ddp    # one GPU each

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; ``Processes.from_env``
joins that job: NCCL when the processes compute on CUDA (each on GPU LOCAL_RANK), gloo otherwise.
Multi-node runs use torchrun's ``--nnodes``/``--rdzv-*`` flags unchanged.
"""

from __future__ import annotations

import importlib
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
    group: dist.ProcessGroup | None = None  # the group we initialised, so we tear it down (``close``)
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
            # torch.distributed.nn.functional's collectives take ``group=group.WORLD`` as a default,
            # evaluated at its first import, which DDP triggers (through torch._dynamo) once the group
            # exists: that kept the group alive past destroy_process_group, and with it gloo's worker
            # threads, into interpreter shutdown, where one freeing a collective's tensors aborted the
            # process. Imported first, the default is None, and ``close`` joins the workers.
            importlib.import_module("torch.distributed.nn.functional")
            dist.init_process_group(backend_for(device))
        collectives = device if dist.get_backend() == "nccl" else torch.device("cpu")
        return cls(dist.get_rank(), dist.get_world_size(), dist.group.WORLD if owns else None, collectives)

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
        """Leave the job if we made its group (idempotent), destroying the group here, so that no
        gloo worker thread is left to free a collective's tensors during interpreter shutdown, where
        taking the GIL to do so aborts the process.

        Our reference is the group's last (nothing else may hold it: release a DDP wrapper, whose
        reducer does, first), so dropping it destroys the group through torch's holder that releases
        the GIL while the workers are joined: a worker still freeing tensors needs it. Any last owner
        dropped with the GIL held (a reducer) deadlocks there.

        ``wait=True`` (after a successful run) first waits for every rank, so no rank closes its
        connections while another is still in a collective with it. After an error we leave at
        once: a barrier could wait forever.
        """
        if self.group is not None and dist.is_initialized():
            if wait:
                dist.barrier()
            dist.destroy_process_group()
        self.group = None


def backend_for(device: torch.device) -> str:
    """The process-group backend for processes computing on ``device``: NCCL for CUDA, gloo otherwise."""
    return "nccl" if device.type == "cuda" else "gloo"
