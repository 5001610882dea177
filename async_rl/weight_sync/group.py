"""The stateless learner <-> actors process group that carries weight updates.

Rank 0 is the learner's sending rank; ranks 1..N are the actors' vLLM workers. The group lives outside
``torch.distributed``'s global state (the learner already has its own FSDP world, the vLLM workers theirs): it is a
``TCPStore`` plus a ``ProcessGroupGloo`` (CPU) or ``ProcessGroupNCCL`` (GPU) built directly on it. ``backend="auto"``
picks NCCL when CUDA is available and gloo otherwise; nothing else in the weight-sync path depends on the backend.

Epochs: a gloo/NCCL group has a fixed membership and is unusable after a timeout or a dead peer. Recovery is a new
group under a new *epoch*: every member calls :meth:`WeightSyncGroup.rejoin` (or :func:`open_group` again) with the
same epoch number, which namespaces the rendezvous keys (``PrefixStore``) on the same TCPStore, so stale keys of a
failed epoch can never be confused with the new one. The TCPStore server lives in rank 0's process for the lifetime
of the learner.

Every collective goes through :meth:`WeightSyncGroup.broadcast`, or its two halves :meth:`~WeightSyncGroup.post` and
:meth:`~WeightSyncGroup.complete` (a transfer stays in flight while the next is prepared). Each is bounded by the group
timeout, and an expiry becomes :class:`WeightSyncTimeout` (never a hang) and marks the group broken.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from async_rl.transport.protocol import SyncBackend
from async_rl.weight_sync.errors import WeightSyncError, WeightSyncTimeout

logger = logging.getLogger(__name__)

__all__ = ["Transfer", "WeightSyncGroup", "create_store", "open_group", "resolve_backend"]

_PREFIX = "async_rl/weight_sync/epoch"
_WAIT_SLICE = timedelta(seconds=0.05)  # how often a waiting member checks whether the transfer was given up


def resolve_backend(*, backend: str) -> SyncBackend:
    """``"auto"`` -> ``"nccl"`` if CUDA is available else ``"gloo"``; explicit names are validated."""
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "gloo":
        return "gloo"
    if backend != "nccl":
        raise ValueError(f"backend must be 'auto', 'gloo' or 'nccl', got {backend!r}")
    if not torch.cuda.is_available():
        raise ValueError("backend 'nccl' needs a CUDA device; use 'gloo' or 'auto'")
    return "nccl"


def create_store(host: str, port: int, *, is_master: bool, timeout_s: float) -> dist.TCPStore:
    """A TCPStore server (``is_master``: rank 0; ``port=0`` picks a free port, see ``.port``) or client."""
    if not host:
        raise ValueError("host must be a non-empty string")
    if not 0 <= port < 65536 or (port == 0 and not is_master):
        raise ValueError(f"port must be in [1, 65535] (0 only for the master), got {port}")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    return dist.TCPStore(
        host, port, None, is_master, timeout=timedelta(seconds=timeout_s), wait_for_workers=False, use_libuv=True
    )


@dataclass(frozen=True)
class Transfer:
    """One posted broadcast (see :meth:`WeightSyncGroup.post`)."""

    work: Any
    what: str
    deadline: float  # time.monotonic() after which it counts as timed out


class WeightSyncGroup:
    """One epoch of the weight-sync group, as seen by one member. Use :func:`open_group` to create it."""

    def __init__(
        self, store: dist.TCPStore, *, rank: int, world_size: int, epoch: int, backend: str, timeout_s: float
    ) -> None:
        if world_size < 2:
            raise ValueError(f"world_size must be >= 2 (one learner rank and at least one actor), got {world_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.epoch = epoch
        self.backend = resolve_backend(backend=backend)
        self.timeout_s = float(timeout_s)
        self.device = (
            torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else torch.device("cpu")
        )
        self.broken = False
        # Checked while a collective is in flight: a reason string ends the wait early (a member the coordinator
        # presumes dead cannot complete it, so waiting for the full timeout would only stall the learner).
        self.abort_if: Callable[[], str | None] | None = None
        self._pg = self._connect()

    def _connect(self) -> Any:
        prefix = dist.PrefixStore(f"{_PREFIX}/{self.epoch}/", self.store)
        timeout = timedelta(seconds=self.timeout_s)
        t0 = time.perf_counter()
        try:
            if self.backend == "gloo":
                pg: Any = dist.ProcessGroupGloo(prefix, self.rank, self.world_size, timeout)
            else:
                opts = dist.ProcessGroupNCCL.Options()
                # Our own deadline (polled in broadcast) must fire first: NCCL's watchdog tears the process down.
                opts._timeout = timeout * 2 + timedelta(seconds=60)
                pg = dist.ProcessGroupNCCL(prefix, self.rank, self.world_size, opts)
        except RuntimeError as exc:  # rendezvous timed out, or a peer vanished mid-handshake
            self.broken = True
            raise WeightSyncTimeout(
                f"weight-sync group epoch {self.epoch} (rank {self.rank}/{self.world_size}) failed to form: {exc}"
            ) from exc
        logger.info(
            "weight-sync group epoch %d formed: rank %d/%d, %s, %.2f s",
            self.epoch,
            self.rank,
            self.world_size,
            self.backend,
            time.perf_counter() - t0,
        )
        return pg

    def broadcast(
        self, tensor: torch.Tensor, *, what: str = "tensor", during: Callable[[], object] | None = None
    ) -> None:
        """Broadcast ``tensor`` from rank 0 (in place on the others), bounded by the group timeout.

        ``during`` runs on this thread while the transfer is in flight (the collective progresses on the backend's
        own thread). It must not touch ``tensor``'s memory on a receiving rank. If it raises, the group is marked
        broken (the stream is out of step) and its exception propagates.
        """
        transfer = self.post(tensor, what=what)
        if during is not None:
            try:
                during()
            except BaseException:
                self.broken = True
                raise
        self.complete(transfer)

    def post(self, tensor: torch.Tensor, *, what: str = "tensor") -> Transfer:
        """Start broadcasting ``tensor`` and return at once; :meth:`complete` waits for it. Several transfers may be in
        flight; every member must post the same sequence, and ``tensor`` must stay untouched until completed."""
        if self.broken:
            raise WeightSyncError(f"weight-sync group epoch {self.epoch} is broken; rejoin under a new epoch first")
        timeout = timedelta(seconds=self.timeout_s)
        try:
            work = self._pg.broadcast(tensor, 0, timeout) if self.backend == "gloo" else self._pg.broadcast(tensor, 0)
        except RuntimeError as exc:
            raise self._failure(what, exc) from exc
        return Transfer(work, what, time.monotonic() + self.timeout_s)

    def complete(self, transfer: Transfer) -> None:
        """Wait for a posted transfer, at most until its deadline (the group timeout after it was posted).

        Every 0.05 s of waiting it checks whether the transfer was given up: rank 0 by ``abort_if``, the others by
        rank 0's store key (:meth:`abandon`)."""
        work, what = transfer.work, transfer.what
        try:
            while not self._wait_slice(work):
                if time.monotonic() > transfer.deadline:
                    raise RuntimeError(f"Operation timed out after {self.timeout_s} s")
                reason = self._abandoned()
                if reason:
                    raise WeightSyncError(f"broadcast of {what} abandoned (epoch {self.epoch}): {reason}")
        except RuntimeError as exc:
            if isinstance(exc, WeightSyncError):
                self.broken = True
                raise
            raise self._failure(what, exc) from exc

    def _wait_slice(self, work: Any) -> bool:
        """Wait up to about 0.05 s for ``work``; True once it completed (a failed transfer raises RuntimeError).

        gloo: a blocking wait with a short timeout, which returns the moment the bytes are in (a timed-out wait
        leaves the transfer running; only a completed one carries a failure). NCCL's ``wait()`` does not block the
        host, so its completion is polled."""
        if self.backend == "gloo":
            try:
                work.wait(_WAIT_SLICE)
            except RuntimeError:
                if not work.is_completed():
                    return False
                # It completed between the slice's expiry and the check: wait again for its real outcome (returns
                # at once; raises only if the transfer itself failed), never report the slice's own timeout.
                work.wait(timedelta(seconds=self.timeout_s))
            return True
        deadline, pause = time.monotonic() + _WAIT_SLICE.total_seconds(), 0.0001
        while not work.is_completed():
            if time.monotonic() > deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.002)
        work.wait()
        return True

    def _abandoned(self) -> str | None:
        """Why the transfer in flight is given up, if it is (see :meth:`abandon`)."""
        if self.rank == 0:
            reason = self.abort_if() if self.abort_if is not None else None
            if reason:
                self.abandon(reason)
            return reason
        try:
            if self.store.check([self._abandoned_key]):
                return f"given up by the learner: {self.store.get(self._abandoned_key).decode()}"
        except RuntimeError:  # the learner's store is gone: the learner is; our own deadline still applies
            return None
        return None

    @property
    def _abandoned_key(self) -> str:
        return f"{_PREFIX}/{self.epoch}/abandoned"

    def abandon(self, reason: str) -> None:
        """Rank 0: give up this epoch's transfer, and tell the members through the store (they stop waiting within
        0.1 s instead of at their timeout, e.g. when one member is frozen and the others wait on it)."""
        self.broken = True
        try:
            self.store.set(self._abandoned_key, reason)
        except RuntimeError as exc:
            logger.debug("could not mark weight-sync epoch %d abandoned: %s", self.epoch, exc)

    def mark_broken(self, reason: str) -> None:
        """Declare the group unusable (a member left the collective sequence); rejoin before the next update."""
        if not self.broken:
            logger.warning("weight-sync group epoch %d (rank %d) marked broken: %s", self.epoch, self.rank, reason)
        self.broken = True

    def _failure(self, what: str, exc: RuntimeError) -> WeightSyncError:
        self.broken = True
        text = str(exc)
        where = f"(epoch {self.epoch}, rank {self.rank})"
        if "timed out" in text.lower() or "timeout" in text.lower():
            return WeightSyncTimeout(f"broadcast of {what} timed out after {self.timeout_s:.1f} s {where}")
        return WeightSyncError(f"broadcast of {what} failed {where}: {text}")

    def rejoin(self, epoch: int | None = None) -> None:
        """Replace the process group with a fresh one under ``epoch`` (default: the next one). Collective."""
        new_epoch = self.epoch + 1 if epoch is None else epoch
        if new_epoch <= self.epoch and not self.broken:
            raise ValueError(f"epoch must increase (current {self.epoch}), got {new_epoch}")
        self._retire()
        self.epoch = new_epoch
        self.broken = False
        self._pg = self._connect()

    def close(self) -> None:
        """Release the process group (the store stays with its owner)."""
        self._retire()
        self.broken = True

    def _retire(self) -> None:
        pg = getattr(self, "_pg", None)
        if pg is None:
            return
        # A group that timed out may still have an operation stuck on a socket: abort it rather than wait.
        try:
            if self.broken:
                pg.abort()
            else:
                pg.shutdown()
        except RuntimeError as exc:  # already torn down by a peer; nothing left to release
            logger.debug("weight-sync group epoch %d teardown: %s", self.epoch, exc)
        self._pg = None  # type: ignore[assignment]


def open_group(
    host: str,
    port: int,
    *,
    rank: int,
    world_size: int,
    epoch: int = 0,
    backend: str,
    timeout_s: float,
    store: dist.TCPStore | None = None,
) -> WeightSyncGroup:
    """Join (collectively) the weight-sync group. Rank 0 hosts the TCPStore unless ``store`` is given.

    Blocks until all ``world_size`` members have joined or ``timeout_s`` passes (-> WeightSyncTimeout).
    """
    if store is None:
        store = create_store(host, port, is_master=rank == 0, timeout_s=timeout_s)
    return WeightSyncGroup(store, rank=rank, world_size=world_size, epoch=epoch, backend=backend, timeout_s=timeout_s)
