"""Process-group set-up for the learner: torchrun environment, device/backend choice, mesh, small collectives.

The learner runs under ``torchrun`` (single- or multi-node through its rendezvous); every rank calls
:func:`init_distributed`, which reads ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``, picks NCCL on CUDA and gloo on CPU (the
same code path either way; nothing calls ``.cuda()``), and builds the 1-D device mesh FSDP2 shards over. Without
torchrun variables it returns a single-process context whose collectives are no-ops, so the learner and its tests
also run in one plain process. Collectives here move only tensors: objects travel as msgpack bytes, never pickle.
"""

from __future__ import annotations

import datetime
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from async_rl.learner.batching import RolloutBatch

__all__ = [
    "DistContext",
    "init_distributed",
    "local_context",
    "log_rank0",
    "pick_device",
    "share_batch",
    "teardown",
]

logger = logging.getLogger(__name__)


# torch 2.13 renamed all_gather_into_tensor (now deprecated) to all_gather_single; older builds (the CUDA torch a
# vLLM wheel pins, say) have only the old name
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def pick_device(local_rank: int = 0) -> torch.device:
    """``cuda:<local_rank>`` when CUDA is available, else CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % max(torch.cuda.device_count(), 1))
    return torch.device("cpu")


@dataclass
class DistContext:
    """Rank/world/device facts plus the handful of collectives the learner needs (no-ops when world_size == 1)."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str | None
    mesh: DeviceMesh | None

    @property
    def is_distributed(self) -> bool:
        return self.backend is not None

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.is_distributed:
            dist.barrier()

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Reduce ``tensor`` over ranks (``sum``/``max``/``min``) and return the result on the tensor's own device."""
        ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
        if op not in ops:
            raise ValueError(f"op must be one of {sorted(ops)}, got {op!r}")
        if not self.is_distributed:
            return tensor
        work = tensor.to(self.device).contiguous()
        dist.all_reduce(work, op=ops[op])
        return work.to(tensor.device)

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate equally shaped tensors from all ranks along dim 0 (rank order)."""
        if not self.is_distributed:
            return tensor
        work = tensor.to(self.device).contiguous()
        out = torch.empty((self.world_size * work.shape[0], *work.shape[1:]), dtype=work.dtype, device=self.device)
        _all_gather_single(out, work)
        return out.to(tensor.device)

    def broadcast_bytes(self, data: bytes | None, src: int = 0) -> bytes:
        """Send ``data`` from rank ``src`` to every rank (others pass ``None``); returns the bytes on all ranks."""
        if not self.is_distributed:
            if data is None:
                raise ValueError("data must be given on the source rank")
            return data
        if self.rank == src:
            if data is None:
                raise ValueError("data must be given on the source rank")
            size = torch.tensor([len(data)], dtype=torch.int64, device=self.device)
        else:
            size = torch.zeros(1, dtype=torch.int64, device=self.device)
        dist.broadcast(size, src=src)
        n = int(size.item())
        if self.rank == src:
            assert data is not None
            buf = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.device) if n else torch.empty(0)
        else:
            buf = torch.empty(n, dtype=torch.uint8, device=self.device)
        if n:
            dist.broadcast(buf, src=src)
            return bytes(buf.cpu().numpy().tobytes())
        return b""

    def broadcast_tensors(self, tensors: dict[str, torch.Tensor] | None, src: int = 0) -> dict[str, torch.Tensor]:
        """Send rank ``src``'s named CPU tensors to every rank (others pass ``None``); returns them on CPU everywhere.

        A msgpack header (names, dtypes, shapes) goes first; then one flat buffer per dtype, so a batch of a dozen
        tensors costs three or four broadcasts, not a dozen."""
        if not self.is_distributed:
            if tensors is None:
                raise ValueError("tensors must be given on the source rank")
            return tensors
        header = None
        if self.rank == src:
            if tensors is None:
                raise ValueError("tensors must be given on the source rank")
            header = msgspec.msgpack.encode(
                [[k, str(v.dtype).removeprefix("torch."), list(v.shape)] for k, v in tensors.items()]
            )
        spec = msgspec.msgpack.decode(self.broadcast_bytes(header, src=src))
        out: dict[str, torch.Tensor] = {}
        for dtype_name in dict.fromkeys(d for _, d, _ in spec):
            dtype = getattr(torch, dtype_name)
            carrier = torch.uint8 if dtype == torch.bool else dtype  # gloo has no bool collectives
            names = [(k, shape) for k, d, shape in spec if d == dtype_name]
            sizes = [math.prod(shape) for _, shape in names]
            if self.rank == src:
                assert tensors is not None
                flat = torch.cat([tensors[k].reshape(-1).to(carrier) for k, _ in names]).to(self.device)
            else:
                flat = torch.empty(sum(sizes), dtype=carrier, device=self.device)
            if flat.numel():
                dist.broadcast(flat, src=src)
            for (k, shape), part in zip(names, flat.cpu().to(dtype).split(sizes), strict=True):
                out[k] = part.reshape(shape)
        return out


def local_context(device: torch.device | None = None) -> DistContext:
    """A single-process context: world size 1, no process group, collectives are identities."""
    return DistContext(rank=0, world_size=1, local_rank=0, device=device or pick_device(0), backend=None, mesh=None)


def init_distributed(*, backend: str, timeout_s: float) -> DistContext:
    """Join the torchrun process group (or return :func:`local_context` when not launched by torchrun).

    ``backend``: ``auto`` (nccl with CUDA, else gloo), ``nccl`` or ``gloo``. ``timeout_s``: how long a collective may
    wait (``async_training.timeouts.collective_s``).
    """
    if backend not in ("auto", "nccl", "gloo"):
        raise ValueError(f"backend must be 'auto', 'nccl' or 'gloo', got {backend!r}")
    if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
        logger.info("no torchrun environment (RANK/WORLD_SIZE unset): running as a single process")
        return local_context()
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(local_rank)
    chosen = ("nccl" if device.type == "cuda" else "gloo") if backend == "auto" else backend
    if chosen == "nccl" and device.type != "cuda":
        raise ValueError("backend 'nccl' needs CUDA devices; use 'gloo' or 'auto' on CPU")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        kwargs: dict[str, Any] = {"backend": chosen, "timeout": datetime.timedelta(seconds=timeout_s)}
        if device.type == "cuda":
            kwargs["device_id"] = device
        dist.init_process_group(**kwargs)
    mesh = init_device_mesh(device.type, (world_size,), mesh_dim_names=("dp",))
    ctx = DistContext(rank, world_size, local_rank, device, chosen, mesh)
    log_rank0(ctx, logger, "learner group up: world_size=%d backend=%s device=%s", world_size, chosen, device.type)
    return ctx


def teardown(ctx: DistContext, *, failed: bool = False) -> None:
    """Leave the process group: after a barrier so no rank exits while others still communicate, except when this
    rank ``failed`` (the others are not at a barrier; waiting for them would hang instead of reporting the error)."""
    if ctx.is_distributed and dist.is_initialized():
        try:
            if not failed:
                dist.barrier()
        finally:
            dist.destroy_process_group()


def log_rank0(ctx: DistContext, log: logging.Logger, msg: str, *args: Any, level: int = logging.INFO) -> None:
    """Log only on rank 0 (every rank holds the same facts; N copies of each line help nobody)."""
    if ctx.is_rank0:
        log.log(level, msg, *args)


def share_batch(
    ctx: DistContext, batch: RolloutBatch | None, group_ids: Sequence[int] | None
) -> tuple[RolloutBatch, list[int]]:
    """Broadcast rank 0's collated batch and its group ids to every rank as tensors (others pass ``None``): the
    batch's set fields in field order (:meth:`RolloutBatch.tensors`), then the ids."""
    tensors = None
    if ctx.is_rank0:
        if batch is None or group_ids is None:
            raise ValueError("rank 0 must pass the batch and its group ids")
        tensors = {**batch.tensors(), "_group_ids": torch.tensor([int(g) for g in group_ids], dtype=torch.long)}
    shared = ctx.broadcast_tensors(tensors)
    ids = [int(g) for g in shared.pop("_group_ids").tolist()]
    return RolloutBatch(**shared), ids
