"""Actor side of a weight update: receive one complete update from group rank 0 and hand tensors to a loader.

:class:`WeightReceiver` is independent of vLLM: it follows the frames of ``protocol``, receives each bucket into the
buffer the :class:`~async_rl.weight_sync.buckets.TensorAssembler` hands out (direct buckets land straight in the
destination tensor), digests every byte, and passes each batch of completed tensors to ``consume`` (the vLLM engine
passes the model's ``load_weights``). Digesting and loading bucket *i* run while bucket *i+1* is on the wire (the
receive is posted first; the backend progresses it on its own thread). After the END frame it compares its digests
with the sender's and raises :class:`WeightSyncError` naming the first tensor that differs, is missing or is
unexpected. Any failure before END leaves the group out of step, so it is marked broken (rejoin under a new epoch).

Tensors are loaded as they complete (bounded memory), so a mismatch is known only after loading: a failed update
leaves the model with unverified weights, and the caller must treat it as unusable until a later update succeeds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial

import torch

from async_rl.weight_sync.buckets import TensorAssembler
from async_rl.weight_sync.digest import ByteDigest, TensorDigest, compare_digests, fingerprint
from async_rl.weight_sync.errors import WeightSyncError
from async_rl.weight_sync.group import WeightSyncGroup
from async_rl.weight_sync.protocol import (
    FRAME_ABORT,
    FRAME_END,
    BucketHeader,
    EndMessage,
    decode_frame,
    decode_struct,
)

logger = logging.getLogger(__name__)

__all__ = ["ReceiveReport", "WeightReceiver"]

Consumer = Callable[[list[tuple[str, torch.Tensor]]], object]


@dataclass(frozen=True)
class ReceiveReport:
    """One received update. ``consume_seconds`` is the part of ``seconds`` spent inside ``consume`` (loading)."""

    version: int
    tensors: int
    buckets: int
    nbytes: int
    seconds: float
    consume_seconds: float
    gbps: float
    fingerprint: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


class WeightReceiver:
    """Receives weight updates on a non-zero rank of the weight-sync group."""

    def __init__(self, group: WeightSyncGroup) -> None:
        if group.rank == 0:
            raise ValueError("group rank 0 is the sender; receivers have ranks 1..world_size-1")
        self.group = group

    def receive(self, consume: Consumer, *, expect_version: int | None = None) -> ReceiveReport:
        """Receive one complete update, calling ``consume(batch)`` for each batch of completed tensors.

        Raises WeightSyncError (digest mismatch, protocol error, sender abort, version mismatch) or WeightSyncTimeout.
        """
        group = self.group
        assembler = TensorAssembler(group.device)
        states: dict[str, ByteDigest] = {}
        got: dict[str, TensorDigest] = {}
        seq = nbytes = 0
        version = -1
        consume_s = 0.0
        pending: tuple[BucketHeader, torch.Tensor] | None = None

        def process(header: BucketHeader, buf: torch.Tensor) -> None:
            """Digest a received bucket and load the tensors it completes."""
            nonlocal consume_s
            for meta, piece in assembler.commit(header.chunks, header.direct, buf):
                state = states.setdefault(meta.name, ByteDigest(header.algo, meta.total))
                state.update(piece)
                if state.consumed == meta.total:
                    got[meta.name] = states.pop(meta.name).finish(meta.name, meta.dtype, meta.shape)
            done = assembler.pop_complete()
            if done:
                t_load = time.perf_counter()
                consume(done)
                consume_s += time.perf_counter() - t_load

        t0 = time.perf_counter()
        try:
            while True:
                frame = torch.empty(4, dtype=torch.int64, device=group.device)
                group.broadcast(frame, what=f"frame {seq}")
                kind, header_len, data_len, frame_seq = decode_frame(frame)
                if frame_seq != seq:
                    raise WeightSyncError(f"frame sequence {frame_seq} received, expected {seq}")
                raw_header = torch.empty(header_len, dtype=torch.uint8, device=group.device)
                group.broadcast(raw_header, what=f"header {seq}")
                if kind == FRAME_ABORT:
                    reason = raw_header.cpu().numpy().tobytes().decode(errors="replace")
                    raise WeightSyncError(f"sender aborted the update: {reason}")
                if kind == FRAME_END:
                    end = decode_struct(raw_header, EndMessage)
                    break
                header = decode_struct(raw_header, BucketHeader)
                if expect_version is not None and header.version != expect_version:
                    raise WeightSyncError(f"sender is sending weights v{header.version}, expected v{expect_version}")
                if version not in (-1, header.version):
                    raise WeightSyncError(f"weights version changed mid-update: v{version} -> v{header.version}")
                version = header.version
                buf = assembler.buffer_for(header.chunks, header.direct, data_len)
                previous, pending = pending, (header, buf)
                # The previous bucket is digested and loaded while this one is on the wire.
                overlap = partial(process, *previous) if previous is not None else None
                group.broadcast(buf, what=f"bucket {seq}", during=overlap)
                seq += 1
                nbytes += data_len
        except BaseException as exc:
            group.mark_broken(f"receive abandoned mid-update: {exc}")
            raise
        if pending is not None:
            process(*pending)
        assembler.finish()
        if version not in (-1, end.version):
            raise WeightSyncError(f"END message is for weights v{end.version}, buckets were v{version}")
        if (end.buckets, end.nbytes) != (seq, nbytes):
            raise WeightSyncError(
                f"sender reports {end.buckets} buckets / {end.nbytes} B, received {seq} buckets / {nbytes} B"
            )
        compare_digests(end.tensors, got)
        seconds = time.perf_counter() - t0
        report = ReceiveReport(
            end.version,
            len(got),
            seq,
            nbytes,
            seconds,
            consume_s,
            nbytes / (1 << 30) / max(seconds, 1e-9),
            fingerprint(got.values()),
        )
        assert report.fingerprint == end.fingerprint, "equal per-tensor digests must give equal fingerprints"
        logger.info(
            "weights v%d received: %d tensors, %d buckets, %.1f MiB in %.3f s (%.3f s loading), fingerprint %s",
            report.version,
            report.tensors,
            report.buckets,
            nbytes / (1 << 20),
            seconds,
            consume_s,
            report.fingerprint,
        )
        return report
