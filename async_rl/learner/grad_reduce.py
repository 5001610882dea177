"""FSDP2's gradient reduce-scatter on gloo (CPU learner groups) without its full-size temporaries.

After each unit's backward, FSDP2 copies the unit's unsharded gradients into one flat buffer in ``reduce_dtype``
(fp32) and reduce-scatters it; the sharded gradients are views into the collective's output. On gloo a
reduce-scatter is an all-reduce of a copy of the whole input followed by a copy of this rank's chunk, so every unit
costs two unsharded fp32 buffers at once; for SmolLM2's root unit (its tied 49,152 x 576 embedding) that is two
108 MiB allocations at the very end of the backward. On a CPU those come from the C allocator, whose heap the
backward has just cut into pieces (freed activations between the gradients it keeps), so each step's buffers took
fresh memory: a learner rank's resident memory grew by about 108 MiB every step or two while its live bytes did not.

:class:`InPlaceReduceScatter` (FSDP2's custom reduce-scatter hook, ``set_custom_reduce_scatter``) does the same
arithmetic without the copy, all-reducing FSDP2's input buffer in place and copying this rank's chunk out, and lends
that input buffer from one block kept for the model's lifetime (sized by its largest unit), so the end of the
backward asks the allocator only for the sharded output. The result is the same bits as gloo's reduce-scatter: the
same all-reduce over the same values. NCCL keeps FSDP2's own collective (a real reduce-scatter, on its own stream).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter

__all__ = ["InPlaceReduceScatter", "use_in_place_reduce_scatter"]


class InPlaceReduceScatter(ReduceScatter):
    """A gloo reduce-scatter for FSDP2's gradients: in-place all-reduce of the input, this rank's chunk copied out.

    FSDP2 asks :meth:`allocate` for the input (the unit's unsharded gradients, flat), then for the output (the input's
    size / world size), then calls the collective, one unit at a time and synchronously on CPU. The input is a view of
    one kept block (nothing reads it after the collective: FSDP2 only holds it until the next unit's reduce); the
    output is fresh memory, since the sharded gradients stay views into it until the optimizer step."""

    def __init__(self, world_size: int) -> None:
        if world_size < 2:
            raise ValueError(f"world_size must be >= 2 (FSDP2 copies without a collective on 1), got {world_size}")
        self.world_size = world_size
        self._block: torch.Tensor | None = None
        self._output_numel: int | None = None  # set once the input is lent: the next request is the output

    def allocate(self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        numel = math.prod(int(s) for s in size)
        if self._output_numel is not None:
            if numel != self._output_numel:
                raise RuntimeError(
                    f"FSDP2 asked for a reduce-scatter output of {numel} elements after an input of"
                    f" {self._output_numel * self.world_size} (expected {self._output_numel})"
                )
            self._output_numel = None
            return torch.empty(numel, dtype=dtype, device=device)
        if numel % self.world_size:
            raise RuntimeError(
                f"a reduce-scatter input of {numel} elements does not split over {self.world_size} ranks"
            )
        block = self._block
        if block is None or block.numel() < numel or block.dtype != dtype or block.device != device:
            block = self._block = torch.empty(numel, dtype=dtype, device=device)
        self._output_numel = numel // self.world_size
        return block[:numel]

    def __call__(  # type: ignore[override]
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        op: dist.ReduceOp | dist.ReduceOp.RedOpType,
        async_op: bool = False,
    ) -> dist.Work | None:
        if async_op:
            raise ValueError("InPlaceReduceScatter runs synchronously (gloo on CPU)")
        if group.size() != self.world_size:
            raise ValueError(f"the group has {group.size()} ranks, this reduce-scatter was made for {self.world_size}")
        block = self._block
        if block is not None and output_tensor.untyped_storage().data_ptr() == block.untyped_storage().data_ptr():
            # the sharded gradients would be views into the lent block, which the next unit overwrites
            raise RuntimeError("reduce-scatter output lent from the input block (allocate calls out of order)")
        dist.all_reduce(input_tensor, op=op, group=group)
        output_tensor.copy_(input_tensor.chunk(self.world_size)[group.rank()])
        return None


def use_in_place_reduce_scatter(model: nn.Module, world_size: int) -> int:
    """Give every FSDP2 unit of ``model`` (already sharded, gloo) one :class:`InPlaceReduceScatter`; returns how many
    units took it (0 for a model without FSDP2 units)."""
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not units:
        return 0
    comm = InPlaceReduceScatter(world_size)
    for unit in units:
        unit.set_custom_reduce_scatter(comm)
    return len(units)
