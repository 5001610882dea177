"""The learner's side of weight sync: who is in the group, under which epoch, and one publish per new version.

Every learner rank calls :meth:`WeightPublisher.publish` after an optimizer step (the FSDP gather is a collective of
the learner world); only rank 0 talks to the actors. The order of one publish:

1. rank 0 takes the live actors from the coordinator (sorted ids -> ranks 1..N) and tells every learner rank whether
   there is anyone to send to;
2. if the membership changed, or the last transfer broke the group, rank 0 starts a new *epoch*;
3. rank 0 announces the plan ``{version, epoch, world_size, ranks, host, port, backend, timeout_s}`` through the
   coordinator (it rides on the VersionUpdate message), so each actor knows to (re)join and receive;
4. rank 0 (re)forms the group if needed (blocks until every member joined, or the timeout);
5. all learner ranks walk the full-weight iterator bucket by bucket; rank 0 broadcasts, the actors load and verify
   the digest;
6. the report (seconds, bytes, bandwidth) becomes ``sync/...`` metrics.

A failure (an actor died mid-transfer, a timeout) never stops training: the group is marked broken, the rest of the
iterator is still drained so the learner ranks stay in step, and the next publish re-forms the group from the actors
that are still alive. Actors that missed a version keep generating under their old weights only as far as the
staleness bound lets them (the coordinator grants them nothing newer than they may start).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch

from async_rl.weight_sync.group import WeightSyncGroup, create_store, open_group, resolve_backend
from async_rl.weight_sync.sender import WeightSender

logger = logging.getLogger(__name__)


class _Ctx(Protocol):
    rank: int

    def broadcast_bytes(self, data: bytes | None, src: int = 0) -> bytes: ...


class _Coordinator(Protocol):
    def live_actor_ids(self) -> list[str]: ...

    def set_policy_version(self, version: int, weight_sync: dict[str, Any] | None = None) -> None: ...


class WeightPublisher:
    """Publishes each new policy version to the live actors. Construct on every learner rank."""

    def __init__(
        self,
        ctx: _Ctx,
        coordinator: _Coordinator | None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        backend: str = "auto",
        bucket_size_mb: float = 256.0,
        timeout_s: float = 600.0,
    ) -> None:
        if ctx.rank == 0 and coordinator is None:
            raise ValueError("learner rank 0 needs the coordinator to announce weight updates")
        self.ctx = ctx
        self.coordinator = coordinator
        self.host = host
        self.backend = resolve_backend(backend)
        self.bucket_size_mb = bucket_size_mb
        self.timeout_s = timeout_s
        self.store = create_store(host, port, is_master=True, timeout_s=timeout_s) if ctx.rank == 0 else None
        self.port = int(self.store.port) if self.store is not None else 0
        self.epoch = -1
        self.members: list[str] = []
        self.group: WeightSyncGroup | None = None
        self.failures = 0
        self.last: dict[str, float] = {}

    def publish(self, version: int, weights: Callable[[], Iterator[tuple[str, torch.Tensor]]]) -> dict[str, float]:
        """Announce ``version`` and stream ``weights()`` to the actors. Returns ``sync/...`` metrics (rank 0)."""
        started = time.monotonic()
        members = self.coordinator.live_actor_ids() if self.coordinator is not None and self.ctx.rank == 0 else []
        send = self.ctx.broadcast_bytes(b"1" if members else b"0") == b"1"
        if self.ctx.rank != 0:
            if send:
                for _ in weights():  # the gather is collective: stay in step with rank 0
                    pass
            return {}
        assert self.coordinator is not None
        if not members:
            self.coordinator.set_policy_version(version, weight_sync={})
            return {"sync/actors": 0.0}
        if members != self.members or self.group is None or self.group.broken:
            self._close_group()
            self.epoch += 1
            self.members = members
        plan = {
            "version": version,
            "epoch": self.epoch,
            "world_size": len(members) + 1,
            "ranks": {actor: i + 1 for i, actor in enumerate(members)},
            "host": self.host,
            "port": self.port,
            "backend": self.backend,
            "timeout_s": self.timeout_s,
        }
        self.coordinator.set_policy_version(version, weight_sync=plan)
        it = weights()
        metrics: dict[str, float] = {"sync/actors": float(len(members)), "sync/epoch": float(self.epoch)}
        try:
            if self.group is None:
                self.group = open_group(
                    self.host,
                    self.port,
                    rank=0,
                    world_size=len(members) + 1,
                    epoch=self.epoch,
                    backend=self.backend,
                    timeout_s=self.timeout_s,
                    store=self.store,
                )
            report = WeightSender(self.group, bucket_size_mb=self.bucket_size_mb).send(it, version=version)
            info = report.as_dict()
            metrics.update(
                {
                    "sync/seconds": time.monotonic() - started,
                    "sync/bytes": float(info.get("bytes", 0.0)),  # type: ignore[arg-type]
                    "sync/bandwidth_MBps": float(info.get("bandwidth_MBps", 0.0)),  # type: ignore[arg-type]
                    "sync/failures": float(self.failures),
                }
            )
        except Exception as exc:  # a dead or slow actor: re-form next time, keep training
            self.failures += 1
            logger.warning("weight publish of version %d failed (%s); the group is re-formed next time", version, exc)
            if self.group is not None:
                self.group.mark_broken(str(exc))
            for _ in it:  # keep the other learner ranks' collective gathers in step
                pass
            metrics.update({"sync/seconds": time.monotonic() - started, "sync/failures": float(self.failures)})
        self.last = metrics
        return metrics

    def needs_refresh(self) -> bool:
        """Rank 0: should the current version be re-published now (an actor joined, or the last transfer broke)?

        The learner asks this while it waits for rollouts: a new or restarted actor holds only the initial weights
        and cannot start work the staleness bound forbids until it receives the current ones.
        """
        if self.coordinator is None or self.ctx.rank != 0:
            return False
        live = self.coordinator.live_actor_ids()
        broken = self.group is not None and self.group.broken
        return any(actor not in self.members for actor in live) or (broken and bool(live))

    def _close_group(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None

    def close(self) -> None:
        self._close_group()
