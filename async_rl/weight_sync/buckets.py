"""Pack a stream of named tensors into size-capped byte buckets, and reassemble them on the other side.

Broadcasting one tensor at a time costs a collective (and, for small tensors, mostly latency) per parameter; packing
everything at once costs a second copy of the model. Buckets bound both: the sender consumes its (name, tensor)
iterator lazily and never holds more than one bucket, so a learner that gathers FSDP shards one parameter at a time
peaks at roughly one bucket of extra memory.

Two kinds of bucket share the cap:

* packed: small tensors copied back to back (each at a 64-byte aligned offset, so the receiver can view any dtype
  in place) into one flat uint8 buffer;
* direct: one byte range of one large tensor, broadcast straight from (and into) the tensor's own memory. No copy
  on either side, which matters on CPU, where a memcpy is slower than the gloo link. A tensor larger than the cap is
  split into several direct chunks at aligned boundaries, so no bucket ever exceeds the cap.

:func:`iter_buckets` is pure (no communication) and :class:`TensorAssembler` undoes it, which is what the unit tests
exercise; the sender and receiver add the broadcasts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from async_rl.weight_sync.digest import raw_bytes
from async_rl.weight_sync.errors import WeightSyncError
from async_rl.weight_sync.protocol import ChunkMeta, dtype_from_name, dtype_name

__all__ = ["ALIGN", "Bucket", "TensorAssembler", "iter_buckets"]

ALIGN = 64


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass(frozen=True)
class Bucket:
    """One broadcast's worth of weights: its chunk table and its bytes (a view of the source when ``direct``)."""

    chunks: list[ChunkMeta]
    data: torch.Tensor
    direct: bool


def iter_buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    cap_bytes: int,
    *,
    device: torch.device | str = "cpu",
    direct_min_bytes: int | None = None,
) -> Iterator[Bucket]:
    """Yield buckets of at most ``cap_bytes`` bytes covering every tensor of ``named_tensors``, in input order.

    Tensors of at least ``direct_min_bytes`` (default ``cap_bytes // 2``) go as direct buckets, the rest are packed.
    Each yielded bucket must be consumed (broadcast) before the next is requested: the generator allocates a new
    packing buffer only when it needs one, so references the caller keeps are never overwritten.
    """
    if cap_bytes < ALIGN:
        raise ValueError(f"cap_bytes must be >= {ALIGN}, got {cap_bytes}")
    direct_min = cap_bytes // 2 if direct_min_bytes is None else direct_min_bytes
    if not 0 < direct_min <= cap_bytes:
        raise ValueError(f"direct_min_bytes must be in (0, cap_bytes={cap_bytes}], got {direct_min_bytes}")
    device = torch.device(device)
    split = cap_bytes // ALIGN * ALIGN  # direct chunk size: aligned, so chunk starts never split an element
    seen: set[str] = set()
    buf: torch.Tensor | None = None
    chunks: list[ChunkMeta] = []
    pos = 0
    for name, tensor in named_tensors:
        if not isinstance(name, str) or not name:
            raise ValueError(f"tensor names must be non-empty strings, got {name!r}")
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"value for {name!r} must be a torch.Tensor, got {type(tensor).__name__}")
        if name in seen:
            raise ValueError(f"tensor name {name!r} appears twice")
        if callable(getattr(tensor, "full_tensor", None)):
            raise ValueError(f"{name!r} is a sharded DTensor: pass full tensors (gather with .full_tensor() first)")
        seen.add(name)
        wire_dtype = dtype_name(tensor.dtype)
        shape = tuple(tensor.shape)
        raw = raw_bytes(tensor)
        total = raw.numel()
        if total >= direct_min:
            if chunks:
                assert buf is not None
                yield Bucket(chunks, buf[:pos], direct=False)
                buf, chunks, pos = None, [], 0
            for start in range(0, total, split):
                piece = raw[start : start + split]
                meta = ChunkMeta(name, wire_dtype, shape, 0, piece.numel(), start, total)
                yield Bucket([meta], piece.to(device), direct=True)
            continue
        at = _align(pos)
        if chunks and at + total > cap_bytes:
            assert buf is not None
            yield Bucket(chunks, buf[:pos], direct=False)
            buf, chunks, pos, at = None, [], 0, 0
        if buf is None:
            buf = torch.empty(cap_bytes, dtype=torch.uint8, device=device)
        buf[at : at + total].copy_(raw)
        chunks.append(ChunkMeta(name, wire_dtype, shape, at, total, 0, total))
        pos = at + total
    if chunks:
        assert buf is not None
        yield Bucket(chunks, buf[:pos], direct=False)


