"""Counters, histograms, rates and a rate-limited bad-message log for the rollout plane.

Everything here is plain Python state mutated by the owner under its own lock; `TransportMetrics.snapshot` turns it
into the flat ``{"transport/...": number}`` dict the learner logs. The keys and their meanings are the
``transport/...`` entries of the metric catalog (runtime/metric_catalog.py), which also defines staleness.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter, OrderedDict

from async_rl.metric_catalog import histogram_mean
from async_rl.transport.validation import INVALID_REASONS

logger = logging.getLogger(__name__)

PREFIX = "transport/"
# Cumulative counters an actor reports on its periodic Heartbeat: tokens generated, seconds with nothing to generate,
# seconds since it started. The coordinator sums their growth over all actors (``transport/actors/<key>_total``).
ACTOR_REPORT_KEYS = ("generated_tokens", "idle_s", "uptime_s", "served_checks", "served_check_failures")
# Validation rounds (transport.evaluation): rounds started, prompts granted, leases expired (actor dead, timeout, moved
# past the pinned version), and deliveries dropped as a duplicate, under a wrong version (granted again), for a round
# already closed (late) or unknown.
EVAL_COUNTERS = (
    "eval/rounds",
    "eval/grants",
    "eval/lease_expiries",
    "eval/duplicates",
    "eval/wrong_version",
    "eval/late",
    "eval/unknown",
)
# Rollout groups refused by the coordinator (``transport/drops/<reason>``, always reported): each reason of
# transport.validation as ``invalid_<reason>`` (its prompt is granted again), and ``quarantined``, a group from a
# sender quarantined after ``max_invalid_groups`` invalid ones. ``actors_quarantined`` counts those senders.
INVALID_DROPS = tuple(f"invalid_{reason}" for reason in INVALID_REASONS)
DECLARED_DROPS = (*INVALID_DROPS, "quarantined")
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
    """The coordinator's metric state. Keys produced by `snapshot` are all prefixed ``transport/``."""

    SPAN_BUCKETS = 8  # version_span/0..7 and version_span/8+

    def __init__(self, max_staleness: int) -> None:
        self.max_staleness = max_staleness
        self.counters: Counter[str] = Counter()
        self.drops: Counter[str] = Counter()
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
        self.counters[name] += amount

    def record_span(self, span: int) -> None:
        self.version_span[min(span, self.SPAN_BUCKETS)] += 1

    def record_staleness(self, staleness: int) -> None:
        self.staleness[staleness] += 1

    def snapshot(
        self, gauges: dict[str, float | int], decode_errors: dict[str, int], send_failures: dict[str, int]
    ) -> dict[str, float | int]:
        now = time.monotonic()
        out: dict[str, float | int] = {PREFIX + k: v for k, v in gauges.items()}
        out[PREFIX + "grants_per_s"] = self.grants.rate(now)
        out[PREFIX + "groups_per_s"] = self.groups.rate(now)
        out[PREFIX + "bytes_per_s"] = self.bytes.rate(now)
        out[PREFIX + "grants_total"] = int(self.grants.total)
        out[PREFIX + "groups_received_total"] = int(self.groups.total)
        out[PREFIX + "bytes_received_total"] = int(self.bytes.total)
        for name in (
            "lease_expiries",
            "duplicates",
            "late_accepted",
            "unknown_groups",
            "credit_waits",
            "trained",
            "actors_presumed_dead",
        ):
            out[PREFIX + name] = self.counters[name]
        for name in EVAL_COUNTERS:
            out[PREFIX + name] = self.counters[name]
        for name, value in self.counters.items():
            out.setdefault(PREFIX + name, value)
        for reason in DECLARED_DROPS:
            out[PREFIX + "drops/" + reason] = self.drops[reason]
        for reason, value in self.drops.items():
            out[PREFIX + "drops/" + reason] = value
        out[PREFIX + "drops_total"] = sum(self.drops.values())
        for key in ACTOR_REPORT_KEYS:
            out[f"{PREFIX}actors/{key}_total"] = float(self.actor_totals[key])
        for reason, value in send_failures.items():
            out[PREFIX + "send_failures/" + reason] = value
        for reason, value in decode_errors.items():
            out[PREFIX + "decode_errors/" + reason] = value
        out[PREFIX + "decode_errors_total"] = sum(decode_errors.values())
        for k in range(self.max_staleness + 1):
            out[f"{PREFIX}staleness/{k}"] = self.staleness[k]
        out[PREFIX + "staleness_mean"] = histogram_mean(self.staleness)
        for span in range(self.SPAN_BUCKETS):
            out[f"{PREFIX}version_span/{span}"] = self.version_span[span]
        out[f"{PREFIX}version_span/{self.SPAN_BUCKETS}+"] = self.version_span[self.SPAN_BUCKETS]
        return out
