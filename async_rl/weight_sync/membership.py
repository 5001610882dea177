"""Who is in a weight-sync epoch: candidacy, readiness and the roster, agreed through learner rank 0's TCPStore.

A gloo/NCCL group has a fixed size and its rendezvous blocks until every member arrives, so a member that never
arrives (a client that said hello and went silent, an actor that died after its hello, a frozen process) used to hold
the learner for the whole group timeout. Membership is therefore settled *before* the collective group forms, with
deadlines, in three steps:

1. **Candidacy.** An actor that wants weights writes ``candidate/<actor id>`` (a token that changes with every
   announcement) once its engine is up. Rank 0 only ever invites live actors that did, so a client that never gets
   that far costs nothing.
2. **Readiness.** Rank 0 announces epoch ``e`` with its invited actors (on the rollout plane's VersionUpdate). Each
   invited actor writes ``e/ready/<actor id>`` (its value: the dtype the engine serves, or empty when it has no
   model) and waits for the roster. Rank 0 waits at most ``join_timeout_s`` (a few heartbeats) for the ready keys.
3. **Roster.** Rank 0 writes ``e/roster``: the actors that were ready, with their ranks 1..N (and served dtypes).
   Only they form the group, so its rendezvous never waits on an absent member. An invited actor left out of the
   roster learns so at once (:class:`LeftOut`), keeps its current weights, and announces itself again; rank 0
   invites it again only after such a fresh announcement, never in a loop on a silent one.

Everything here is plain store traffic (no collective), so each step is bounded by its own timeout.

What an engine needs to join is one :class:`JoinInfo`: the learner's plan (``transport.protocol.WeightSyncPlan``,
as the actor received it) and the engine's place in it. It is also the ``init_info`` of vLLM's
``init_weight_transfer_engine``: it crosses into the vLLM workers as builtins and is decoded back there.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from datetime import timedelta

import msgspec
import torch
import torch.distributed as dist

from async_rl.transport.protocol import ActorId, WeightSyncPlan
from async_rl.weight_sync.errors import WeightSyncError, WeightSyncTimeout
from async_rl.weight_sync.group import WeightSyncGroup, create_store
from async_rl.weight_sync.protocol import dtype_name

__all__ = [
    "JoinInfo",
    "LeftOut",
    "Roster",
    "announce",
    "announce_at",
    "await_roster",
    "collect_roster",
    "join_epoch",
    "read_candidates",
]

_ROOT = "async_rl/weight_sync/membership"


class LeftOut(WeightSyncError):
    """This actor was invited to an epoch but was not ready in time: it is not in the roster (announce again)."""


class Roster(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The members of one epoch, their ranks (1..N; rank 0 is the learner) and the dtype each one's engine serves
    (a wire name such as ``"bfloat16"``; ``""``: not said, an actor without a model)."""

    epoch: int
    ranks: dict[str, int]
    served: dict[str, str] = {}

    @property
    def world_size(self) -> int:
        return len(self.ranks) + 1

    @property
    def members(self) -> list[str]:
        return sorted(self.ranks, key=self.ranks.__getitem__)

    def encode(self) -> bytes:
        return msgspec.json.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> Roster:
        return msgspec.json.decode(data, type=cls)