@dataclass
class _Partial:
    meta: ChunkMeta
    data: torch.Tensor
    received: int = 0


class TensorAssembler:
    """Receiver half of :func:`iter_buckets`: hands out receive buffers and turns received buckets into tensors.

    Call :meth:`buffer_for` with a bucket's header chunks to get the tensor to receive into (for a direct bucket, a
    slice of the destination tensor itself), then :meth:`commit` once the bytes are there. Every malformed or
    out-of-order chunk raises WeightSyncError naming its tensor.
    """

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self._partial: dict[str, _Partial] = {}
        self._done: set[str] = set()

    def buffer_for(self, chunks: list[ChunkMeta], direct: bool, data_len: int) -> torch.Tensor:
        """Where to receive a bucket of ``data_len`` bytes described by ``chunks``."""
        if not direct:
            return torch.empty(data_len, dtype=torch.uint8, device=self.device)
        if len(chunks) != 1 or chunks[0].offset != 0 or chunks[0].nbytes != data_len:
            name = chunks[0].name if chunks else None
            raise WeightSyncError(f"malformed direct bucket header for {name!r}", tensor=name)
        meta = chunks[0]
        part = self._partial_for(meta)
        return part.data[meta.start : meta.start + meta.nbytes]

    def commit(self, chunks: list[ChunkMeta], direct: bool, data: torch.Tensor) -> list[tuple[ChunkMeta, torch.Tensor]]:
        """Account for a received bucket; return ``(meta, chunk bytes)`` per chunk, in order (for digesting).

        Completed tensors are collected by :meth:`pop_complete`.
        """
        out: list[tuple[ChunkMeta, torch.Tensor]] = []
        for meta in chunks:
            if meta.offset < 0 or meta.nbytes < 0 or meta.offset + meta.nbytes > data.numel():
                raise WeightSyncError(f"chunk of {meta.name!r} lies outside its bucket", tensor=meta.name)
            piece = data[meta.offset : meta.offset + meta.nbytes]
            part = self._partial_for(meta)
            if meta.start != part.received:
                raise WeightSyncError(
                    f"chunk of {meta.name!r} starts at byte {meta.start}, expected {part.received}", tensor=meta.name
                )
            if not direct:
                part.data[meta.start : meta.start + meta.nbytes].copy_(piece)
            part.received += meta.nbytes
            out.append((meta, piece))
        return out

    def pop_complete(self) -> list[tuple[str, torch.Tensor]]:
        """Tensors whose bytes have all arrived since the last call, viewed with their dtype and shape."""
        ready = [name for name, p in self._partial.items() if p.received == p.meta.total]
        out = []
        for name in ready:
            part = self._partial.pop(name)
            self._done.add(name)
            dtype = dtype_from_name(part.meta.dtype)
            out.append((name, part.data.view(dtype).reshape(part.meta.shape)))
        return out

    def finish(self) -> None:
        """Raise if a tensor is still incomplete at the end of an update."""
        for name, part in self._partial.items():
            raise WeightSyncError(
                f"tensor {name!r} incomplete: {part.received} of {part.meta.total} bytes", tensor=name
            )

    def _partial_for(self, meta: ChunkMeta) -> _Partial:
        part = self._partial.get(meta.name)
        if part is not None:
            if (part.meta.dtype, part.meta.shape, part.meta.total) != (meta.dtype, meta.shape, meta.total):
                raise WeightSyncError(f"chunks of {meta.name!r} disagree on dtype/shape", tensor=meta.name)
            return part
        if meta.name in self._done:
            raise WeightSyncError(f"tensor {meta.name!r} received twice", tensor=meta.name)
        dtype = dtype_from_name(meta.dtype)
        itemsize = torch.empty((), dtype=dtype).element_size()
        if any(d < 0 for d in meta.shape) or math.prod(meta.shape) * itemsize != meta.total:
            raise WeightSyncError(
                f"header of {meta.name!r}: shape {list(meta.shape)} x {meta.dtype} != {meta.total} bytes",
                tensor=meta.name,
            )
        if meta.start + meta.nbytes > meta.total:
            raise WeightSyncError(f"chunk of {meta.name!r} runs past the tensor end", tensor=meta.name)
        part = _Partial(meta, torch.empty(meta.total, dtype=torch.uint8, device=self.device))
        self._partial[meta.name] = part
        return part
