"""Checkpoint and resume of the coordinator: the resumed run neither repeats nor skips a prompt, including prompts
that were leased, buffered, or handed to the learner but not yet trained when the state was saved."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from _plane_config import plane_config

from async_rl.config import Config
from async_rl.transport import Coordinator, RolloutClient
from async_rl.transport.codec import decode_plain, encode_plain
from async_rl.transport.protocol import PromptGrant, RolloutGroup


def fast(**overrides: Any) -> Config:
    """A test config with quick liveness: heartbeats every 0.1 s, a peer is dead after 1 s of silence."""
    return plane_config(heartbeat_interval_s=0.1, peer_timeout_s=1.0, **overrides)


N = 20


def _grants(client: RolloutClient, want: int, loaded: int, timeout_s: float = 3.0) -> list[PromptGrant]:
    got: list[PromptGrant] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        got += client.request_work(want - len(got), loaded, timeout_s=0.05)
    return got


def test_resume_neither_repeats_nor_skips(
    coordinator_factory: Callable[..., Coordinator],
    client_factory: Callable[..., RolloutClient],
    make_group: Callable[..., RolloutGroup],
) -> None:
    s = fast(max_staleness=2, groups_per_step=2)  # cap (2 + 1) x 2 = 6
    first = coordinator_factory(N, s, max_epochs=1, shuffle_seed=7)
    client = client_factory(first.address, "actor-0", cfg=s)
    client.hello()
    trained_before: list[int] = []
    for version in range(3):  # three normal steps
        for g in _grants(client, 2, loaded=version):
            client.send_group(make_group(g, "actor-0", version=version))
        groups = first.get_groups(2, timeout_s=3.0)
        first.mark_trained([g.prompt_id for g in groups])
        trained_before += [g.prompt_id for g in groups]
        first.set_policy_version(version + 1)
    # Leave work in every state: 2 buffered, 1 of them taken but untrained, 4 leased and never delivered.
    held = _grants(client, 6, loaded=3)
    assert len(held) == 6
    for g in held[:2]:
        client.send_group(make_group(g, "actor-0", version=3))
    assert client.wait_acked(2.0)
    (taken,) = first.get_groups(1, timeout_s=2.0)
    saved = encode_plain(first.state_dict())  # as a checkpoint file would hold it: msgpack bytes, no pickle
    first.close()
    client.close()

    second = coordinator_factory(N, s, max_epochs=1, shuffle_seed=7, autostart=False)
    second.load_state_dict(decode_plain(saved))
    assert second.policy_version == 3
    second.start()
    fresh = client_factory(second.address, "actor-1", cfg=s)
    fresh.hello(loaded_version=3)
    trained_after: list[int] = []
    version = 3
    while True:
        for g in _grants(fresh, 2, loaded=version, timeout_s=0.1):
            fresh.send_group(make_group(g, "actor-1", version=version))
        try:
            groups = second.get_groups(2, timeout_s=0.2)
        except TimeoutError:
            continue
        if not groups:
            break
        second.mark_trained([g.prompt_id for g in groups])
        trained_after += [g.prompt_id for g in groups]
        version += 1
        second.set_policy_version(version)
    assert taken.prompt_id in trained_after  # handed out before the save, never trained: trained after resume
    assert not set(trained_before) & set(trained_after)  # nothing repeated
    assert sorted(trained_before + trained_after) == list(range(N))  # nothing skipped, each exactly once
    assert second.metrics()["transport/trained_total"] == N


def test_resume_refuses_a_different_dataset(coordinator_factory: Callable[..., Coordinator]) -> None:
    state = coordinator_factory(N).state_dict()
    other = coordinator_factory(N + 1, autostart=False)
    with pytest.raises(ValueError, match="num_records"):
        other.load_state_dict(state)
