"""The exactly-once prompt ledger: every prompt id the coordinator ever handed out, and where it is now.

Each prompt id below the data cursor is in exactly one state:

    LEASED    granted to an actor under a lease (lease id, actor, deadline)
    REGRANT   its lease expired or was revoked, or its group failed validation; waits in the re-grant queue,
              served before new data
    RECEIVED  its group arrived and waits in the buffer
    TAKEN     handed to the learner by get_groups, not yet marked trained
    DONE      trained; filtered (its group arrived fine but carries no training signal, transport.filtering: it
              is settled for good, never trained and never granted again); or dropped for good (stale with
              stale_policy="drop", or too large to ever send)

Deliveries are judged by (prompt id, lease id): the current lease -> accept; an expired lease whose prompt sits in
the re-grant queue, not yet re-granted -> accept too ("late": the work is valid and nobody else is doing it); any
other lease of a known prompt, or a prompt already received/trained -> duplicate; ids never issued -> unknown. So a
group is trained at most once and a granted prompt is never lost while the ledger lives: every id below the cursor
is leased, queued for re-grant, received, taken, or DONE, and DONE ids are counted as ``trained_total +
filtered_total + dropped_total`` (exactly, for a ledger started at id 0). `state_dict` turns the
ledger into plain data (outstanding leases folded into the re-grant queue) so a resumed run neither repeats nor
skips a prompt. Pure logic: no sockets, no threads, no clocks (callers pass ``now``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from async_rl.staleness import within_bound
from async_rl.transport.codec import WireCodec
from async_rl.transport.protocol import RolloutGroup

Verdict = Literal["ok", "late", "duplicate", "unknown"]
STATE_FORMAT = 1
NO_LEASE = 0  # lease ids start at 1, so 0 in the re-grant queue means "no late delivery may be accepted"


@dataclass
class Lease:
    lease_id: int
    prompt_id: int
    actor_id: str
    deadline: float
    min_version: int = 0  # the oldest policy the grant allows its group to start under (set when it is sent)


@dataclass
class Buffered:
    group: RolloutGroup
    nbytes: int
    seq: int
    version: int = -1  # the group's generation version, computed once

    def __post_init__(self) -> None:
        if self.version < 0:
            self.version = self.group.version


class Ledger:
    """State machine over prompt ids; ``total`` is the number of prompt ids the data can produce (None: unbounded)."""

    def __init__(self, total: int | None = None) -> None:
        self.total = total
        self.next_prompt_id = 0
        self.next_lease_id = 1
        self.leases: dict[int, Lease] = {}
        self.regrant: OrderedDict[int, int] = OrderedDict()  # prompt id -> lease id a late delivery may still use
        self.received: dict[int, Buffered] = {}
        self.taken: dict[int, Buffered] = {}
        self.done_low = 0  # every prompt id < done_low is DONE
        self.done_above: set[int] = set()
        self.trained_total = 0
        self.filtered_total = 0
        self.dropped_total = 0
        self._seq = 0

    # ---- queries -------------------------------------------------------------------------------------------------
    @property
    def exhausted(self) -> bool:
        """No new data left (the re-grant queue may still hold prompts)."""
        return self.total is not None and self.next_prompt_id >= self.total

    @property
    def finished(self) -> bool:
        """Every prompt the data can produce is DONE."""
        return self.exhausted and self.done_low >= self.next_prompt_id

    @property
    def in_flight(self) -> int:
        """Groups counted by admission control: leased + buffered (received or taken, not yet trained)."""
        return len(self.leases) + len(self.received) + len(self.taken)

    @property
    def grants_settled(self) -> int:
        """Leases ever issued whose outcome is known: all of them but those still out and those of groups buffered
        (received or taken) and not yet trained; each prompt trained, filtered or dropped used at least one."""
        return self.next_lease_id - 1 - len(self.leases) - len(self.received) - len(self.taken)

    def is_done(self, prompt_id: int) -> bool:
        return prompt_id < self.done_low or prompt_id in self.done_above

    def actor_leases(self, actor_id: str) -> list[Lease]:
        return [lease for lease in self.leases.values() if lease.actor_id == actor_id]

    # ---- granting ------------------------------------------------------------------------------------------------
    def grant(self, actor_id: str, count: int, deadline: float) -> list[Lease]:
        """Lease up to ``count`` prompts: the re-grant queue first, then new data."""
        out: list[Lease] = []
        while len(out) < count:
            if self.regrant:
                prompt_id, _ = self.regrant.popitem(last=False)
            elif not self.exhausted:
                prompt_id = self.next_prompt_id
                self.next_prompt_id += 1
            else:
                break
            lease = Lease(self.next_lease_id, prompt_id, actor_id, deadline)
            self.next_lease_id += 1
            self.leases[prompt_id] = lease
            out.append(lease)
        return out

    def revoke(self, leases: Iterable[Lease]) -> None:
        """Undo grants that were never delivered to the actor: back to the FRONT of the queue, in order."""
        for lease in reversed(list(leases)):
            current = self.leases.get(lease.prompt_id)
            assert current is not None and current.lease_id == lease.lease_id, "revoking a lease that is not current"
            del self.leases[lease.prompt_id]
            self.regrant[lease.prompt_id] = NO_LEASE
            self.regrant.move_to_end(lease.prompt_id, last=False)

    def expire_due(self, now: float) -> list[Lease]:
        """Expire every lease whose deadline has passed; their prompts join the re-grant queue."""
        return self._expire([lease for lease in self.leases.values() if lease.deadline <= now])

    def expire_actor(self, actor_id: str) -> list[Lease]:
        """Expire all leases of an actor presumed dead (or restarted)."""
        return self._expire(self.actor_leases(actor_id))

    def _expire(self, leases: list[Lease]) -> list[Lease]:
        for lease in sorted(leases, key=lambda x: x.prompt_id):
            del self.leases[lease.prompt_id]
            self.regrant[lease.prompt_id] = lease.lease_id
        return leases

    # ---- deliveries ----------------------------------------------------------------------------------------------
    def check_delivery(self, prompt_id: int, lease_id: int) -> Verdict:
        if prompt_id >= self.next_prompt_id or lease_id >= self.next_lease_id:
            return "unknown"
        if self.is_done(prompt_id) or prompt_id in self.received or prompt_id in self.taken:
            return "duplicate"
        lease = self.leases.get(prompt_id)
        if lease is not None:
            return "ok" if lease.lease_id == lease_id else "duplicate"
        expired = self.regrant.get(prompt_id)
        assert expired is not None, f"prompt {prompt_id} is in no ledger state"
        return "late" if expired == lease_id else "duplicate"

    def _settle(self, prompt_id: int) -> None:
        """Remove a prompt from LEASED or REGRANT (after check_delivery said ok/late)."""
        if self.leases.pop(prompt_id, None) is None:
            del self.regrant[prompt_id]

    def accept(self, group: RolloutGroup, nbytes: int, version: int = -1) -> None:
        self._settle(group.prompt_id)
        self.received[group.prompt_id] = Buffered(group, nbytes, self._seq, version)
        self._seq += 1

    def filter(self, prompt_id: int) -> None:
        """A delivery (ok/late) that is valid but carries no training signal: DONE as filtered, never trained and
        never granted again (the data cursor moves on to other prompts)."""
        self._settle(prompt_id)
        self._mark_done(prompt_id)
        self.filtered_total += 1

    def reject_stale(self, prompt_id: int, regrant: bool) -> None:
        """A delivery (ok/late) that is already over the staleness bound: re-grant its prompt or drop it for good."""
        self._settle(prompt_id)
        self._requeue_or_drop(prompt_id, regrant)

    def reject_invalid(self, prompt_id: int) -> None:
        """A delivery (ok/late) that failed validation: the prompt is fine, the actor was not; grant it again."""
        self._settle(prompt_id)
        self.regrant[prompt_id] = NO_LEASE

    def drop_leased(self, prompt_id: int) -> None:
        """A leased prompt that can never be served (its grant cannot fit in a message): DONE as dropped."""
        del self.leases[prompt_id]
        self._mark_done(prompt_id)
        self.dropped_total += 1

    def _requeue_or_drop(self, prompt_id: int, regrant: bool) -> None:
        if regrant:
            self.regrant[prompt_id] = NO_LEASE
        else:
            self._mark_done(prompt_id)
            self.dropped_total += 1

    # ---- the learner side ----------------------------------------------------------------------------------------
    def purge_stale(self, current_version: int, max_staleness: int, regrant: bool) -> list[RolloutGroup]:
        """Remove buffered groups over the bound at ``current_version``; re-grant or drop their prompts."""
        stale = [b.group for b in self.received.values() if not within_bound(current_version, b.version, max_staleness)]
        for group in stale:
            del self.received[group.prompt_id]
            self._requeue_or_drop(group.prompt_id, regrant)
        return stale

    def take(self, count: int) -> list[Buffered]:
        """Hand up to ``count`` buffered groups to the learner, oldest generation version first, then arrival."""
        chosen = sorted(self.received.values(), key=lambda b: (b.version, b.seq))[:count]
        for buf in chosen:
            del self.received[buf.group.prompt_id]
            self.taken[buf.group.prompt_id] = buf
        return chosen

    def mark_trained(self, prompt_ids: Iterable[int]) -> list[Buffered]:
        ids = list(prompt_ids)
        missing = [pid for pid in ids if pid not in self.taken]
        if missing or len(set(ids)) != len(ids):
            raise ValueError(f"prompt_ids {missing or ids} were not handed out by get_groups (or repeat)")
        out = []
        for pid in ids:
            out.append(self.taken.pop(pid))
            self._mark_done(pid)
        self.trained_total += len(ids)
        return out

    def _mark_done(self, prompt_id: int) -> None:
        self.done_above.add(prompt_id)
        while self.done_low in self.done_above:
            self.done_above.remove(self.done_low)
            self.done_low += 1

    # ---- persistence ---------------------------------------------------------------------------------------------
    def state_dict(self, codec: WireCodec) -> dict[str, Any]:
        """Plain data only (ints, lists, bytes). Outstanding leases become re-grant entries; taken becomes received."""
        regrant = list(self.regrant.items()) + sorted((p, lease.lease_id) for p, lease in self.leases.items())
        buffered = sorted(list(self.received.values()) + list(self.taken.values()), key=lambda b: b.seq)
        return {
            "format": STATE_FORMAT,
            "total": self.total,
            "next_prompt_id": self.next_prompt_id,
            "next_lease_id": self.next_lease_id,
            "regrant": [[p, lease_id] for p, lease_id in regrant],
            "buffered": [codec.encode(b.group) for b in buffered],
            "done_low": self.done_low,
            "done_above": sorted(self.done_above),
            "trained_total": self.trained_total,
            "filtered_total": self.filtered_total,
            "dropped_total": self.dropped_total,
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any], codec: WireCodec) -> Ledger:
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ValueError(f"ledger state must be a dict with format={STATE_FORMAT}")
        try:
            ledger = cls(state["total"])
            ledger.next_prompt_id = int(state["next_prompt_id"])
            ledger.next_lease_id = int(state["next_lease_id"])
            for p, lease_id in state["regrant"]:
                ledger.regrant[int(p)] = int(lease_id)
            for raw in state["buffered"]:
                group = codec.decode(raw)
                if not isinstance(group, RolloutGroup):
                    raise ValueError(f"buffered entry is a {type(group).__name__}, not a RolloutGroup")
                ledger.received[group.prompt_id] = Buffered(group, len(raw), ledger._seq)
                ledger._seq += 1
            ledger.done_low = int(state["done_low"])
            ledger.done_above = {int(p) for p in state["done_above"]}
            ledger.trained_total = int(state["trained_total"])
            ledger.dropped_total = int(state["dropped_total"])
            ledger.filtered_total = int(state.get("filtered_total", 0))  # absent in states saved before filtering
        except (KeyError, TypeError) as exc:
            raise ValueError(f"ledger state is missing or has a bad key: {exc!r}") from None
        ledger.check_invariants()
        return ledger

    def check_invariants(self) -> None:
        """Every prompt id below the cursor is in exactly one state and every DONE one is counted as trained,
        filtered or dropped, else ValueError (used on restore, in tests)."""
        states = [set(self.leases), set(self.regrant), set(self.received), set(self.taken), self.done_above]
        seen: set[int] = set()
        for s in states:
            if seen & s:
                raise ValueError(f"prompt ids in two ledger states: {sorted(seen & s)[:10]}")
            seen |= s
        if any(p < self.done_low or p >= self.next_prompt_id for p in seen):
            raise ValueError("ledger holds prompt ids outside [done_low, next_prompt_id)")
        if len(seen) != self.next_prompt_id - self.done_low:
            raise ValueError(
                f"ledger lost track of {self.next_prompt_id - self.done_low - len(seen)} prompt id(s) "
                f"between done_low={self.done_low} and next_prompt_id={self.next_prompt_id}"
            )
        done = self.done_low + len(self.done_above)
        settled = self.trained_total + self.filtered_total + self.dropped_total
        if done != settled:
            raise ValueError(
                f"{done} prompt ids are DONE but trained_total={self.trained_total} + filtered_total="
                f"{self.filtered_total} + dropped_total={self.dropped_total} = {settled}"
            )
