"""Validation rounds on the rollout plane: a fixed prompt set generated under exactly one policy version.

The learner starts a round through ``Coordinator.start_eval`` right after version v was published. The coordinator
leases the round's prompts to actors whose loaded weights are exactly v: an eval grant carries ``eval_round`` and
``min_version = v``, and the actor starts it only while its engine is on v. Each prompt *index* moves through

    PENDING --grant--> LEASED --delivered, every completion at exactly v--> DONE
       ^                 |
       +-----------------+  the lease expired (actor dead, left or rejoined; lease timeout; the actor moved past v),
                            was never sent (revoked), came back under another version (a weight update during
                            the request) or failed validation (transport.validation): the index is granted again

Deliveries are judged by (index, lease id): a lease this round issued for that index, on an index not yet done ->
"accepted" when every completion ran under exactly v (an expired lease's result is valid work and is accepted too),
otherwise "stale" (wrong version: the index is granted again if that lease was still current); an index already done
-> "duplicate"; anything else -> "unknown".

Kept apart from training: eval leases have their own ids and never enter the ledger, do not count against admission
or the staleness bound, and eval groups never reach ``get_groups``. Pure logic: no sockets, threads or clocks
(callers pass ``now``).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import msgspec

from async_rl.transport.actors import ActorState
from async_rl.transport.prompts import PromptRecord
from async_rl.transport.protocol import Completion, GroupSampling, PromptGrant, group_seed, pack_array

EvalVerdict = Literal["accepted", "duplicate", "stale", "unknown"]


@dataclass
class EvalLease:
    lease_id: int
    index: int  # position in the round's records (travels as the grant's prompt_id)
    actor_id: str
    deadline: float


@dataclass(frozen=True)
class EvalResult:
    """What a round produced: the completions of every index that finished, by index."""

    round_id: int
    version: int
    num_prompts: int
    completions: dict[int, list[Completion]]
    started_at: float
    finished_at: float | None  # when the last index finished; None when the round was closed before that
    closed_at: float
    counters: dict[str, int]

    @property
    def complete(self) -> bool:
        return self.finished_at is not None

    @property
    def wall_s(self) -> float:
        """Seconds from the start to the last result (to the close, for a round closed before it finished)."""
        end = self.finished_at if self.finished_at is not None else self.closed_at
        return end - self.started_at


class EvalRound:
    """One validation round: ``records`` generated with ``sampling`` under exactly policy ``version``."""

    def __init__(
        self, round_id: int, version: int, records: Sequence[PromptRecord], sampling: GroupSampling, now: float
    ) -> None:
        if round_id < 0 or version < 0:
            raise ValueError(f"round_id and version must be >= 0, got {round_id}, {version}")
        if len(records) == 0:
            raise ValueError("an eval round needs at least one prompt record")
        self.round_id = round_id
        self.version = version
        self.records = records
        self.sampling = sampling
        self.started_at = now
        self.finished_at: float | None = None
        self.closed = False
        self.pending: deque[int] = deque(range(len(records)))
        self.leases: dict[int, EvalLease] = {}  # index -> its current lease
        self.done: dict[int, list[Completion]] = {}
        self.dropped: set[int] = set()  # indices that can never be served (their grant cannot fit in a message)
        self.counters: Counter[str] = Counter()
        self._lease_index: dict[int, int] = {}  # every lease id issued -> its index
        self._next_lease_id = 1

    # ---- queries -------------------------------------------------------------------------------------------------
    @property
    def complete(self) -> bool:
        return self.open_count == 0

    @property
    def open_count(self) -> int:
        """Indices not finished yet (pending or leased)."""
        return len(self.records) - len(self.done) - len(self.dropped)

    def actor_leases(self, actor_id: str) -> list[EvalLease]:
        return [lease for lease in self.leases.values() if lease.actor_id == actor_id]

    # ---- granting ------------------------------------------------------------------------------------------------
    def grant(self, actor_id: str, count: int, deadline: float) -> list[EvalLease]:
        """Lease up to ``count`` pending indices to ``actor_id`` (nothing once the round is closed)."""
        out: list[EvalLease] = []
        while self.pending and len(out) < count and not self.closed:
            index = self.pending.popleft()
            lease = EvalLease(self._next_lease_id, index, actor_id, deadline)
            self._next_lease_id += 1
            self._lease_index[lease.lease_id] = index
            self.leases[index] = lease
            out.append(lease)
        self.counters["grants"] += len(out)
        return out

    def serve(
        self, actors: Iterable[ActorState], max_per_grant: int, deadline: float
    ) -> list[tuple[ActorState, list[EvalLease]]]:
        """Lease pending indices to the live ``actors`` whose loaded version is exactly the round's, each within its
        credit (which is spent, and its granted count raised, as for training grants)."""
        out: list[tuple[ActorState, list[EvalLease]]] = []
        for state in actors:
            if not self.pending:
                break
            if state.credit <= 0 or state.loaded_version != self.version:
                continue
            leases = self.grant(state.actor_id, min(state.credit, max_per_grant), deadline)
            state.credit -= len(leases)
            state.granted_total += len(leases)
            out.append((state, leases))
        return out

    def revoke(self, leases: Iterable[EvalLease]) -> None:
        """Grants that never reached the actor: back to the front of the pending queue, in order."""
        for lease in reversed(list(leases)):
            if self.leases.get(lease.index) is lease:
                del self.leases[lease.index]
                self.pending.appendleft(lease.index)

    def drop(self, index: int) -> None:
        """An index whose grant can never be sent: it is given up (counted) so the round can still finish."""
        self.leases.pop(index, None)
        if index in self.pending:
            self.pending.remove(index)
        if index not in self.done:
            self.dropped.add(index)
            self.counters["oversize"] += 1

    def expire_actor(self, actor_id: str) -> list[EvalLease]:
        """Every lease of an actor that died, left, rejoined or moved past the pinned version."""
        return self._expire(self.actor_leases(actor_id))

    def expire_due(self, now: float) -> list[EvalLease]:
        return self._expire([lease for lease in self.leases.values() if lease.deadline <= now])

    def _expire(self, leases: list[EvalLease]) -> list[EvalLease]:
        for lease in sorted(leases, key=lambda x: x.index):
            del self.leases[lease.index]
            self.pending.append(lease.index)
        self.counters["lease_expiries"] += len(leases)
        return leases

    def prompt_grant(self, lease: EvalLease) -> PromptGrant:
        """The wire grant of a lease, pinned to the round's version. A seeded prompt gets its own block of seeds
        (:func:`group_seed`, stream 1), the same in every round, so rounds differ only by the weights."""
        record = self.records[lease.index]
        sampling = self.sampling
        if sampling.seed is not None:
            sampling = msgspec.structs.replace(sampling, seed=group_seed(sampling.seed, lease.index, sampling.n, 1))
        return PromptGrant(
            prompt_id=lease.index,
            lease_id=lease.lease_id,
            min_version=self.version,
            prompt_token_ids=pack_array(record.token_ids, "<i4"),
            sampling=sampling,
            extras=dict(record.extras),
            eval_round=self.round_id,
        )

    # ---- deliveries ----------------------------------------------------------------------------------------------
    def deliver(self, index: int, lease_id: int, completions: Sequence[Completion], now: float) -> EvalVerdict:
        """Judge one delivered group (see the module docstring) and record it when accepted."""
        if self.closed or self._lease_index.get(lease_id) != index:
            self.counters["unknown"] += 1
            return "unknown"
        if index in self.done or index in self.dropped:
            self.counters["duplicates"] += 1
            return "duplicate"
        if len(completions) != self.sampling.n:
            self.counters["unknown"] += 1
            return "unknown"
        current = self.leases.get(index)
        if any(c.version_min != self.version or c.version_max != self.version for c in completions):
            self.counters["wrong_version"] += 1
            if current is not None and current.lease_id == lease_id:
                del self.leases[index]
                self.pending.appendleft(index)
            return "stale"
        if current is not None:
            del self.leases[index]
        elif index in self.pending:
            self.pending.remove(index)  # an expired lease's work arrived before anyone else was granted it
        self.done[index] = list(completions)
        self.counters["accepted"] += 1
        if self.complete and self.finished_at is None:
            self.finished_at = now
        return "accepted"

    def reject(self, index: int, lease_id: int) -> bool:
        """A delivery that failed validation: True when `deliver` would have judged it (not unknown or a duplicate);
        the index is then granted again if that lease was still current."""
        if self.closed or self._lease_index.get(lease_id) != index or index in self.done or index in self.dropped:
            return False
        current = self.leases.get(index)
        if current is not None and current.lease_id == lease_id:
            del self.leases[index]
            self.pending.appendleft(index)
        self.counters["invalid"] += 1
        return True

    # ---- the learner side ----------------------------------------------------------------------------------------
    def close(self, now: float) -> EvalResult:
        """Stop granting and accepting; returns what finished (all of it when the round is complete)."""
        self.closed = True
        self.pending.clear()
        self.leases.clear()
        return EvalResult(
            round_id=self.round_id,
            version=self.version,
            num_prompts=len(self.records),
            completions=dict(self.done),
            started_at=self.started_at,
            finished_at=self.finished_at,
            closed_at=now,
            counters=dict(self.counters),
        )


__all__ = ["EvalLease", "EvalResult", "EvalRound", "EvalVerdict"]
