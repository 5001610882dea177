"""Pack a stream of named tensors into size-capped byte buckets, and reassemble them on the other side.

Broadcasting one tensor at a time costs a collective (and, for small tensors, mostly latency) per parameter; packing
everything at once costs a second copy of the model. Buckets bound both: the sender consumes its (name, tensor)
iterator lazily and holds at most two buckets (the one on the wire and the next, gathered meanwhile), so a learner that
gathers FSDP shards a few parameters at a time peaks at roughly two buckets of extra memory.

Two kinds of bucket share the cap:

* packed: small tensors copied back to back (each at a 64-byte aligned offset, so the receiver can view any dtype
  in place) into one flat uint8 buffer;
* direct: one byte range of one large tensor, broadcast straight from (and into) the tensor's own memory, with no
  copy on either side. A tensor larger than the cap is split into several direct chunks at aligned boundaries, so no
  bucket ever exceeds the cap.

:func:`plan_buckets` lays the buckets out from metadata alone (the plan travels once, before any data),
:func:`fill_buckets` takes the tensors lazily and produces each bucket's bytes, and :class:`TensorAssembler` undoes
it. All three are pure (no communication), which is what the unit tests exercise; the sender and receiver add the
broadcasts.
"""

from __future__ import annotations

import ctypes
import functools
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from async_rl.weight_sync.digest import raw_bytes
from async_rl.weight_sync.errors import WeightSyncError
from async_rl.weight_sync.protocol import BucketSpec, ChunkMeta, TensorSpec, dtype_from_name, dtype_name

__all__ = [
    "ALIGN",
    "Bucket",
    "BufferPool",
    "TensorAssembler",
    "fill_buckets",
    "keep_buffers",
    "malloc_is_tcmalloc",
    "plan_buckets",
    "tensor_spec",
]

ALIGN = 64


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@functools.cache
def malloc_is_tcmalloc() -> bool:
    """Whether this process allocates with tcmalloc (it exports ``MallocExtension_GetNumericProperty``), as the
    learner ranks and actors do by default (``async_training.cpu_allocator``)."""
    try:
        return hasattr(ctypes.CDLL(None), "MallocExtension_GetNumericProperty")
    except OSError:
        return False


def keep_buffers(device: torch.device | str) -> bool:
    """Whether a sender's :class:`BufferPool` on ``device`` keeps its packing buffers from one update to the next: on
    CPU, unless the process allocates with tcmalloc. glibc returns a freed buffer of this size to the kernel, and the
    next update page-faults its way into fresh memory; tcmalloc keeps freed memory mapped and hands it out again, so
    a kept pool only pins its buffers. On the SmolLM2 recipe the sender's two 64 MiB blocks sat under learner rank 0's
    peak: letting them go lowered that rank's peak resident memory from 2,479 to 2,296 MiB, and updates took as long
    (median 0.444 s against 0.431-0.457 s; docs/recipes.md). On a GPU the caching allocator reuses memory itself."""
    return torch.device(device).type == "cpu" and not malloc_is_tcmalloc()


class BufferPool:
    """Byte buffers kept from one weight update for the next (the same model has the same sizes every time).

    Host memory touched for the first time costs a page fault per 4 KiB page: measured here, copying 29 MiB into fresh
    memory took about 40 ms, into memory used before 8-11 ms, and the gloo link moves those bytes in about 18 ms. So
    where the allocator would return them to the kernel (``keep``, see :func:`keep_buffers`) every buffer an update
    takes is lent from this pool and given back after the update (:meth:`restore`), and the next update writes into
    memory already mapped. Without ``keep`` the pool only allocates. A failed update calls :meth:`drop` instead: a
    transfer cut short may still write into its buffers.

    ``block_bytes``: every buffer is allocated at least that large and lent as a view of the size asked for, so any
    free buffer serves any request up to it. A sender that hands each buffer back as soon as its bucket is off the
    wire (:meth:`give_back`) then keeps only as many buffers as it has buckets in flight (the SmolLM2 sender on rank 0
    held every packed bucket of an update, about 400 MiB, when its pool was keyed by exact size).
    """

    def __init__(self, device: torch.device | str, *, block_bytes: int, keep: bool) -> None:
        self.device = torch.device(device)
        self.enabled = keep
        self.block_bytes = block_bytes
        self._free: dict[int, list[torch.Tensor]] = {}
        self._lent: list[torch.Tensor] = []

    def take(self, nbytes: int) -> torch.Tensor:
        """A uint8 buffer of ``nbytes`` bytes, not in use by anyone until :meth:`give_back`, :meth:`restore` or
        :meth:`drop`."""
        size = max(nbytes, self.block_bytes)
        free = self._free.get(size) if self.enabled else None
        buf = free.pop() if free else torch.empty(size, dtype=torch.uint8, device=self.device)
        if self.enabled:
            self._lent.append(buf)
        return buf[:nbytes]

    def give_back(self, view: torch.Tensor) -> None:
        """One buffer lent by :meth:`take` is free again before the update ends (its transfer is complete)."""
        for i, buf in enumerate(self._lent):
            if buf.data_ptr() == view.data_ptr():
                self._free.setdefault(buf.numel(), []).append(self._lent.pop(i))
                return

    def restore(self) -> None:
        """Every lent buffer is free again (the update that took them is over and nothing holds their bytes)."""
        for buf in self._lent:
            self._free.setdefault(buf.numel(), []).append(buf)
        self._lent = []

    def drop(self) -> None:
        """Forget the lent buffers (after a failed update); the pool keeps only what was free."""
        self._lent = []

    @property
    def held_bytes(self) -> int:
        """Bytes the pool keeps between updates."""
        return sum(b.numel() for bufs in self._free.values() for b in bufs)