class JoinInfo(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """How one engine joins the group of ``plan.epoch``: the learner's plan and this engine's place in the group.

    ``member`` (the actor's id; how actors always join): the rank and world size come from the epoch's roster.
    Without it, a fixed group of ``world_size`` with this engine at rank ``rank_offset`` (tests and benchmarks,
    where the learner stand-in builds no roster). Checked when built and when decoded.
    """

    plan: WeightSyncPlan
    member: ActorId | None = None
    world_size: int | None = None
    rank_offset: int | None = None

    def __post_init__(self) -> None:
        if self.plan.epoch < 0:
            raise ValueError(f"plan.epoch must be >= 0 to join, got {self.plan.epoch}")
        if self.member is not None:
            if self.world_size is not None or self.rank_offset is not None:
                raise ValueError("give either member (the roster decides the ranks) or world_size and rank_offset")
        elif self.world_size is None or self.rank_offset is None:
            raise ValueError("give member (an actor id) or both world_size and rank_offset")
        elif self.world_size < 2:
            raise ValueError(f"world_size must be >= 2, got {self.world_size}")
        elif not 1 <= self.rank_offset < self.world_size:
            raise ValueError(f"rank_offset must be in [1, {self.world_size}), got {self.rank_offset}")


def _candidate_key(member: str) -> str:
    return f"{_ROOT}/candidate/{member}"


def _ready_key(epoch: int, member: str) -> str:
    return f"{_ROOT}/{epoch}/ready/{member}"


def _roster_key(epoch: int) -> str:
    return f"{_ROOT}/{epoch}/roster"


def announce(store: dist.Store, member: str, token: str) -> None:
    """Actor: declare that ``member`` can receive weights now. ``token`` must change with every announcement."""
    store.set(_candidate_key(member), token)


def read_candidates(store: dist.Store, members: Iterable[str]) -> dict[str, str]:
    """Rank 0: the current announcement token of each of ``members`` that has announced itself (non-blocking)."""
    out: dict[str, str] = {}
    for member in members:
        key = _candidate_key(member)
        if store.check([key]):
            out[member] = store.get(key).decode()
    return out


def collect_roster(
    store: dist.Store,
    epoch: int,
    invited: Iterable[str],
    join_timeout_s: float,
    *,
    alive: Callable[[], Iterable[str]] | None = None,
    poll_s: float = 0.02,
) -> Roster:
    """Rank 0: wait up to ``join_timeout_s`` for the invited actors' ready keys, then publish and return the roster.
    An invited actor not ready yet that ``alive()`` (the actors the coordinator still hears from) no longer names is
    not waited for: it died after its invitation, and would only have held the epoch for the whole timeout."""
    waiting = sorted(set(invited))
    ready: dict[str, str] = {}
    deadline = time.monotonic() + join_timeout_s
    while waiting:
        live = set(alive()) if alive is not None else None
        for member in list(waiting):
            key = _ready_key(epoch, member)
            if store.check([key]):
                waiting.remove(member)
                ready[member] = store.get(key).decode()
            elif live is not None and member not in live:
                waiting.remove(member)
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(poll_s)
    members = sorted(ready)
    roster = Roster(epoch, {m: i + 1 for i, m in enumerate(members)}, served={m: ready[m] for m in members})
    store.set(_roster_key(epoch), roster.encode().decode())
    return roster


def await_roster(store: dist.Store, epoch: int, member: str, timeout_s: float, *, served: str = "") -> Roster:
    """Actor: say ``member`` is ready for ``epoch`` (serving dtype ``served``, a wire name; ``""`` for an actor
    without a model) and wait for the roster. Raises :class:`LeftOut` if not in it,
    and at once when the roster was published before this call: whatever it says of ``member`` is about another
    process (a restarted actor's killed one, under the same id), whose group this one must not try to join."""
    if store.check([_roster_key(epoch)]):
        raise LeftOut(
            f"weight-sync epoch {epoch} was formed before actor {member} was ready; it announces itself again"
        )
    store.set(_ready_key(epoch, member), served)
    try:
        store.wait([_roster_key(epoch)], timedelta(seconds=timeout_s))
    except RuntimeError as exc:  # DistStoreError: the learner never published this epoch's roster
        raise WeightSyncTimeout(f"no roster for weight-sync epoch {epoch} within {timeout_s:.1f} s: {exc}") from exc
    roster = Roster.decode(store.get(_roster_key(epoch)))
    if member not in roster.ranks:
        raise LeftOut(f"actor {member} was not ready in time for weight-sync epoch {epoch}; it announces itself again")
    return roster


def announce_at(host: str, port: int, member: str, token: str, *, timeout_s: float) -> None:
    """Actor process: connect to rank 0's store and :func:`announce` (no collective, bounded by ``timeout_s``)."""
    announce(create_store(host, port, is_master=False, timeout_s=timeout_s), member, token)


def roster_wait_s(join_timeout_s: float) -> float:
    """How long an invited actor waits for the roster: rank 0 publishes it at most ``join_timeout_s`` after inviting."""
    return 2.0 * join_timeout_s + 5.0


def join_epoch(info: JoinInfo, *, local_rank: int = 0, served: torch.dtype | None = None) -> WeightSyncGroup:
    """Actor worker: join the group ``info`` describes (through the roster handshake above when it names a member).

    ``local_rank`` is this worker's index inside its engine (tensor parallelism); ``served`` the dtype its model's
    weights are held in (the learner then sends them in that dtype when every member agrees; None: no model).
    """
    plan = info.plan
    store = create_store(plan.host, plan.port, is_master=False, timeout_s=plan.timeout_s)
    if info.member is not None:
        said = dtype_name(served) if served is not None else ""
        roster = await_roster(store, plan.epoch, info.member, roster_wait_s(plan.join_timeout_s), served=said)
        rank, world_size = roster.ranks[info.member] + local_rank, roster.world_size
    else:
        assert info.rank_offset is not None and info.world_size is not None  # JoinInfo.__post_init__
        rank, world_size = info.rank_offset + local_rank, info.world_size
    return WeightSyncGroup(
        store, rank=rank, world_size=world_size, epoch=plan.epoch, backend=plan.backend, timeout_s=plan.timeout_s
    )
