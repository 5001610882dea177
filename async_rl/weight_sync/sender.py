"""Learner side of a weight update: stream (name, tensor) pairs to every actor through the weight-sync group.

The learner's rank 0 calls :meth:`WeightSender.send` with full (unsharded) tensors in checkpoint (Hugging Face)
naming and, for a lazy iterator, their ``manifest`` (name, dtype, shape of each, in order). The sender plans every
bucket from the manifest and broadcasts the plan once (see ``protocol``); then it only broadcasts bucket bytes. The
iterator is consumed lazily, one bucket ahead: bucket *i+1* is gathered (the learner's FSDP2 gather) and packed while
bucket *i* is on the wire, and each bucket is digested while it is on the wire, so at most two buckets are held.
Non-zero learner ranks do not call the sender, but must drive the same gather loop in lockstep (the gather is a
collective of the FSDP world).

After the last bucket the sender broadcasts the per-tensor digests of exactly the bytes it sent, so every receiver can
prove what it got. A failure before the plan is sent becomes an ABORT frame; a failure in the middle of the data (a
gather raised, a tensor does not match the manifest) abandons the epoch through the store, which stops every receiver
within 0.1 s. Either way the exception propagates. Every broadcast is bounded by the group timeout.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import torch

from async_rl.weight_sync.buckets import Bucket, BufferPool, fill_buckets, keep_buffers, plan_buckets, tensor_spec
from async_rl.weight_sync.digest import ByteDigest, TensorDigest, algo_for_device, fingerprint
from async_rl.weight_sync.errors import WeightSyncError
from async_rl.weight_sync.group import Transfer, WeightSyncGroup
from async_rl.weight_sync.protocol import (
    FRAME_ABORT,
    FRAME_END,
    FRAME_PLAN,
    ChunkMeta,
    EndMessage,
    TensorSpec,
    UpdatePlan,
    encode_frame,
    encode_struct,
)

logger = logging.getLogger(__name__)

__all__ = ["SendReport", "WeightSender"]

_MB = 1 << 20


@dataclass(frozen=True)
class SendReport:
    """What one :meth:`WeightSender.send` moved and how fast (``gbps`` is GB/s of weight bytes, 1 GB = 2**30 B)."""

    version: int
    tensors: int
    buckets: int
    nbytes: int
    seconds: float
    gbps: float
    fingerprint: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


class WeightSender:
    """Broadcasts weight updates from group rank 0.

    ``bucket_size_mb`` caps every broadcast. Tensors of at least ``direct_min_mb`` are sent straight from their own
    memory instead of being copied into a packing buffer (default: half a bucket). Packing the rest is the cheaper
    side on CPU too: each broadcast costs a round of latency, and the packing buffers are pooled across updates. With
    direct sends from 1 MiB (the earlier CPU default) SmolLM2-135M went out in ~270 broadcasts: an update took
    1.86-1.99 s against 1.73 s packed, and a 29 MiB model 0.177 s against 0.144 s (tools/bench_weight_sync.py).
    """

    def __init__(self, group: WeightSyncGroup, *, bucket_size_mb: float, direct_min_mb: float | None = None):
        if group.rank != 0:
            raise ValueError(f"only group rank 0 sends weights; this member is rank {group.rank}")
        if bucket_size_mb <= 0:
            raise ValueError(f"bucket_size_mb must be > 0, got {bucket_size_mb}")
        self.group = group
        self.cap_bytes = max(int(bucket_size_mb * _MB), 64)
        if direct_min_mb is None:
            direct = max(self.cap_bytes // 2, 1)
        else:
            if direct_min_mb <= 0:
                raise ValueError(f"direct_min_mb must be > 0, got {direct_min_mb}")
            direct = min(max(int(direct_min_mb * _MB), 1), self.cap_bytes)
        self.direct_min_bytes = direct
        # packing buffers, each handed back once its bucket is off the wire and reused (see BufferPool)
        self.pool = BufferPool(group.device, block_bytes=self.cap_bytes, keep=keep_buffers(group.device))

    def send(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        *,
        version: int,
        manifest: Sequence[TensorSpec] | None = None,
    ) -> SendReport:
        """Send one complete update (every tensor the receivers should load) tagged with ``version``.

        Without a ``manifest`` the tensors are taken all at once to read their metadata (fine for a list; a lazy
        FSDP gather should pass its manifest so that only two buckets are ever held).
        """
        if version < 0:
            raise ValueError(f"version must be >= 0, got {version}")
        device = self.group.device
        algo = algo_for_device(device)
        t0 = time.perf_counter()
        try:
            if manifest is None:
                named_tensors = list(named_tensors)
                manifest = [tensor_spec(name, tensor) for name, tensor in named_tensors]
            buckets = plan_buckets(manifest, self.cap_bytes, direct_min_bytes=self.direct_min_bytes)
        except BaseException as exc:  # nothing is on the wire yet: the receivers wait for a frame, tell them
            self._abort(f"{type(exc).__name__}: {exc}", 0)
            raise
        plan = UpdatePlan(version, algo, buckets)
        total = sum(b.nbytes for b in buckets)
        self._broadcast_frame(FRAME_PLAN, encode_struct(plan), total, 0)
        digests = self._send_buckets(plan, named_tensors)
        digests.sort(key=lambda d: d.name)
        end = EndMessage(version, len(buckets), total, algo, digests, fingerprint(digests))
        self._broadcast_frame(FRAME_END, encode_struct(end), 0, len(buckets))
        seconds = time.perf_counter() - t0
        report = SendReport(
            version, len(digests), len(buckets), total, seconds, total / (1 << 30) / max(seconds, 1e-9), end.fingerprint
        )
        logger.info(
            "weights v%d sent: %d tensors, %d buckets, %.1f MiB in %.3f s (%.2f GB/s), fingerprint %s",
            version,
            report.tensors,
            report.buckets,
            total / _MB,
            seconds,
            report.gbps,
            report.fingerprint,
        )
        return report

    def _send_buckets(self, plan: UpdatePlan, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> list[TensorDigest]:
        """Broadcast every bucket's bytes, keeping two in flight; return the digests of what was sent."""
        group = self.group
        states: dict[str, ByteDigest] = {}
        digests: list[TensorDigest] = []
        in_flight: deque[tuple[Transfer, Bucket]] = deque()

        def complete_oldest() -> None:
            transfer, bucket = in_flight.popleft()
            group.complete(transfer)
            if not bucket.direct:
                self.pool.give_back(bucket.data)  # the next bucket but one packs into it

        try:
            # Taking the next bucket (gather, pack) runs while the previous one is still on the wire.
            buckets = fill_buckets(plan.buckets, named_tensors, device=group.device, pool=self.pool)
            for seq, bucket in enumerate(buckets):
                in_flight.append((group.post(bucket.data, what=f"bucket {seq}"), bucket))
                for meta in bucket.chunks:  # digest while the bytes are on the wire
                    state = states.setdefault(meta.name, ByteDigest(plan.algo, meta.total))
                    self._digest_chunk(meta, bucket.data[meta.offset : meta.offset + meta.nbytes], state)
                    if state.consumed == meta.total:
                        digests.append(states.pop(meta.name).finish(meta.name, meta.dtype, meta.shape))
                if len(in_flight) > 1:
                    complete_oldest()
            while in_flight:
                complete_oldest()
        except BaseException as exc:  # mid-stream: no frame can be sent; the receivers watch the store
            self.pool.drop()
            group.abandon(f"{type(exc).__name__}: {exc}")
            raise
        self.pool.restore()
        assert not states, f"tensors left incomplete by the plan: {sorted(states)}"
        return digests

    def _digest_chunk(self, meta: ChunkMeta, data: torch.Tensor, state: ByteDigest) -> None:
        """Fold the bytes being sent for ``meta`` into its digest (a seam for fault-injection tests)."""
        state.update(data)

    def _broadcast_frame(self, kind: int, header: torch.Tensor, data_len: int, seq: int) -> None:
        device = self.group.device
        self.group.broadcast(encode_frame(kind, header.numel(), data_len, seq).to(device), what=f"frame {seq}")
        self.group.broadcast(header.to(device), what=f"header {seq}")

    def _abort(self, reason: str, seq: int) -> None:
        if self.group.broken:
            return
        try:
            self._broadcast_frame(
                FRAME_ABORT, torch.frombuffer(bytearray(reason.encode()[:4096]), dtype=torch.uint8), 0, seq
            )
        except WeightSyncError as exc:  # best effort: the receivers will time out instead
            logger.warning("could not notify receivers of the aborted update: %s", exc)
