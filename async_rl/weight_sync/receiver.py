"""Actor side of a weight update: receive one complete update from group rank 0 and hand tensors to a loader.

:class:`WeightReceiver` is independent of vLLM: it reads the update's plan (``protocol``), receives each bucket into
the buffer the :class:`~async_rl.weight_sync.buckets.TensorAssembler` hands out (direct buckets land straight in the
destination tensor, packed tensors are used in place), digests every byte, and passes each batch of completed tensors
to ``consume`` (the vLLM engine passes the model's ``load_weights``). The plan gives every buffer in advance, so the
receives of buckets *i+1* and *i+2* are posted before bucket *i* is digested and loaded: the backend moves bytes on its
own thread while this one loads. After the END frame it compares its digests with the sender's and raises
:class:`WeightSyncError` naming the first tensor that differs, is missing or is unexpected. Any failure before END
leaves the group out of step, so it is marked broken (rejoin under a new epoch).

Tensors are loaded as they complete (bounded memory), so a mismatch is known only after loading: a failed update
leaves the model with unverified weights, and the caller must treat it as unusable until a later update succeeds.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import asdict, dataclass

import torch

from async_rl.weight_sync.buckets import BufferPool, TensorAssembler
from async_rl.weight_sync.digest import ByteDigest, TensorDigest, compare_digests, fingerprint
from async_rl.weight_sync.errors import WeightSyncError
from async_rl.weight_sync.group import Transfer, WeightSyncGroup
from async_rl.weight_sync.protocol import (
    FRAME_ABORT,
    FRAME_END,
    BucketSpec,
    EndMessage,
    UpdatePlan,
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

    def __init__(self, group: WeightSyncGroup, *, pool: BufferPool | None = None) -> None:
        """``pool``: receive buffers kept across updates (see :class:`BufferPool`). The tensors handed to ``consume``
        then live in the pool's memory and are overwritten by the next update, so ``consume`` must copy what it keeps
        (vLLM's loaders do). Without a pool every update gets fresh memory."""
        if group.rank == 0:
            raise ValueError("group rank 0 is the sender; receivers have ranks 1..world_size-1")
        self.group = group
        self.pool = pool
        self.report: ReceiveReport | None = None  # the last complete update's (see :meth:`batches`)

    def receive(self, consume: Consumer, *, expect_version: int | None = None) -> ReceiveReport:
        """Receive one complete update, calling ``consume(batch)`` for each batch of completed tensors.

        Raises WeightSyncError (digest mismatch, protocol error, sender abort, version mismatch) or WeightSyncTimeout.
        """
        stream = self.batches(expect_version=expect_version)
        try:
            for batch in stream:
                consume(batch)
        finally:
            stream.close()  # a consumer that raised leaves the stream mid-update: the group is marked broken now
        assert self.report is not None
        return self.report

    def batches(self, *, expect_version: int | None = None) -> Generator[list[tuple[str, torch.Tensor]]]:
        """Receive one complete update as a stream: each bucket's completed tensors, as they arrive.

        Exhausting it runs the END checks (they raise like :meth:`receive`) and sets :attr:`report`. A consumer that
        stops early (closes the generator, or raises through it) leaves the group out of step: it is marked broken.
        The time spent outside the generator, between batches, is the report's ``consume_seconds``. This is the form
        vLLM's ``load_weights`` takes in one call (its per-call set-up is paid once per update, not per bucket).
        """
        self.report = None
        group = self.group
        pool = self.pool if self.pool is not None else BufferPool(group.device, block_bytes=0, keep=False)
        assembler = TensorAssembler(group.device, pool)
        states: dict[str, ByteDigest] = {}
        got: dict[str, TensorDigest] = {}
        consume_s = 0.0

        def process(bucket: BucketSpec, buf: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
            """Digest a received bucket; return the tensors it completes."""
            for meta, piece in assembler.commit(bucket, buf):
                state = states.setdefault(meta.name, ByteDigest(plan.algo, meta.total))
                state.update(piece)
                if state.consumed == meta.total:
                    got[meta.name] = states.pop(meta.name).finish(meta.name, meta.dtype, meta.shape)
            return assembler.pop_complete()

        t0 = time.perf_counter()
        try:
            kind, raw, announced = self._frame(0)
            if kind == FRAME_END:
                raise WeightSyncError("END frame received before any plan: sender and receiver are out of step")
            plan = decode_struct(raw, UpdatePlan)
            if announced != sum(b.nbytes for b in plan.buckets):
                raise WeightSyncError(f"plan frame announces {announced} B, the plan's buckets hold another size")
            if expect_version is not None and plan.version != expect_version:
                raise WeightSyncError(f"sender is sending weights v{plan.version}, expected v{expect_version}")
            upcoming = iter(enumerate(plan.buckets))
            posted: deque[tuple[BucketSpec, torch.Tensor, Transfer]] = deque()

            def post_next() -> None:
                item = next(upcoming, None)
                if item is not None:
                    seq, bucket = item
                    buf = assembler.buffer_for(bucket)
                    posted.append((bucket, buf, group.post(buf, what=f"bucket {seq}")))

            post_next()
            post_next()
            while posted:
                bucket, buf, transfer = posted.popleft()
                group.complete(transfer)
                post_next()
                done = process(bucket, buf)
                if done:  # consumed (loaded) while the next two buckets are on the wire
                    t_load = time.perf_counter()
                    yield done
                    consume_s += time.perf_counter() - t_load
            kind, raw, _ = self._frame(len(plan.buckets))
            if kind != FRAME_END:
                raise WeightSyncError(f"frame kind {kind} after the last bucket, expected END")
            end = decode_struct(raw, EndMessage)
        except BaseException as exc:
            pool.drop()  # a receive still posted may write into what it lent
            group.mark_broken(f"receive abandoned mid-update: {exc}")
            raise
        pool.restore()  # every tensor was consumed; nothing is in flight
        assembler.finish()
        self.report = report = _checked_report(plan, end, got, time.perf_counter() - t0, consume_s)
        logger.info(
            "weights v%d received: %d tensors, %d buckets, %.1f MiB in %.3f s (%.3f s loading), fingerprint %s",
            report.version,
            report.tensors,
            report.buckets,
            report.nbytes / (1 << 20),
            report.seconds,
            report.consume_seconds,
            report.fingerprint,
        )

    def _frame(self, seq: int) -> tuple[int, torch.Tensor, int]:
        """Receive one frame and its header: ``(kind, header bytes, data length)``; ABORT raises the sender's reason."""
        group = self.group
        frame = torch.empty(4, dtype=torch.int64, device=group.device)
        group.broadcast(frame, what=f"frame {seq}")
        kind, header_len, data_len, frame_seq = decode_frame(frame)
        raw = torch.empty(header_len, dtype=torch.uint8, device=group.device)
        group.broadcast(raw, what=f"header {seq}")
        if kind == FRAME_ABORT:
            reason = raw.cpu().numpy().tobytes().decode(errors="replace")
            raise WeightSyncError(f"sender aborted the update: {reason}")
        if frame_seq != seq:
            raise WeightSyncError(f"frame sequence {frame_seq} received, expected {seq}")
        return kind, raw, data_len


def _checked_report(
    plan: UpdatePlan, end: EndMessage, got: dict[str, TensorDigest], seconds: float, consume_s: float
) -> ReceiveReport:
    """The END checks of a received update (version, bucket count and bytes, every tensor's digest), then its
    report; :class:`WeightSyncError` naming the first mismatch."""
    seq, nbytes = len(plan.buckets), sum(b.nbytes for b in plan.buckets)
    if end.version != plan.version:
        raise WeightSyncError(f"END message is for weights v{end.version}, the plan was v{plan.version}")
    if (end.buckets, end.nbytes) != (seq, nbytes):
        raise WeightSyncError(
            f"sender reports {end.buckets} buckets / {end.nbytes} B, received {seq} buckets / {nbytes} B"
        )
    compare_digests(end.tensors, got)
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
    return report
