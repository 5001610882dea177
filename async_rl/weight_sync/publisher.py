"""The learner's side of weight sync: who is in the group, under which epoch, and one publish per new version.

Every learner rank calls :meth:`WeightPublisher.publish` after an optimizer step (the FSDP gather is a collective of
the learner world); only rank 0 talks to the actors. The order of one publish:

1. rank 0 takes the live actors from the coordinator and keeps those it may invite: the current members, and actors
   that announced themselves in the store since they last missed a join (``weight_sync.membership``);
2. if that set changed, or the last transfer broke the group, rank 0 starts a new *epoch*: it announces the plan
   (``transport.protocol.WeightSyncPlan``: version, epoch, candidates, host, port, backend, timeouts) through the
   coordinator (it rides on the VersionUpdate message), waits at most ``join_timeout_s`` for the candidates to say
   they are ready, and forms the group from those that did (the roster); the rest are left out until they announce
   themselves again;
3. rank 0 tells every learner rank whether there is anyone to send to, and the dtype the weights travel in (the
   gathers are collectives in it; floating tensors are cast before they are gathered);
4. all learner ranks walk the full-weight iterator bucket by bucket; rank 0 broadcasts (each bucket bounded by
   ``timeout_s``), the actors load and verify the digest. Floating tensors travel in the dtype every member's
   engine serves when that is narrower than they are stored in (:func:`wire_dtype`: an fp32 master sent to bf16
   engines as bf16, half the bytes; vLLM would round them to bf16 as it loads them anyway);
5. rank 0 tells the coordinator which actors received the version (grants follow weights actually sent, not an
   actor's claim), and the report (seconds, bytes, bandwidth, members) becomes ``sync/...`` metrics.

A failure (an actor died mid-transfer, a timeout) never stops training: the group is marked broken, the rest of the
iterator is still drained so the learner ranks stay in step, and the next publish re-forms the group from the actors
that are still alive. Actors that missed a version keep generating under their old weights only as far as the
staleness bound lets them (the coordinator grants them nothing newer than they may start).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol

import torch

from async_rl import metric_catalog as mc
from async_rl.transport.protocol import AdapterPlan, ServedCheck, WeightSyncPlan, checked
from async_rl.weight_sync.group import WeightSyncGroup, create_store, resolve_backend
from async_rl.weight_sync.membership import collect_roster, read_candidates
from async_rl.weight_sync.protocol import TensorSpec, dtype_from_name, dtype_name
from async_rl.weight_sync.sender import SendReport, WeightSender

if TYPE_CHECKING:
    from async_rl.config.async_training import WeightSyncConfig

logger = logging.getLogger(__name__)

_NO_SEND, _AS_STORED = b"-", b"="  # what rank 0 tells the other ranks before a publish (else: the wire dtype's name)


class _Ctx(Protocol):
    rank: int

    def broadcast_bytes(self, data: bytes | None, src: int = 0) -> bytes: ...


class _Coordinator(Protocol):
    @property
    def policy_version(self) -> int: ...

    def live_actor_ids(self) -> list[str]: ...

    def set_policy_version(self, version: int, weight_sync: WeightSyncPlan | None = None) -> None: ...

    def confirm_weights(self, version: int, actor_ids: list[str]) -> None: ...

    def learner_waits(self) -> AbstractContextManager[None]: ...


def send_metrics(report: SendReport) -> dict[str, float]:
    """The ``sync/...`` metrics of one completed broadcast: the bytes on the wire and their rate (MiB/s)."""
    mib_per_s = report.nbytes / 2**20 / max(report.seconds, 1e-9)
    return {mc.SYNC_BYTES: float(report.nbytes), mc.SYNC_BANDWIDTH_MBPS: mib_per_s}


def wire_dtype(served: Collection[str], stored: Sequence[TensorSpec]) -> torch.dtype | None:
    """The dtype floating weights travel in: the one every member's engine serves (``served``: wire names, one per
    member), when it is narrower than every floating tensor as ``stored``. None (send as stored) when there are no
    members, they differ, one did not say (an actor without a model), or the cast would widen or keep a tensor."""
    names = set(served)
    if len(names) != 1 or "" in names:
        return None
    target = dtype_from_name(names.pop())
    if not target.is_floating_point:
        return None
    floats = [dtype_from_name(spec.dtype) for spec in stored if dtype_from_name(spec.dtype).is_floating_point]
    narrower = all(torch.finfo(d).bits > torch.finfo(target).bits for d in floats)
    return target if floats and narrower else None


class WeightPublisher:
    """Publishes each new policy version to the live actors. Construct on every learner rank, with
    :meth:`from_config` (the settings of ``async_training.weight_sync``); no argument has a default of its own."""

    def __init__(
        self,
        ctx: _Ctx,
        coordinator: _Coordinator | None,
        *,
        host: str,
        port: int,
        backend: str,
        bucket_size_mb: float,
        timeout_s: float,
        join_timeout_s: float,
        adapter: AdapterPlan | None,
        served_check_tolerance: float,
    ) -> None:
        """``adapter``: a LoRA run's adapter (each update then carries only its tensors); None: full weights.
        ``served_check_tolerance``: the resolved ``async_training.weight_sync.served_check_tolerance`` (LoRA runs)."""
        if ctx.rank == 0 and coordinator is None:
            raise ValueError("learner rank 0 needs the coordinator to announce weight updates")
        self.ctx = ctx
        self.coordinator = coordinator
        self.host = host
        self.backend = resolve_backend(backend=backend)
        self.bucket_size_mb = bucket_size_mb
        self.timeout_s = timeout_s
        self.join_timeout_s = join_timeout_s
        self.adapter = adapter
        self.served_check_tolerance = served_check_tolerance
        self._check: ServedCheck | None = None  # the version being published's (see publish)
        self.store = create_store(host, port, is_master=True, timeout_s=timeout_s) if ctx.rank == 0 else None
        self.port = int(self.store.port) if self.store is not None else 0
        self.epoch = -1
        self.members: list[str] = []
        self.served: dict[str, str] = {}  # member -> the dtype its engine serves (wire name; "": not said)
        self.group: WeightSyncGroup | None = None
        self.sender: WeightSender | None = None  # one per group: it keeps its packing buffers across publishes
        self.failures = 0
        self.left_out = 0  # invitations not answered within join_timeout_s
        self._missed: dict[str, str] = {}  # actor -> the announcement it missed a join with (not invited again)
        self.last: dict[str, float] = {}
        if self.coordinator is not None and ctx.rank == 0:  # where actors announce themselves before any epoch
            plan = self._plan(version=-1, candidates=[])
            self.coordinator.set_policy_version(self.coordinator.policy_version, weight_sync=plan)

    @classmethod
    def from_config(
        cls,
        ws: WeightSyncConfig,
        ctx: _Ctx,
        coordinator: _Coordinator | None,
        *,
        adapter: AdapterPlan | None,
        served_check_tolerance: float,
    ) -> WeightPublisher:
        """From the ``async_training.weight_sync`` section: rank 0's store at ``master_addr:master_port`` (port 0:
        a free one), ``backend`` ("auto": nccl on CUDA, else gloo), ``bucket_size_mb``, ``timeout_s`` and
        ``join_timeout_s``."""
        return cls(
            ctx,
            coordinator,
            host=ws.master_addr,
            port=ws.master_port,
            backend=ws.backend,
            bucket_size_mb=ws.bucket_size_mb,
            timeout_s=ws.timeout_s,
            join_timeout_s=ws.join_timeout_s,
            adapter=adapter,
            served_check_tolerance=served_check_tolerance,
        )

    def _plan(self, *, version: int, candidates: list[str]) -> WeightSyncPlan:
        """Rank 0: the plan actors act on, validated here (the one place it is built)."""
        plan = WeightSyncPlan(
            host=self.host,
            port=self.port,
            backend=self.backend,
            timeout_s=self.timeout_s,
            join_timeout_s=self.join_timeout_s,
            version=version,
            epoch=self.epoch,
            candidates=tuple(candidates),
            adapter=self.adapter,
            served_check=self._check if version >= 0 else None,
        )
        return checked(plan)

    def _eligible(self) -> list[str]:
        """Rank 0: live actors that may be in the next epoch (members, and fresh announcements)."""
        assert self.coordinator is not None and self.store is not None
        live = self.coordinator.live_actor_ids()
        announced = read_candidates(self.store, [a for a in live if a not in self.members])
        fresh = [a for a, token in announced.items() if self._missed.get(a) != token]
        return sorted({a for a in live if a in self.members} | set(fresh))

    def _reform(self, version: int, candidates: list[str]) -> dict[str, float]:
        """Rank 0: a new epoch for ``candidates``; only those ready within ``join_timeout_s`` become members."""
        assert self.coordinator is not None and self.store is not None
        self._close_group()
        self.epoch += 1
        t0 = time.monotonic()
        self.coordinator.set_policy_version(version, weight_sync=self._plan(version=version, candidates=candidates))
        live_ids = self.coordinator.live_actor_ids
        with self.coordinator.learner_waits():  # idle until the actors join: lending actors may use its cores
            roster = collect_roster(self.store, self.epoch, candidates, self.join_timeout_s, alive=live_ids)
        announced = read_candidates(self.store, candidates)
        live = set(live_ids())
        for actor in candidates:
            if actor in roster.ranks:
                self._missed.pop(actor, None)
            else:
                self.left_out += 1
                self._missed[actor] = announced.get(actor, "")
                why = f"within {self.join_timeout_s:.1f} s" if actor in live else "before it was presumed dead"
                logger.warning(
                    "actor %s was not ready for weight-sync epoch %d %s: left out until it announces itself again",
                    actor,
                    self.epoch,
                    why,
                )
        self.members = roster.members
        self.served = dict(roster.served)
        if self.members:
            self.group = WeightSyncGroup(
                self.store,
                rank=0,
                world_size=roster.world_size,
                epoch=self.epoch,
                backend=self.backend,
                timeout_s=self.timeout_s,
            )
            self.group.abort_if = self._member_gone
            self.sender = WeightSender(self.group, bucket_size_mb=self.bucket_size_mb)
        return {mc.SYNC_JOIN_SECONDS: time.monotonic() - t0}

    def _member_gone(self) -> str | None:
        """Why the transfer in flight cannot complete: a member the coordinator now presumes dead (or quarantined)."""
        assert self.coordinator is not None
        live = set(self.coordinator.live_actor_ids())
        gone = [actor for actor in self.members if actor not in live]
        return f"actor(s) {', '.join(gone)} no longer alive" if gone else None

    def publish(
        self,
        version: int,
        weights: Callable[[torch.dtype | None], Iterator[tuple[str, torch.Tensor]]],
        manifest: Callable[[torch.dtype | None], Sequence[TensorSpec]] | None = None,
        probe: tuple[list[int], list[float]] | None = None,
    ) -> dict[str, float]:
        """Announce ``version`` and stream ``weights(dtype)`` to the actors. Returns ``sync/...`` metrics (rank 0).

        ``dtype`` is what floating tensors are cast to (None: as stored); rank 0 picks it with :func:`wire_dtype`
        from ``manifest(None)``, the other ranks only gather. ``manifest(dtype)`` (what ``weights(dtype)`` yields,
        from metadata) keeps the gather lazy; without it rank 0 takes every tensor before sending, as stored (see
        :meth:`WeightSender.send`). ``probe`` (token ids, the learner's log-probs of them at ``version``) rides on
        the plan as a :class:`ServedCheck` the actors verify after loading."""
        started = time.monotonic()
        self._check = None
        if probe is not None:
            self._check = ServedCheck(
                token_ids=tuple(probe[0]), logprobs=tuple(probe[1]), tolerance=self.served_check_tolerance
            )
        metrics: dict[str, float] = {}
        if self.ctx.rank == 0:
            assert self.coordinator is not None
            candidates = self._eligible()
            try:
                if candidates != self.members or (candidates and (self.group is None or self.group.broken)):
                    metrics.update(self._reform(version, candidates))
                else:
                    self.coordinator.set_policy_version(
                        version, weight_sync=self._plan(version=version, candidates=self.members)
                    )
            except Exception as exc:  # the group failed to form although its members said they were ready
                self.failures += 1
                logger.warning("weight-sync epoch %d failed to form (%s); re-formed next time", self.epoch, exc)
                self._close_group()
        # Rank 0 tells every rank whether it sends, and in which dtype: each gather is a collective in that dtype.
        dtype: torch.dtype | None = None
        said: bytes | None = None
        if self.ctx.rank == 0:
            if self.group is not None and manifest is not None:
                dtype = wire_dtype([self.served.get(m, "") for m in self.members], manifest(None))
            said = _NO_SEND if self.group is None else _AS_STORED if dtype is None else dtype_name(dtype).encode()
        said = self.ctx.broadcast_bytes(said)
        send = said != _NO_SEND
        if self.ctx.rank != 0:
            if send:
                for _ in weights(None if said == _AS_STORED else dtype_from_name(said.decode())):  # stay in step
                    pass
            return {}
        assert self.coordinator is not None
        metrics.update(
            {
                mc.SYNC_ACTORS: float(len(self.members) if send else 0),
                mc.SYNC_EPOCH: float(self.epoch),
                mc.SYNC_LEFT_OUT: float(self.left_out),
                mc.SYNC_FAILURES: float(self.failures),
            }
        )
        if not send:
            self.last = metrics
            return metrics
        assert self.group is not None
        it = weights(dtype)
        try:
            assert self.sender is not None and self.sender.group is self.group
            report = self.sender.send(it, version=version, manifest=manifest(dtype) if manifest else None)
            self.coordinator.confirm_weights(version, list(self.members))
            metrics.update({mc.SYNC_SECONDS: time.monotonic() - started, **send_metrics(report)})
            if manifest is not None:
                floats = [s for s in manifest(dtype) if dtype_from_name(s.dtype).is_floating_point]
                if floats:
                    metrics[mc.SYNC_WIRE_BITS] = float(max(torch.finfo(dtype_from_name(s.dtype)).bits for s in floats))
        except Exception as exc:  # a dead or slow actor: re-form next time, keep training
            self.failures += 1
            logger.warning("weight publish of version %d failed (%s); the group is re-formed next time", version, exc)
            self.group.abandon(str(exc))  # members still waiting on a peer stop at once
            for _ in it:  # keep the other learner ranks' collective gathers in step
                pass
            metrics.update({mc.SYNC_SECONDS: time.monotonic() - started, mc.SYNC_FAILURES: float(self.failures)})
        self.last = metrics
        return metrics

    def needs_refresh(self) -> bool:
        """Rank 0: should the current version be re-published now (an actor announced itself, or a transfer broke)?

        The learner asks this while it waits for rollouts: a new or restarted actor holds only the initial weights
        and cannot start work the staleness bound forbids until it receives the current ones.
        """
        if self.coordinator is None or self.ctx.rank != 0:
            return False
        eligible = self._eligible()
        broken = self.group is not None and self.group.broken
        return any(actor not in self.members for actor in eligible) or (broken and bool(eligible))

    def _close_group(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None
            self.sender = None

    def close(self) -> None:
        self._close_group()
