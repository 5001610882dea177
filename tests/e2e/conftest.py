"""Shared checks for the end-to-end tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest


def _assert_nothing_lost(metrics: list[dict]) -> None:
    """The coordinator's ledger accounts for every prompt id below its data cursor at every logged step: trained,
    leased to an actor, received and waiting, handed to the learner, queued for re-grant, or dropped (counted)."""
    for m in metrics:
        assert m["transport/data_epoch"] == 0, "these runs stay within the first pass over the data"
        accounted = (
            m["transport/trained_total"]
            + m["transport/leased"]
            + m["transport/queue_depth"]
            + m["transport/taken"]
            + m["transport/regrant_queue"]
            + m["transport/dropped_total"]
        )
        assert accounted == m["transport/data_position"], m


@pytest.fixture
def assert_nothing_lost() -> Callable[[list[dict]], None]:
    return _assert_nothing_lost
