"""The processes of a run: one (plain ``python -m``) or torchrun's, and what they wait for together."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ssog_core.train.config import TrainError


@dataclass
class Dist:
    """This process's place in the run: its rank among ``world`` processes and its device."""

    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_primary(self) -> bool:
        """Whether this is rank 0, the process that writes files and logs."""
        return self.rank == 0


def init_distributed(device: str | None) -> Dist:
    """One process (plain ``python -m``) or one of torchrun's: NCCL on CUDA, gloo on CPU."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    name = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError as e:
        raise TrainError(f"--device {name!r}: {e}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise TrainError("--device cuda was asked for, but this PyTorch sees no CUDA device")
    if world == 1:
        return Dist(0, 1, dev)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if dev.type == "cuda":
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    return Dist(rank, world, dev)


def sync(d: Dist) -> None:
    """Wait for every process (a no-op for one)."""
    if d.world > 1:
        dist.barrier()
