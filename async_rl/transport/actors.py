"""The coordinator's view of its actors: identity, liveness, loaded policy version and outstanding credit.

Credit accounting: a WorkRequest says "I can take ``max_groups`` more, having seen ``grants_seen`` granted prompts".
Prompts granted but not yet seen by the actor are in transit, so the credit is
``max_groups - (granted_total - grants_seen)``. Re-sending the same request is therefore idempotent and never
over-grants. Both counters restart at a (re)Welcome.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

_TRUSTED = 2**62  # a confirmed version no claim exceeds


@dataclass
class ActorState:
    actor_id: str
    rid: bytes  # zmq routing id (the actor id in ASCII)
    claimed_version: int  # what the actor says it has loaded (hello, work requests, heartbeats)
    last_seen: float
    last_heartbeat_sent: float
    alive: bool = True
    credit: int = 0
    granted_total: int = 0
    died_at: float | None = None
    reported: dict[str, float] = field(default_factory=dict)  # the last cumulative counters the actor reported
    confirmed_version: int = _TRUSTED  # the newest version the learner sent this actor (the registry sets the base)

    @property
    def loaded_version(self) -> int:
        """The version grants may assume: the actor's claim, never beyond the weights it was actually sent."""
        return min(self.claimed_version, self.confirmed_version)

    @loaded_version.setter
    def loaded_version(self, version: int) -> None:
        self.claimed_version = version

    def set_credit(self, max_groups: int, grants_seen: int) -> None:
        in_transit = max(0, self.granted_total - grants_seen)
        self.credit = max(0, max_groups - in_transit)


@dataclass(frozen=True)
class ActorStatus:
    """Read-only snapshot for callers (Coordinator.actors())."""

    alive: bool
    loaded_version: int
    leases: int
    credit: int
    seconds_since_seen: float


class ActorRegistry:
    """Bounded map of actor id -> state; dead entries are forgotten after ``forget_after_s``."""

    def __init__(self, max_actors: int, peer_timeout_s: float, base_version: int | None = 0) -> None:
        self.max_actors = max_actors
        self.peer_timeout_s = peer_timeout_s
        # Every actor starts from these weights without any transfer; None: every claim is trusted (no weight sync).
        self.base_version = _TRUSTED if base_version is None else base_version
        self.forget_after_s = 10 * peer_timeout_s
        self._actors: OrderedDict[str, ActorState] = OrderedDict()
        self._rr = 0

    def __len__(self) -> int:
        return len(self._actors)

    def get(self, actor_id: str) -> ActorState | None:
        return self._actors.get(actor_id)

    def items(self) -> Iterator[tuple[str, ActorState]]:
        return iter(list(self._actors.items()))

    def register(self, actor_id: str, loaded_version: int, now: float) -> ActorState | None:
        """(Re)register as alive with fresh credit counters; None when the registry is full of live actors."""
        state = self._actors.get(actor_id)
        if state is None:
            if len(self._actors) >= self.max_actors:
                self.forget_dead(now, force=True)
            if len(self._actors) >= self.max_actors:
                return None
            state = ActorState(actor_id, actor_id.encode("ascii"), loaded_version, now, now)
            state.confirmed_version = self.base_version
            self._actors[actor_id] = state
        state.alive, state.died_at = True, None
        state.loaded_version = loaded_version
        state.last_seen = now
        state.last_heartbeat_sent = -math.inf  # a heartbeat at the next pass: the learner's state, told at once
        state.credit = 0
        state.granted_total = 0
        state.reported = {}  # a restarted actor counts from zero again
        return state

    def newly_dead(self, now: float) -> list[ActorState]:
        """Mark actors silent for longer than peer_timeout_s as dead and return them."""
        dead = []
        for state in self._actors.values():
            if state.alive and now - state.last_seen > self.peer_timeout_s:
                state.alive, state.died_at, state.credit = False, now, 0
                dead.append(state)
        return dead

    def mark_gone(self, state: ActorState, now: float) -> None:
        state.alive, state.died_at, state.credit = False, now, 0

    def forget_dead(self, now: float, force: bool = False) -> None:
        for actor_id, state in list(self._actors.items()):
            if not state.alive and (force or (state.died_at is not None and now - state.died_at > self.forget_after_s)):
                del self._actors[actor_id]

    def alive(self) -> list[ActorState]:
        return [s for s in self._actors.values() if s.alive]

    def round_robin(self) -> list[ActorState]:
        """Live actors, starting one further along each call so that grants are spread fairly."""
        live = self.alive()
        if not live:
            return live
        self._rr = (self._rr + 1) % len(live)
        return live[self._rr :] + live[: self._rr]
