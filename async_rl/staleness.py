"""Staleness, defined once: how many policy versions behind the trained weights a sample's weights are, and the bound
K = ``async_training.max_staleness`` on it. The admission control (``transport.admission``), the ledger and the
coordinator (which drop or re-grant over-stale groups), and the metrics (``metric_catalog.lag_histogram``) all use
these functions.
"""

from __future__ import annotations

__all__ = ["min_start_version", "staleness", "within_bound"]


def staleness(trained_version: int, sampled_version: int) -> int:
    """How many policy versions behind the weights being trained a sample's weights are.

    ``trained_version``: the learner's version when the step starts (the weights its gradient is taken at).
    ``sampled_version``: the OLDEST version any token of the sample was generated under (a completion's
    ``version_min``; for a group, the oldest over its completions, ``RolloutGroup.version``). 0 is on-policy;
    ``async_training.max_staleness`` bounds it.
    """
    return int(trained_version) - int(sampled_version)


def within_bound(current_version: int, group_version: int, max_staleness: int) -> bool:
    """True when a group generated under ``group_version`` may be trained at ``current_version``."""
    return staleness(current_version, group_version) <= max_staleness


def min_start_version(current_version: int, max_staleness: int) -> int:
    """The oldest policy any prompt may start under while the learner is at ``current_version``."""
    return max(0, current_version - max_staleness)
