"""The end of the data: a run whose length is derived from the data ends at its last full batch, and a final batch
smaller than data.train_batch_size (the coordinator hands over what is left) is dropped with a warning, as verl's
``drop_last=True`` does, instead of crashing the update or waiting forever.

The learner's batch source (:class:`RolloutSource`: the wait, then rank 0's collation and broadcast) runs here on
a single-process context against a real coordinator fed by an in-process client, without model or actor processes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from _plane_config import coordinator, plane_config

from async_rl.config import load_config
from async_rl.learner.dist import local_context
from async_rl.runtime.rollout_source import RolloutSource, wait_for_groups
from async_rl.runtime.run_length import derive_run_length
from async_rl.transport import Coordinator, PromptRecord, RolloutClient, make_completion, unpack_array
from async_rl.transport.protocol import PromptGrant, RolloutGroup

ROOT = Path(__file__).resolve().parents[2]
LOGGER = "async_rl.runtime.rollout_source"


class _NoPublisher:
    """No actor ever joins a weight-sync group here, so the wait never re-publishes."""

    def needs_refresh(self) -> bool:
        return False

    def publish(self, *args: object) -> dict[str, float]:
        raise AssertionError("the wait publishes only through its republish callable")


def _no_republish() -> None:
    raise AssertionError("nothing to publish in this test")


Plane = Callable[..., tuple[Coordinator, RolloutClient]]


@pytest.fixture
def plane() -> Iterator[Plane]:
    """``plane(prompts, batch, **coordinator_kwargs)``: a coordinator plus a joined client, both closed afterwards."""
    made: list[tuple[Coordinator, RolloutClient]] = []

    def make(prompts: int, batch: int, **kwargs: Any) -> tuple[Coordinator, RolloutClient]:
        s = plane_config(heartbeat_interval_s=0.1, peer_timeout_s=5.0, max_staleness=1, groups_per_step=batch)
        records = [PromptRecord(np.arange(i, i + 3, dtype=np.int32)) for i in range(prompts)]
        coord = coordinator(records, s, seed=0, trust_claimed_versions=True, **kwargs)
        client = RolloutClient(coord.address, "actor-0", s.async_training.transport)
        made.append((coord, client))
        client.hello()
        return coord, client

    yield make
    for coord, client in made:
        client.close(linger_s=0.0)
        coord.close()


def _answer(grant: PromptGrant, version: int) -> RolloutGroup:
    prompt = unpack_array(grant.prompt_token_ids)
    tokens, lps = prompt[::-1].copy(), np.full(len(prompt), -0.5, dtype=np.float32)
    completions = [make_completion(tokens, lps, version_min=version) for _ in range(grant.sampling.n)]
    return RolloutGroup(prompt_id=grant.prompt_id, lease_id=grant.lease_id, actor_id="actor-0", completions=completions)


def _grants(client: RolloutClient, want: int, loaded: int, timeout_s: float) -> list[PromptGrant]:
    got: list[PromptGrant] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        got += client.request_work(want - len(got), loaded, timeout_s=0.05)
    return got


def _run_until_exhausted(coord: Coordinator, client: RolloutClient, batch: int) -> list[int]:
    """Train (mark trained, bump the version) batch after batch until the wait returns []; the batch sizes seen."""
    learner = SimpleNamespace(
        start=SimpleNamespace(pad_token_id=0),
        data_cfg=SimpleNamespace(max_prompt_length=None, max_response_length=None),
        version=0,
    )
    source = RolloutSource(
        local_context(), coord, _NoPublisher(), learner, batch_size=batch, republish=_no_republish, poll_s=0.1
    )
    sizes: list[int] = []
    for version in range(100):
        for g in _grants(client, batch, loaded=version, timeout_s=0.3):
            client.send_group(_answer(g, version))
        assert client.wait_acked(3.0)
        rollouts = source.next(timeout_s=10.0)  # what every rank gets; None ends the Trainer's loop
        if rollouts is None:
            return sizes
        assert rollouts.group_ids == [g.prompt_id for g in rollouts.groups]
        assert len(rollouts.batch) == sum(len(g.completions) for g in rollouts.groups)
        sizes.append(len(rollouts.groups))
        coord.mark_trained(rollouts.group_ids)
        coord.set_policy_version(version + 1)
    raise AssertionError("the data never ran out")


def test_final_short_batch_is_dropped_and_the_derived_length_never_reaches_it(
    plane: Plane, caplog: pytest.LogCaptureFixture
) -> None:
    prompts, epochs = 20, 3
    cfg = load_config(
        [str(ROOT / "configs" / "smoke_grpo.yaml")],
        ["trainer.total_training_steps=null", f"trainer.total_epochs={epochs}"],
    )
    batch = cfg.data.train_batch_size
    assert batch == 8
    steps = derive_run_length(cfg, prompts).steps
    assert steps == prompts // batch * epochs == 6  # verl: 2 full batches an epoch, x 3
    coord, client = plane(prompts, batch, max_epochs=epochs, shuffle_seed=1)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        sizes = _run_until_exhausted(coord, client, batch)
    # 60 prompt ids (ids run on across epochs) = 7 full batches + 4 left over: the derived 6 steps are all full.
    assert sizes == [batch] * 7
    assert steps <= len(sizes)
    dropped = [r.getMessage() for r in caplog.records if "dropping the final" in r.getMessage()]
    assert dropped == ["data exhausted: dropping the final 4 prompt groups, fewer than data.train_batch_size=8"]
    assert coord.metrics()["transport/trained_total"] == 7 * batch
    # Asking again after the end returns [] at once (nothing is coming), without another warning.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert (
            wait_for_groups(local_context(), coord, _NoPublisher(), batch, timeout_s=10.0, republish=_no_republish)
            == []
        )
    assert not caplog.records


def test_data_that_divides_into_batches_ends_without_a_warning(plane: Plane, caplog: pytest.LogCaptureFixture) -> None:
    coord, client = plane(8, 4, max_epochs=2)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        sizes = _run_until_exhausted(coord, client, 4)
    assert sizes == [4, 4, 4, 4]
    assert not [r for r in caplog.records if "dropping" in r.getMessage()]


class _JoinedOnce(_NoPublisher):
    """An actor joined while the learner waited: the first poll finds the publisher needing a refresh."""

    def __init__(self) -> None:
        self.refreshes = 1

    def needs_refresh(self) -> bool:
        self.refreshes -= 1
        return self.refreshes == 0


def test_the_wait_republishes_only_through_the_trainers_publish(plane: Plane) -> None:
    """While no group arrives, an actor that joined gets the current weights through ``republish`` (the trainer's one
    publish path, which carries a LoRA run's served-weights probe), never through the publisher directly (that
    path sent plans without the probe: an actor joining mid-run had its served adapter unchecked)."""
    coord, _client = plane(8, 4)
    calls: list[str] = []
    with pytest.raises(TimeoutError, match="no 4 rollout groups"):
        wait_for_groups(
            local_context(), coord, _JoinedOnce(), 4, timeout_s=0.5, republish=lambda: calls.append("publish"),
            poll_s=0.1,
        )  # fmt: skip
    assert calls == ["publish"]
