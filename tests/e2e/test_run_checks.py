"""The checks every e2e run's metrics.jsonl passes (_e2e_helpers), on hand-written records: fast, no processes."""

from __future__ import annotations

import pytest
from _e2e_helpers import assert_catalogued, assert_sync_moved_weights


def _step(step: int, **sync: float) -> dict:
    return {"step": step, "learner/version": float(step), **{f"sync/{k}": v for k, v in sync.items()}}


def test_sync_bytes_must_be_real_on_the_steps_that_published() -> None:
    ok = dict(seconds=0.2, actors=1.0, failures=0.0, bytes=4096.0, bandwidth_MBps=19.5)
    assert_sync_moved_weights([_step(1, **ok), _step(2), _step(3, **ok)])  # step 2 did not publish
    # a failed transfer (failures grew), a step with no actor in the group, a validation round: not checked
    failed = dict(seconds=0.5, actors=1.0, failures=1.0)
    alone = dict(actors=0.0, epoch=1.0, failures=1.0, left_out=0.0)
    assert_sync_moved_weights([_step(1, **ok), _step(2, **failed), _step(3, **alone), {"step": 3, "val/version": 3.0}])
    with pytest.raises(AssertionError, match="step 1 published weights to 1 actor"):
        assert_sync_moved_weights([_step(1, **{**ok, "bytes": 0.0, "bandwidth_MBps": 0.0})])  # the bug of issue 14
    with pytest.raises(AssertionError, match="whole model"):
        assert_sync_moved_weights([_step(1, **ok), _step(2, **{**ok, "bytes": 2048.0})])
    # a resumed learner counts failures from 0: a publish after the resume is checked again
    with pytest.raises(AssertionError, match="step 7"):
        assert_sync_moved_weights([_step(6, **{**ok, "failures": 2.0}), _step(7, **{**ok, "bytes": 0.0})])


def test_every_key_must_be_in_the_catalog() -> None:
    assert_catalogued([_step(1, seconds=0.1), {"step": 1, "val/version": 1.0, "val/arith/reward_mean": 0.5}])
    with pytest.raises(AssertionError, match=r"\['reward/mean', 'val/reward_mean'\]"):
        assert_catalogued([{"step": 1, "reward/mean": 0.5, "val/reward_mean": 0.5}])  # val/ key in a training step