@dataclass(frozen=True)
class Bucket:
    """One broadcast's worth of weights: its chunk table and its bytes (a view of the source when ``direct``)."""

    chunks: list[ChunkMeta]
    data: torch.Tensor
    direct: bool


def tensor_spec(name: str, tensor: torch.Tensor) -> TensorSpec:
    """The plan's view of one tensor (validating what may travel: a name, a full tensor, a wire dtype)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"tensor names must be non-empty strings, got {name!r}")
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"value for {name!r} must be a torch.Tensor, got {type(tensor).__name__}")
    if callable(getattr(tensor, "full_tensor", None)):
        raise ValueError(f"{name!r} is a sharded DTensor: pass full tensors (gather with .full_tensor() first)")
    return TensorSpec(name, dtype_name(tensor.dtype), tuple(tensor.shape))


def plan_buckets(
    specs: Iterable[TensorSpec], cap_bytes: int, *, direct_min_bytes: int | None = None
) -> list[BucketSpec]:
    """Buckets of at most ``cap_bytes`` bytes covering every tensor of ``specs``, in input order (pure: metadata only).

    Tensors of at least ``direct_min_bytes`` (default ``cap_bytes // 2``) go as direct buckets, split at aligned
    boundaries when larger than the cap; the rest are packed back to back at 64-byte aligned offsets.
    """
    if cap_bytes < ALIGN:
        raise ValueError(f"cap_bytes must be >= {ALIGN}, got {cap_bytes}")
    direct_min = cap_bytes // 2 if direct_min_bytes is None else direct_min_bytes
    if not 0 < direct_min <= cap_bytes:
        raise ValueError(f"direct_min_bytes must be in (0, cap_bytes={cap_bytes}], got {direct_min_bytes}")
    split = cap_bytes // ALIGN * ALIGN  # direct chunk size: aligned, so chunk starts never split an element
    seen: set[str] = set()
    plan: list[BucketSpec] = []
    chunks: list[ChunkMeta] = []
    pos = 0
    for spec in specs:
        if spec.name in seen:
            raise ValueError(f"tensor name {spec.name!r} appears twice")
        seen.add(spec.name)
        total = spec.nbytes
        if total >= direct_min:
            if chunks:
                plan.append(BucketSpec(False, pos, chunks))
                chunks, pos = [], 0
            for start in range(0, total, split):
                n = min(split, total - start)
                plan.append(BucketSpec(True, n, [ChunkMeta(spec.name, spec.dtype, spec.shape, 0, n, start, total)]))
            continue
        at = _align(pos)
        if chunks and at + total > cap_bytes:
            plan.append(BucketSpec(False, pos, chunks))
            chunks, pos, at = [], 0, 0
        chunks.append(ChunkMeta(spec.name, spec.dtype, spec.shape, at, total, 0, total))
        pos = at + total
    if chunks:
        plan.append(BucketSpec(False, pos, chunks))
    return plan


def fill_buckets(
    plan: list[BucketSpec],
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    *,
    device: torch.device | str,
    pool: BufferPool | None = None,
) -> Iterator[Bucket]:
    """The bytes of each bucket of ``plan``, taking tensors from ``named_tensors`` lazily and in plan order.

    Each tensor must match its plan entry (name, dtype, shape), otherwise ValueError names it. A direct bucket is a
    view of the tensor's own bytes; a packed bucket gets a buffer of its own from ``pool`` (lent until the caller
    restores the pool), so a bucket the caller still holds (in flight) is never overwritten. Tensors left over after
    the plan, or missing from it, raise ValueError too.
    """
    device = torch.device(device)
    pool = pool if pool is not None else BufferPool(device, block_bytes=0, keep=False)
    it = iter(named_tensors)
    current: tuple[str, torch.Tensor] | None = None  # the tensor whose chunks are being taken (direct splits)

    def take(meta: ChunkMeta) -> torch.Tensor:
        nonlocal current
        if current is None or current[0] != meta.name:
            try:
                name, tensor = next(it)
            except StopIteration:
                raise ValueError(f"the tensors ended before {meta.name!r}, which the plan expects") from None
            got = tensor_spec(name, tensor)
            want = TensorSpec(meta.name, meta.dtype, meta.shape)
            if got != want:
                raise ValueError(f"tensor {name!r} ({got.dtype}{list(got.shape)}) does not match the plan's {want}")
            current = (name, raw_bytes(tensor))
        return current[1][meta.start : meta.start + meta.nbytes]

    for bucket in plan:
        if bucket.direct:
            (meta,) = bucket.chunks
            yield Bucket(bucket.chunks, take(meta).to(device), direct=True)
            continue
        buf = pool.take(bucket.nbytes)
        for meta in bucket.chunks:
            buf[meta.offset : meta.offset + meta.nbytes].copy_(take(meta))
        yield Bucket(bucket.chunks, buf, direct=False)
    extra = next(it, None)
    if extra is not None:
        raise ValueError(f"tensor {extra[0]!r} is not in the plan")


@dataclass
class _Partial:
    meta: ChunkMeta
    data: torch.Tensor
    received: int = 0


class TensorAssembler:
    """Receiver half of :func:`fill_buckets`: hands out receive buffers and turns received buckets into tensors.

    Call :meth:`buffer_for` with a bucket's header chunks to get the tensor to receive into (for a direct bucket, a
    slice of the destination tensor itself), then :meth:`commit` once the bytes are there. Every malformed or
    out-of-order chunk raises WeightSyncError naming its tensor.
    """

    def __init__(self, device: torch.device | str, pool: BufferPool | None = None) -> None:
        self.device = torch.device(device)
        self.pool = pool if pool is not None else BufferPool(self.device, block_bytes=0, keep=False)
        self._partial: dict[str, _Partial] = {}
        self._done: set[str] = set()

    def buffer_for(self, bucket: BucketSpec) -> torch.Tensor:
        """Where to receive ``bucket``'s bytes."""
        chunks = bucket.chunks
        if not bucket.direct:
            return self.pool.take(bucket.nbytes)
        if len(chunks) != 1 or chunks[0].offset != 0 or chunks[0].nbytes != bucket.nbytes:
            name = chunks[0].name if chunks else None
            raise WeightSyncError(f"malformed direct bucket header for {name!r}", tensor=name)
        meta = chunks[0]
        part = self._partial_for(meta)
        return part.data[meta.start : meta.start + meta.nbytes]

    def commit(self, bucket: BucketSpec, data: torch.Tensor) -> list[tuple[ChunkMeta, torch.Tensor]]:
        """Account for a received bucket; return ``(meta, chunk bytes)`` per chunk, in order (for digesting).

        Completed tensors are collected by :meth:`pop_complete`.
        """
        out: list[tuple[ChunkMeta, torch.Tensor]] = []
        for meta in bucket.chunks:
            if meta.offset < 0 or meta.nbytes < 0 or meta.offset + meta.nbytes > data.numel():
                raise WeightSyncError(f"chunk of {meta.name!r} lies outside its bucket", tensor=meta.name)
            piece = data[meta.offset : meta.offset + meta.nbytes]
            # A packed chunk holding a whole tensor is used in place: every bucket has a buffer of its own.
            whole = (
                not bucket.direct
                and meta.start == 0
                and meta.nbytes == meta.total
                and meta.offset % ALIGN == 0
                and meta.name not in self._partial
            )
            part = self._partial_for(meta, data=piece if whole else None)
            if meta.start != part.received:
                raise WeightSyncError(
                    f"chunk of {meta.name!r} starts at byte {meta.start}, expected {part.received}", tensor=meta.name
                )
            if not bucket.direct and not whole:
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

    def _partial_for(self, meta: ChunkMeta, data: torch.Tensor | None = None) -> _Partial:
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
        if data is None:
            data = self.pool.take(meta.total)
        part = _Partial(meta, data)
        self._partial[meta.name] = part
        return part
