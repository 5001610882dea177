"""Full (unsharded) weights out of the FSDP2 learner: a streaming iterator for weight sync, and HF safetensors export.

:func:`iter_full_state` walks the model's state dict in order and all-gathers FSDP2's row shards a batch of parameters
at a time (:data:`GATHER_BATCH_BYTES`, one collective per batch), so the extra memory at any moment is about one batch
and one full parameter (the consumer decides how many to hold: weight sync packs them into buckets). Every rank must
drive the iterator, because each gather is a collective; by default only rank 0 receives the items. Names are the
Hugging Face names (FSDP2 keeps FQNs; any wrapper prefixes are stripped) and a tied output embedding is yielded once,
under its input-embedding name, which is what ``transformers`` and vLLM expect when ``tie_word_embeddings`` is set.

:func:`export_hf` writes a ``save_pretrained``-compatible directory (``config.json``, safetensors shards and an index
when there is more than one) shard by shard, into a temporary directory renamed into place at the end, so a reader
never sees a half-written export.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from async_rl.learner.dist import DistContext
from async_rl.learner.lora import lora_modules, merged_weight
from async_rl.peft_format import is_adapter_name, peft_name, save_adapter
from async_rl.weight_sync.protocol import TensorSpec, dtype_name

__all__ = ["clean_name", "export_adapter", "export_hf", "full_state_manifest", "iter_full_state"]

logger = logging.getLogger(__name__)

_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


def clean_name(name: str) -> str:
    """Strip activation-checkpoint / compile / FSDP1 wrapper segments from a parameter name."""
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


Rename = Callable[[str], str | None]
"""Maps a clean state-dict name to the name to yield, or to None to leave the tensor out."""


def _unique_entries(model: nn.Module, rename: Rename | None = None) -> list[tuple[str, torch.Tensor]]:
    """State-dict entries in order, each underlying tensor once (tied weights keep their first name); ``rename``
    selects and renames them."""
    seen: set[int] = set()
    entries: list[tuple[str, torch.Tensor]] = []
    for name, value in model.state_dict(keep_vars=True).items():
        if id(value) in seen:
            continue
        seen.add(id(value))
        out = clean_name(name) if rename is None else rename(clean_name(name))
        if out is not None:
            entries.append((out, value))
    return entries


def _full(value: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """The unsharded tensor; a floating one cast to ``dtype`` (None: as stored). A sharded tensor is cast before the
    gather: the cast is elementwise, so the result is the same, and the collective moves only the narrower bytes (an
    fp32 master sent as bf16: half; 0.67 s against 0.99 s for SmolLM2's 272 tensors over 2 gloo ranks)."""
    value = value.detach().to(_wire_dtype(value, dtype))
    return value.full_tensor() if isinstance(value, DTensor) else value


GATHER_BATCH_BYTES = 32 << 20
"""How many bytes of full tensors :func:`iter_full_state` gathers in one collective. One all-gather per parameter
cost SmolLM2-135M's weight sync 272 collectives; in the GRPO recipe, with the actor's vLLM worker on one of the two
cores, its gather took 1.2-1.4 s of every 1.5 s update (Intel Xeon with AMX). Batching bounds the extra memory
(about twice this on the receiving ranks, while a batch is handed out) and the number of collectives."""


def _row_sharded(value: torch.Tensor) -> bool:
    """An FSDP2 parameter: a DTensor sharded on dim 0 over a 1-D mesh (the layout the batched gather undoes)."""
    return (
        isinstance(value, DTensor)
        and value.device_mesh.ndim == 1
        and len(value.placements) == 1
        and isinstance(value.placements[0], Shard)
        and value.placements[0].dim == 0
        and value.ndim >= 1
    )


def _gather_rows(
    batch: list[tuple[str, DTensor]], dtype: torch.dtype | None, *, keep: bool
) -> Iterator[tuple[str, torch.Tensor]]:
    """All-gather the row-sharded ``batch`` in one collective (each rank's shards packed back to back, padded to the
    largest rank's rows as ``torch.chunk`` lays them out); yield each full tensor when ``keep``."""
    group = batch[0][1].device_mesh.get_group()
    world = dist.get_world_size(group)
    device = batch[0][1].to_local().device
    wire = {_wire_dtype(v, dtype) for _, v in batch}
    if len(wire) != 1:
        raise ValueError(f"one gather batch must have one dtype, got {sorted(map(str, wire))}")
    layout = []  # (name, full shape, rows per chunk, elements per row, offset in a rank's segment)
    size = 0
    for name, value in batch:
        rows = -(-value.shape[0] // world)
        row_elems = math.prod(value.shape[1:])
        layout.append((name, tuple(value.shape), rows, row_elems, size))
        size += rows * row_elems
    local = torch.empty(size, dtype=wire.pop(), device=device)
    for (*_, offset), (_, value) in zip(layout, batch, strict=True):
        shard = value.to_local().detach()
        local[offset : offset + shard.numel()].view(shard.shape).copy_(shard)  # casts to the wire dtype in the copy
    gathered = torch.empty(world * size, dtype=local.dtype, device=device)
    dist.all_gather_into_tensor(gathered, local, group=group)
    del local
    if not keep:
        return
    segments = gathered.view(world, size)
    for name, shape, rows, row_elems, offset in layout:
        parts = [
            segments[r, offset : offset + n * row_elems]
            for r in range(world)
            if (n := max(0, min(rows, shape[0] - r * rows))) > 0
        ]
        yield name, torch.cat(parts).view(shape)


def iter_full_state(
    model: nn.Module,
    ctx: DistContext,
    *,
    dtype: torch.dtype | None,
    to_cpu: bool = False,
    all_ranks: bool = False,
    rename: Rename | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, full tensor)`` for every parameter/buffer, in state-dict order (see module docstring).

    FSDP2's row-sharded parameters are gathered in batches of up to :data:`GATHER_BATCH_BYTES` (one collective per
    batch, in the wire dtype); any other distributed tensor one at a time; plain tensors as they are. ``dtype``
    casts floating tensors (e.g. ``torch.bfloat16`` for a bf16 vLLM; None: as stored); ``to_cpu`` moves them to host
    memory; ``all_ranks`` yields on every rank instead of rank 0 only; ``rename`` selects and renames the tensors
    (LoRA: the adapter only, under PEFT's names). All ranks must exhaust the iterator, with the same ``dtype`` (each
    gather is a collective in that dtype).
    """
    keep = all_ranks or ctx.is_rank0
    for group in _gather_groups(_unique_entries(model, rename), dtype):
        if _row_sharded(group[0][1]):
            items: Iterable[tuple[str, torch.Tensor]] = _gather_rows(group, dtype, keep=keep)  # type: ignore[arg-type]
        else:
            ((name, value),) = group
            full = _full(value, dtype)
            items = [(name, full)] if keep else []
        for name, full in items:
            yield name, full.cpu() if to_cpu else full


def _wire_dtype(value: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    """What ``value`` is gathered and yielded as: ``dtype`` for a floating tensor when given, else its own dtype."""
    return dtype if dtype is not None and value.is_floating_point() else value.dtype


def _gather_groups(
    entries: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype | None
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """``entries`` in order, grouped for gathering: consecutive row-sharded tensors on one mesh and of one wire dtype
    in groups of up to :data:`GATHER_BATCH_BYTES` (a larger tensor alone), any other entry alone."""
    batch: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, value in entries:
        if not _row_sharded(value):
            if batch:
                yield batch
                batch, size = [], 0
            yield [(name, value)]
            continue
        nbytes = value.numel() * _wire_dtype(value, dtype).itemsize
        first = batch[0][1] if batch else None
        if first is not None and (
            size + nbytes > GATHER_BATCH_BYTES
            or value.device_mesh != first.device_mesh  # type: ignore[attr-defined]
            or _wire_dtype(value, dtype) != _wire_dtype(first, dtype)
        ):
            yield batch
            batch, size = [], 0
        batch.append((name, value))
        size += nbytes
    if batch:
        yield batch


def full_state_manifest(
    model: nn.Module, *, dtype: torch.dtype | None, rename: Rename | None = None
) -> list[TensorSpec]:
    """What :func:`iter_full_state` will yield (name, dtype, global shape, in order), from metadata alone: no gather.

    The weight sync plans its buckets from it before the first tensor is gathered."""
    specs = []
    for name, value in _unique_entries(model, rename):
        specs.append(TensorSpec(name, dtype_name(_wire_dtype(value, dtype)), tuple(value.shape)))
    return specs


def _plan_shards(entries: list[tuple[str, torch.Tensor]], dtype: torch.dtype | None, max_bytes: int) -> list[list[int]]:
    shards: list[list[int]] = [[]]
    size = 0
    for i, (_, value) in enumerate(entries):
        nbytes = value.numel() * _wire_dtype(value, dtype).itemsize
        if shards[-1] and size + nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(i)
        size += nbytes
    return shards


def export_hf(
    model: nn.Module,
    ctx: DistContext,
    out_dir: str | Path,
    *,
    dtype: torch.dtype | None,
    max_shard_bytes: int = 2 * 1024**3,
) -> Path:
    """Write ``model`` (FSDP2-sharded or plain HF) as a Hugging Face directory loadable by ``from_pretrained``.

    ``dtype`` casts floating tensors (None: as stored, the fp32 master weights under FSDP2). Call on every rank. Peak
    extra memory on rank 0 is about one shard (``max_shard_bytes``). Returns ``out_dir``.
    """
    if max_shard_bytes <= 0:
        raise ValueError(f"max_shard_bytes must be > 0, got {max_shard_bytes}")
    out = Path(out_dir)
    tmp = out.with_name(out.name + ".tmp")
    # LoRA: each adapted weight is written merged (W + scaling * B @ A) and the adapter tensors are left out, so the
    # directory is the plain base architecture
    merges = {f"{clean_name(name)}.weight": module for name, module in lora_modules(model)}
    entries = _unique_entries(model, lambda n: None if is_adapter_name(n) else n)
    shards = _plan_shards(entries, dtype, max_shard_bytes)
    if ctx.is_rank0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    n = len(shards)
    weight_map: dict[str, str] = {}
    total = 0
    for k, shard in enumerate(shards):
        fname = "model.safetensors" if n == 1 else f"model-{k + 1:05d}-of-{n:05d}.safetensors"
        tensors: dict[str, torch.Tensor] = {}
        for i in shard:
            name, value = entries[i]
            full = _full(value, None)
            lora = merges.get(name)
            if lora is not None:  # every rank gathers the adapter (collectives), rank 0 merges
                a, b = _full(lora.lora_A, None), _full(lora.lora_B, None)
                full = merged_weight(full, a, b, lora.scaling)
            if ctx.is_rank0:
                full = full.to(_wire_dtype(full, dtype))
                tensors[name] = full.cpu().contiguous()
                weight_map[name] = fname
                total += tensors[name].numel() * tensors[name].element_size()
        if ctx.is_rank0:
            save_file(tensors, str(tmp / fname), metadata={"format": "pt"})
        del tensors
    if ctx.is_rank0:
        if n > 1:
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True))
        config = getattr(model, "config", None)
        if config is not None:
            if dtype is not None:
                config = type(config).from_dict(config.to_dict())
                config.dtype = dtype
            config.save_pretrained(str(tmp))
        generation = getattr(model, "generation_config", None)
        if generation is not None:
            generation.save_pretrained(str(tmp))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
        logger.info("exported %d tensors (%.1f MB, %d shard(s)) to %s", len(weight_map), total / 1e6, n, out)
    ctx.barrier()
    return out


def export_adapter(model: nn.Module, ctx: DistContext, out_dir: str | Path, config: dict[str, Any]) -> Path:
    """Write the LoRA adapter of ``model`` as a PEFT directory (``adapter_config.json`` = ``config``, safetensors
    under PEFT's names), loadable by ``peft.PeftModel.from_pretrained`` and by vLLM. Call on every rank."""
    tensors = dict(iter_full_state(model, ctx, dtype=None, to_cpu=True, rename=peft_name))
    out = Path(out_dir)
    if ctx.is_rank0:
        if not tensors:
            raise ValueError("export_adapter: the model has no LoRA adapter")
        save_adapter(out, tensors, config)
        logger.info("exported the LoRA adapter (%d tensors) to %s", len(tensors), out)
    ctx.barrier()
    return out
