"""Counters, histograms, rates and a rate-limited bad-message log for the rollout plane.

Everything here is plain Python state mutated by the owner under its own lock; `TransportMetrics.snapshot` turns it
into the flat ``{"transport/...": number}`` dict the learner logs. The keys and their meanings are the
``transport/...`` entries of the metric catalog (async_rl/metric_catalog.py), and the keys are taken from there.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter, OrderedDict

from async_rl import metric_catalog as mc
from async_rl.metric_catalog import histogram_mean
from async_rl.transport.validation import INVALID_REASONS

logger = logging.getLogger(__name__)

# Cumulative counters an actor reports on its periodic Heartbeat (under these names): tokens generated, seconds with
# nothing to generate, seconds since it started, served-adapter checks, lent-core switches, the learned reward
# model's requests and faults. The coordinator sums their growth over all
# actors into the metric each maps to.
ACTOR_REPORT_TOTALS = {
    "generated_tokens": mc.TRANSPORT_ACTORS_GENERATED_TOKENS_TOTAL,
    "idle_s": mc.TRANSPORT_ACTORS_IDLE_S_TOTAL,
    "uptime_s": mc.TRANSPORT_ACTORS_UPTIME_S_TOTAL,
    "served_checks": mc.TRANSPORT_ACTORS_SERVED_CHECKS_TOTAL,
    "served_check_failures": mc.TRANSPORT_ACTORS_SERVED_CHECK_FAILURES_TOTAL,
    "lend_switches": mc.TRANSPORT_ACTORS_LEND_SWITCHES_TOTAL,
    "reward_model_requests": mc.TRANSPORT_ACTORS_REWARD_MODEL_REQUESTS_TOTAL,
    "reward_model_timeouts": mc.TRANSPORT_ACTORS_REWARD_MODEL_TIMEOUTS_TOTAL,
    "reward_model_deferred": mc.TRANSPORT_ACTORS_REWARD_MODEL_DEFERRED_TOTAL,
    "reward_model_given_up": mc.TRANSPORT_ACTORS_REWARD_MODEL_GIVEN_UP_TOTAL,
    "reward_model_refused": mc.TRANSPORT_ACTORS_REWARD_MODEL_REFUSED_TOTAL,
    "reward_model_seconds": mc.TRANSPORT_ACTORS_REWARD_MODEL_SECONDS_TOTAL,
}
ACTOR_REPORT_KEYS = tuple(ACTOR_REPORT_TOTALS)
# Validation rounds (transport.evaluation): rounds started, prompts granted, leases expired (actor dead, timeout, moved
# past the pinned version), and deliveries dropped as a duplicate, under a wrong version (granted again), for a round
# already closed (late) or unknown.
EVAL_COUNTERS = {
    "eval/rounds": mc.TRANSPORT_EVAL_ROUNDS,
    "eval/grants": mc.TRANSPORT_EVAL_GRANTS,
    "eval/lease_expiries": mc.TRANSPORT_EVAL_LEASE_EXPIRIES,
    "eval/duplicates": mc.TRANSPORT_EVAL_DUPLICATES,
    "eval/wrong_version": mc.TRANSPORT_EVAL_WRONG_VERSION,
    "eval/late": mc.TRANSPORT_EVAL_LATE,
    "eval/unknown": mc.TRANSPORT_EVAL_UNKNOWN,
}
# The coordinator's counters: the name `TransportMetrics.count` takes (and the coordinator's saved state holds) and
# the metric it is reported as; always, except those in COUNTED_ONLY, reported once counted.
COUNTERS = {
    "lease_expiries": mc.TRANSPORT_LEASE_EXPIRIES,
    "duplicates": mc.TRANSPORT_DUPLICATES,
    "late_accepted": mc.TRANSPORT_LATE_ACCEPTED,
    "unknown_groups": mc.TRANSPORT_UNKNOWN_GROUPS,
    "credit_waits": mc.TRANSPORT_CREDIT_WAITS,
    "trained": mc.TRANSPORT_TRAINED,
    "actors_presumed_dead": mc.TRANSPORT_ACTORS_PRESUMED_DEAD,
    **EVAL_COUNTERS,
    "rejected_actors": mc.TRANSPORT_REJECTED_ACTORS,
}
COUNTED_ONLY = frozenset({"rejected_actors"})
# Rollout groups refused by the coordinator (`TransportMetrics.drops`, by metric key, always reported): each reason of
# transport.validation as ``transport/drops/invalid_<reason>`` (its prompt is granted again), and ``quarantined``, a
# group from a sender quarantined after ``max_invalid_groups`` invalid ones. ``actors_quarantined`` counts those
# senders.
INVALID_DROPS = tuple(mc.transport_drops_invalid_reason_key(reason) for reason in INVALID_REASONS)
DECLARED_DROPS = (*INVALID_DROPS, mc.TRANSPORT_DROPS_QUARANTINED)
# Group filtering (DAPO dynamic sampling, transport.filtering) reports the gauges ``transport/filter/{filtered_groups,
# filtered_fraction, grants_per_trained_group, filtered_total}``, always (zero when off); filtering.py defines them.


class RateMeter:
    """Events per second between consecutive reads (the first read measures from construction)."""

    def __init__(self, now: float | None = None) -> None:
        self._last_t = time.monotonic() if now is None else now
        self._last_total = 0.0
        self.total = 0.0

    def add(self, amount: float = 1.0) -> None:
        self.total += amount

    def rate(self, now: float | None = None) -> float:
        t = time.monotonic() if now is None else now
        dt = t - self._last_t
        value = (self.total - self._last_total) / dt if dt > 0 else 0.0
        self._last_t, self._last_total = t, self.total
        return value


class BadMessageLog:
    """Counts bad messages by reason; logs at most one warning per sender per ``window_s``.

    Remembers at most ``max_senders`` senders (oldest forgotten first), so a flood of fake identities cannot grow it.
    """

    def __init__(self, what: str, window_s: float = 60.0, max_senders: int = 1024) -> None:
        self.what = what
        self.window_s = window_s
        self.max_senders = max_senders
        self.counts: Counter[str] = Counter()
        self._last_logged: OrderedDict[str, float] = OrderedDict()

    def record(self, sender: str, reason: str, detail: str, now: float | None = None) -> bool:
        """Count one bad message; returns True when this call logged it."""
        self.counts[reason] += 1
        t = time.monotonic() if now is None else now
        last = self._last_logged.get(sender)
        if last is not None and t - last < self.window_s:
            return False
        self._last_logged[sender] = t
        self._last_logged.move_to_end(sender)
        while len(self._last_logged) > self.max_senders:
            self._last_logged.popitem(last=False)
        logger.warning(
            "dropped bad %s from %s (%s: %s); further ones from this sender are only counted for %.0f s",
            self.what,
            sender,
            reason,
            detail[:200],
            self.window_s,
        )
        return True

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def tracked_senders(self) -> int:
        return len(self._last_logged)


class TransportMetrics:
    """The coordinator's metric state; `snapshot` reports it under the catalog's ``transport/...`` keys."""

    SPAN_BUCKETS = 8  # version_span/0..7 and version_span/8+

    def __init__(self, max_staleness: int) -> None:
        self.max_staleness = max_staleness
        self.counters: Counter[str] = Counter()  # by COUNTERS name
        self.drops: Counter[str] = Counter()  # by metric key (transport/drops/...)
        self.staleness: Counter[int] = Counter()
        self.version_span: Counter[int] = Counter()
        self.grants = RateMeter()
        self.groups = RateMeter()
        self.bytes = RateMeter()
        self.actor_totals: dict[str, float] = dict.fromkeys(ACTOR_REPORT_KEYS, 0.0)

    def record_actor_report(self, previous: dict[str, float], report: dict[str, float]) -> None:
        """Add what an actor's cumulative counters grew by since its previous report (a drop means it restarted)."""
        for key in ACTOR_REPORT_KEYS:
            new = report.get(key)
            if new is None or not math.isfinite(new) or new < 0:
                continue
            old = previous.get(key, 0.0)
            self.actor_totals[key] += new - old if new >= old else new

    def count(self, name: str, amount: int = 1) -> None:
        if name not in COUNTERS:
            raise KeyError(f"{name!r} is not a coordinator counter (transport.metrics.COUNTERS)")
        self.counters[name] += amount

    def record_span(self, span: int) -> None:
        self.version_span[min(span, self.SPAN_BUCKETS)] += 1

    def record_staleness(self, staleness: int) -> None:
        self.staleness[staleness] += 1

    def snapshot(
        self, gauges: dict[str, float | int], decode_errors: dict[str, int], send_failures: dict[str, int]
    ) -> dict[str, float | int]:
        """Every metric, under its catalog key: the owner's ``gauges`` (already keyed so), these counters, and the
        decode errors and send failures by reason."""
        now = time.monotonic()
        out: dict[str, float | int] = dict(gauges)
        out[mc.TRANSPORT_GRANTS_PER_S] = self.grants.rate(now)
        out[mc.TRANSPORT_GROUPS_PER_S] = self.groups.rate(now)
        out[mc.TRANSPORT_BYTES_PER_S] = self.bytes.rate(now)
        out[mc.TRANSPORT_GRANTS_TOTAL] = int(self.grants.total)
        out[mc.TRANSPORT_GROUPS_RECEIVED_TOTAL] = int(self.groups.total)
        out[mc.TRANSPORT_BYTES_RECEIVED_TOTAL] = int(self.bytes.total)
        for name, key in COUNTERS.items():
            if name not in COUNTED_ONLY or name in self.counters:
                out[key] = self.counters[name]
        for key in DECLARED_DROPS:
            out[key] = self.drops[key]
        out.update(self.drops)
        out[mc.TRANSPORT_DROPS_TOTAL] = sum(self.drops.values())
        for name, key in ACTOR_REPORT_TOTALS.items():
            out[key] = float(self.actor_totals[name])
        for reason, value in send_failures.items():
            out[mc.transport_send_failures_reason_key(reason)] = value
        for reason, value in decode_errors.items():
            out[mc.transport_decode_errors_reason_key(reason)] = value
        out[mc.TRANSPORT_DECODE_ERRORS_TOTAL] = sum(decode_errors.values())
        for k in range(self.max_staleness + 1):
            out[mc.transport_staleness_lag_key(k)] = self.staleness[k]
        out[mc.TRANSPORT_STALENESS_MEAN] = histogram_mean(self.staleness)
        for span in range(self.SPAN_BUCKETS):
            out[mc.transport_version_span_span_key(span)] = self.version_span[span]
        out[mc.transport_version_span_span_key(f"{self.SPAN_BUCKETS}+")] = self.version_span[self.SPAN_BUCKETS]
        return out
