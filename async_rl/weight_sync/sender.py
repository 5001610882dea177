"""Learner side of a weight update: stream (name, tensor) pairs to every actor through the weight-sync group.

The learner's rank 0 calls :meth:`WeightSender.send` with an iterator of full (unsharded) tensors in checkpoint
(Hugging Face) naming. The iterator is consumed lazily, bucket by bucket, so an FSDP learner can gather one parameter
(``DTensor.full_tensor()``) at a time and peak at about one bucket of extra memory. Non-zero learner ranks do not call
the sender, but must still drive the same gather loop in lockstep (the gather is a collective of the FSDP world).

Per bucket the sender broadcasts a frame, a msgpack header and the bucket bytes (see ``protocol``); after the last
bucket it broadcasts the per-tensor digests of exactly the bytes it sent, so every receiver can prove what it got.
If producing the tensors fails mid-way, an ABORT frame tells the receivers to stop waiting (best effort) before the
exception propagates. Every broadcast is bounded by the group timeout.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import torch

from async_rl.weight_sync.buckets import Bucket, iter_buckets
from async_rl.weight_sync.digest import ByteDigest, TensorDigest, algo_for_device, fingerprint
from async_rl.weight_sync.errors import WeightSyncError
from async_rl.weight_sync.group import WeightSyncGroup
from async_rl.weight_sync.protocol import (
    FRAME_ABORT,
    FRAME_BUCKET,
    FRAME_END,
    BucketHeader,
    ChunkMeta,
    EndMessage,
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
    memory instead of being copied into a packing buffer; the default (1 MiB on CPU, half a bucket on GPU) reflects
    that a host memcpy costs about as much as the gloo link while a device copy is nearly free next to NCCL.
    """

    def __init__(self, group: WeightSyncGroup, *, bucket_size_mb: float = 256.0, direct_min_mb: float | None = None):
        if group.rank != 0:
            raise ValueError(f"only group rank 0 sends weights; this member is rank {group.rank}")
        if bucket_size_mb <= 0:
            raise ValueError(f"bucket_size_mb must be > 0, got {bucket_size_mb}")
        self.group = group
        self.cap_bytes = max(int(bucket_size_mb * _MB), 64)
        if direct_min_mb is None:
            direct = min(_MB, self.cap_bytes) if group.device.type == "cpu" else max(self.cap_bytes // 2, 1)
        else:
            if direct_min_mb <= 0:
                raise ValueError(f"direct_min_mb must be > 0, got {direct_min_mb}")
            direct = min(max(int(direct_min_mb * _MB), 1), self.cap_bytes)
        self.direct_min_bytes = direct

    def send(self, named_tensors: Iterable[tuple[str, torch.Tensor]], *, version: int) -> SendReport:
        """Send one complete update (every tensor the receivers should load) tagged with ``version``."""
        if version < 0:
            raise ValueError(f"version must be >= 0, got {version}")
        device = self.group.device
        algo = algo_for_device(device)
        states: dict[str, ByteDigest] = {}
        digests: list[TensorDigest] = []
        seq = nbytes = 0
        t0 = time.perf_counter()
        try:
            buckets = iter_buckets(named_tensors, self.cap_bytes, device=device, direct_min_bytes=self.direct_min_bytes)
            for bucket in buckets:
                header = encode_struct(BucketHeader(version, seq, algo, bucket.direct, bucket.chunks))
                self._broadcast_frame(FRAME_BUCKET, header, bucket.data.numel(), seq)

                def digest_bucket(bucket: Bucket = bucket) -> None:  # runs while the bucket is on the wire
                    for meta in bucket.chunks:
                        state = states.setdefault(meta.name, ByteDigest(algo, meta.total))
                        self._digest_chunk(meta, bucket.data[meta.offset : meta.offset + meta.nbytes], state)
                        if state.consumed == meta.total:
                            digests.append(states.pop(meta.name).finish(meta.name, meta.dtype, meta.shape))

                self.group.broadcast(bucket.data, what=f"bucket {seq}", during=digest_bucket)
                seq += 1
                nbytes += bucket.data.numel()
            assert not states, f"tensors left incomplete by the packer: {sorted(states)}"
            digests.sort(key=lambda d: d.name)
            end = EndMessage(version, seq, nbytes, algo, digests, fingerprint(digests))
            self._broadcast_frame(FRAME_END, encode_struct(end), 0, seq)
        except WeightSyncError:
            raise  # the group itself failed: nothing more can be sent on it
        except BaseException as exc:
            self._abort(f"{type(exc).__name__}: {exc}", seq)
            raise
        seconds = time.perf_counter() - t0
        report = SendReport(
            version, len(digests), seq, nbytes, seconds, nbytes / (1 << 30) / max(seconds, 1e-9), end.fingerprint
        )
        logger.info(
            "weights v%d sent: %d tensors, %d buckets, %.1f MiB in %.3f s (%.2f GB/s), fingerprint %s",
            version,
            report.tensors,
            report.buckets,
            nbytes / _MB,
            seconds,
            report.gbps,
            report.fingerprint,
        )
        return report

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
