"""Group filtering (DAPO dynamic sampling) through a real coordinator and an in-process RolloutClient over loopback
ZeroMQ: constant groups are acked "accepted" but never reach the learner, other prompts are granted in their place so
every step trains exactly ``train_batch_size`` informative groups, no prompt is trained twice or lost, the per-step
metrics say what happened, eval groups are never filtered, a group without the metric is refused, a step past
``max_num_gen_batches`` stops the learner with a clear error, and a resumed coordinator keeps it all."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from _plane_config import plane_config

from async_rl.config import Config
from async_rl.config.algorithm import FilterGroupsConfig
from async_rl.runtime.rollout_source import wait_for_groups
from async_rl.transport import (
    Coordinator,
    FilterBudgetExceeded,
    GroupSampling,
    PromptRecord,
    RolloutClient,
)
from async_rl.transport.codec import decode_plain, encode_plain
from async_rl.transport.protocol import PromptGrant, RolloutGroup

Factory = Callable[..., Coordinator]
ClientFactory = Callable[..., RolloutClient]
GroupMaker = Callable[..., RolloutGroup]
B = 4
SAMPLING = GroupSampling.defaults(n=2, max_tokens=8)
BY_ACC = FilterGroupsConfig(enable=True, metric="acc")
# prompt ids whose group comes back constant (all-correct or all-wrong): ids are granted in order, so with B = 4 and
# K = 0 the steps consume 0-6 (3 filtered), 7-13 (3), 14-18 (1), 19-22 (0)
CONSTANT = {0, 2, 3, 7, 8, 9, 15}
EXPECTED_STEPS = [([1, 4, 5, 6], 3), ([10, 11, 12, 13], 3), ([14, 16, 17, 18], 1), ([19, 20, 21, 22], 0)]


def fast(**overrides: Any) -> Config:
    return plane_config(heartbeat_interval_s=0.1, peer_timeout_s=5.0, **overrides)


def scored(
    make_group: GroupMaker, grant: PromptGrant, version: int, constant: bool, actor_id: str = "actor-0"
) -> RolloutGroup:
    """A group whose reward always differs across completions while its ``acc`` component is constant or not: the
    filter must read the component it is told to, not the reward."""
    group = make_group(grant, actor_id, version=version)
    completions = [
        msgspec.structs.replace(
            c, reward=0.5 + i, reward_components={"acc": 1.0 if constant else float(i % 2), "format": 1.0}
        )
        for i, c in enumerate(group.completions)
    ]
    return msgspec.structs.replace(group, completions=completions)


def by_reward(make_group: GroupMaker, grant: PromptGrant, version: int, constant: bool) -> RolloutGroup:
    group = make_group(grant, "actor-0", version=version)
    rewards = [1.0] * len(group.completions) if constant else [float(i) for i in range(len(group.completions))]
    completions = [msgspec.structs.replace(c, reward=r) for c, r in zip(group.completions, rewards, strict=True)]
    return msgspec.structs.replace(group, completions=completions)


Answer = Callable[[PromptGrant, int], RolloutGroup]


def serve_round(client: RolloutClient, version: int, answer: Answer, sent: list[int]) -> None:
    """One round of the actor: take what was granted, answer it all, in grant order, and wait for the acks."""
    for g in client.request_work(2 * B, version, timeout_s=0.05):
        assert not g.is_eval
        client.send_group(answer(g, version))
        sent.append(g.prompt_id)
    assert client.wait_acked(3.0)


def fill_step(coord: Coordinator, client: RolloutClient, version: int, answer: Answer, sent: list[int]) -> list[Any]:
    deadline = time.monotonic() + 15.0
    while time.monotonic() < deadline:
        serve_round(client, version, answer, sent)
        try:
            return coord.get_groups(B, timeout_s=0.05)
        except TimeoutError:
            continue
    raise AssertionError("the step never filled")


def nothing_lost(m: dict[str, Any]) -> None:
    """The ledger identity of the e2e tests (tests/e2e/conftest.py), with the filtered prompts added."""
    assert m["transport/data_epoch"] == 0
    accounted = (
        m["transport/trained_total"]
        + m["transport/filter/filtered_total"]
        + m["transport/leased"]
        + m["transport/queue_depth"]
        + m["transport/taken"]
        + m["transport/regrant_queue"]
        + m["transport/dropped_total"]
    )
    assert accounted == m["transport/data_position"], m


def test_each_step_trains_exactly_the_batch_of_informative_groups(
    coordinator_factory: Factory, client_factory: ClientFactory, make_group: GroupMaker
) -> None:
    coord = coordinator_factory(40, fast(max_staleness=0, groups_per_step=B), sampling=SAMPLING, filter_groups=BY_ACC)
    client = client_factory(coord.address)
    client.hello()
    sent: list[int] = []
    trained: list[int] = []
    for version, (expect_ids, expect_filtered) in enumerate(EXPECTED_STEPS):
        groups = fill_step(coord, client, version, lambda g, v: scored(make_group, g, v, g.prompt_id in CONSTANT), sent)
        ids = [g.prompt_id for g in groups]
        assert sorted(ids) == expect_ids  # the replacements are new prompts, in cursor order
        for g in groups:  # only informative groups reach the learner, complete and as sent
            assert len(g.completions) == SAMPLING.n
            assert len({c.reward_components["acc"] for c in g.completions}) == 2
        m = coord.metrics()
        assert m["transport/filter/filtered_groups"] == expect_filtered
        assert m["transport/filter/filtered_fraction"] == pytest.approx(expect_filtered / (expect_filtered + B))
        coord.mark_trained(ids)
        trained += ids
        coord.set_policy_version(version + 1)
    assert len(trained) == len(set(trained)) == len(EXPECTED_STEPS) * B  # no prompt trained twice
    assert set(trained).isdisjoint(CONSTANT)
    assert sorted(set(sent)) == list(range(23)) and len(sent) == 23  # each prompt granted once, none skipped
    m = coord.metrics()
    assert m["transport/filter/filtered_total"] == len(CONSTANT) == 7
    assert m["transport/trained_total"] == 16
    # 23 leases settled (16 trained + 7 filtered), whatever the next step has been granted already
    assert m["transport/filter/grants_per_trained_group"] == pytest.approx(23 / 16)
    assert m["transport/groups_received_total"] == 23  # a filtered group was received fine ...
    assert m["transport/drops_total"] == 0  # ... and is not a drop
    assert client.metrics()["transport/client/acks/accepted"] == 23  # ... and acked as such
    nothing_lost(m)
    coord.check_invariants()


def test_with_prefetch_admission_keeps_granting_and_nothing_is_lost(
    coordinator_factory: Factory, client_factory: ClientFactory, make_group: GroupMaker
) -> None:
    """K = 1: the next step's prompts are generated while the learner holds a step; filtered groups free their slots
    at once, so the in-flight cap never wedges, and every id below the cursor is trained, filtered or outstanding."""
    s = fast(max_staleness=1, groups_per_step=B)  # in-flight cap (1 + 1) x 4 = 8
    coord = coordinator_factory(
        200, s, sampling=SAMPLING, filter_groups=FilterGroupsConfig(enable=True, metric="reward")
    )
    client = client_factory(coord.address, cfg=s)
    client.hello()
    rng = random.Random(3)
    constant: set[int] = set()

    def answer(g: PromptGrant, v: int) -> RolloutGroup:
        flat = rng.random() < 0.5
        if flat:
            constant.add(g.prompt_id)
        return by_reward(make_group, g, v, flat)

    sent: list[int] = []
    trained: list[int] = []
    per_step_filtered = []
    for version in range(8):
        groups = fill_step(coord, client, version, answer, sent)
        assert len(groups) == B
        ids = [g.prompt_id for g in groups]
        assert not constant & set(ids)
        serve_round(client, version, answer, sent)  # the actor works on while the learner trains this step
        m = coord.metrics()
        assert m["transport/in_flight"] <= coord.inflight_cap
        per_step_filtered.append(m["transport/filter/filtered_groups"])
        coord.mark_trained(ids)
        trained += ids
        coord.set_policy_version(version + 1)
    m = coord.metrics()
    assert len(trained) == len(set(trained)) == 8 * B
    assert m["transport/filter/filtered_total"] == len(constant) > 8  # about half of ~70 prompts
    assert sum(per_step_filtered) <= len(constant)  # the rest count towards the step being filled now
    assert len(sent) == len(set(sent))  # no prompt granted twice: leases never expired here
    assert m["transport/drops_total"] == 0 and m["transport/duplicates"] == 0
    outstanding = m["transport/leased"] + m["transport/queue_depth"] + m["transport/taken"]
    assert len(trained) + len(constant) + outstanding == m["transport/data_position"]
    nothing_lost(m)
    coord.check_invariants()


def test_eval_groups_are_never_filtered(
    coordinator_factory: Factory, client_factory: ClientFactory, make_group: GroupMaker
) -> None:
    coord = coordinator_factory(16, fast(max_staleness=0, groups_per_step=B), sampling=SAMPLING, filter_groups=BY_ACC)
    client = client_factory(coord.address)
    client.hello()
    val = [PromptRecord(r.token_ids + 100, {}) for r in coord.source.records[:3]]
    round_id = coord.start_eval(0, val, GroupSampling.defaults(n=2, max_tokens=8))
    deadline = time.monotonic() + 5.0
    while not coord.wait_eval(round_id, timeout_s=0.0) and time.monotonic() < deadline:
        for g in client.request_work(3, 0, timeout_s=0.05):
            if g.is_eval:  # constant rewards and no 'acc' at all: neither filtered nor refused
                group = by_reward(make_group, g, 0, constant=True)
                client.send_group(msgspec.structs.replace(group, eval_round=g.eval_round))
        client.wait_acked(2.0)
    result = coord.finish_eval(round_id)
    assert result.complete and sorted(result.completions) == [0, 1, 2]
    assert all(len(cs) == 2 and cs[0].reward == cs[1].reward for cs in result.completions.values())
    m = coord.metrics()
    assert m["transport/filter/filtered_total"] == 0 and m["transport/drops_total"] == 0


def test_a_group_without_the_metric_is_refused_and_its_prompt_granted_again(
    coordinator_factory: Factory,
    client_factory: ClientFactory,
    make_group: GroupMaker,
    caplog: pytest.LogCaptureFixture,
) -> None:
    coord = coordinator_factory(16, fast(max_staleness=0, groups_per_step=B), sampling=SAMPLING, filter_groups=BY_ACC)
    client = client_factory(coord.address)
    client.hello()
    first = client.request_work(1, 0, timeout_s=2.0)[0]
    with caplog.at_level(logging.WARNING, logger="async_rl.transport.coordinator"):
        client.send_group(by_reward(make_group, first, 0, constant=False))  # rewards, but no reward components
        assert client.wait_acked(3.0)
    assert client.metrics()["transport/client/acks/invalid"] == 1
    m = coord.metrics()
    assert m["transport/drops/invalid_missing_filter_metric"] == 1
    assert m["transport/regrant_queue"] == 1 and m["transport/filter/filtered_total"] == 0
    assert any("'acc'" in r.getMessage() and "no reward components" in r.getMessage() for r in caplog.records)
    (again,) = [g for g in client.request_work(1, 0, timeout_s=2.0) if g.prompt_id == first.prompt_id]
    client.send_group(scored(make_group, again, 0, constant=False))
    assert client.wait_acked(3.0) and client.metrics()["transport/client/acks/accepted"] == 1
    coord.check_invariants()


class _RankZero:
    """The learner's wait on a single rank: broadcasts return what rank 0 passes."""

    rank = 0

    def broadcast_bytes(self, data: bytes | None) -> bytes | None:
        return data


class _NoPublisher:
    def needs_refresh(self) -> bool:
        return False


def test_too_many_generated_batches_stop_the_learner_with_the_counts(
    coordinator_factory: Factory, client_factory: ClientFactory, make_group: GroupMaker
) -> None:
    informative = {1, 5}
    settings = FilterGroupsConfig(enable=True, metric="reward", max_num_gen_batches=2)  # 2 x 4 = 8 prompts a step
    coord = coordinator_factory(40, fast(max_staleness=0, groups_per_step=B), sampling=SAMPLING, filter_groups=settings)
    client = client_factory(coord.address)
    client.hello()
    sent: list[int] = []
    with pytest.raises(FilterBudgetExceeded) as info:
        fill_step(coord, client, 0, lambda g, v: by_reward(make_group, g, v, g.prompt_id not in informative), sent)
    why = str(info.value)
    # deliveries in id order: 0 C, 1 I, 2 C, 3 C, 4 C, 5 I, 6 C, 7 C -> 8 prompts used, 2 of 4 informative
    for part in (
        "too many generated batches",
        "algorithm.filter_groups.max_num_gen_batches=2",
        "2 x data.train_batch_size=4 = 8 prompts per training step",
        "8 have come back for this step, 6 of them filtered",
        "metric 'reward' equal across all n=2 completions",
        "only 2 of the 4 informative groups",
    ):
        assert part in why, part
    # the learner's wait raises it too (rank 0; it does not time out or hand over a short batch) ...
    with pytest.raises(FilterBudgetExceeded, match="max_num_gen_batches=2"):
        wait_for_groups(_RankZero(), coord, _NoPublisher(), B, timeout_s=5.0, republish=lambda: None, poll_s=0.1)
    # ... and no more training work is granted
    assert client.request_work(4, 0, timeout_s=0.3) == []
    assert set(sent) <= set(range(9))
    coord.check_invariants()


def test_no_budget_means_it_keeps_granting(
    coordinator_factory: Factory, client_factory: ClientFactory, make_group: GroupMaker
) -> None:
    informative = {1, 5, 17, 30}  # 31 prompts for one step: far past 2 batches, fine without a limit
    settings = FilterGroupsConfig(enable=True, metric="reward", max_num_gen_batches=0)
    coord = coordinator_factory(40, fast(max_staleness=0, groups_per_step=B), sampling=SAMPLING, filter_groups=settings)
    client = client_factory(coord.address)
    client.hello()
    sent: list[int] = []
    groups = fill_step(coord, client, 0, lambda g, v: by_reward(make_group, g, v, g.prompt_id not in informative), sent)
    assert sorted(g.prompt_id for g in groups) == sorted(informative)
    assert sorted(sent) == list(range(31))
    m = coord.metrics()
    assert m["transport/filter/filtered_groups"] == 27
    assert m["transport/filter/filtered_fraction"] == pytest.approx(27 / 31)


def test_a_filter_that_is_off_or_has_one_completion_filters_nothing(
    coordinator_factory: Factory,
    client_factory: ClientFactory,
    make_group: GroupMaker,
    caplog: pytest.LogCaptureFixture,
) -> None:
    for sampling, fs in (
        (SAMPLING, FilterGroupsConfig()),
        (GroupSampling.defaults(n=1, max_tokens=8), FilterGroupsConfig(enable=True, metric="reward")),
    ):
        with caplog.at_level(logging.WARNING, logger="async_rl.transport.coordinator"):
            coord = coordinator_factory(
                16, fast(max_staleness=0, groups_per_step=B), sampling=sampling, filter_groups=fs
            )
        client = client_factory(coord.address)  # a coordinator of its own each time
        client.hello()
        sent: list[int] = []
        groups = fill_step(coord, client, 0, lambda g, v: by_reward(make_group, g, v, True), sent)
        assert sorted(g.prompt_id for g in groups) == [0, 1, 2, 3]  # constant groups, trained all the same
        assert coord.metrics()["transport/filter/filtered_total"] == 0
    assert any("sampling.n == 1" in r.getMessage() for r in caplog.records)


def test_resume_keeps_filtered_prompts_settled_and_the_counters(
    coordinator_factory: Factory, client_factory: ClientFactory, make_group: GroupMaker
) -> None:
    n_records = 24
    s = fast(max_staleness=0, groups_per_step=B)
    kwargs = {"sampling": SAMPLING, "filter_groups": BY_ACC, "max_epochs": 1, "shuffle_seed": 5}
    first = coordinator_factory(n_records, s, **kwargs)
    client = client_factory(first.address)
    client.hello()

    def answer(g: PromptGrant, v: int, actor_id: str = "actor-0") -> RolloutGroup:
        return scored(make_group, g, v, g.prompt_id in CONSTANT, actor_id)

    sent: list[int] = []
    trained: list[int] = []
    for version in range(2):
        groups = fill_step(first, client, version, answer, sent)
        first.mark_trained([g.prompt_id for g in groups])
        trained += [g.prompt_id for g in groups]
        first.set_policy_version(version + 1)
    assert sorted(trained) == [1, 4, 5, 6, 10, 11, 12, 13]
    # the third step is under way: 14 (informative) is buffered, 15 (constant) filtered for it, 16 and 17 leased
    grants: list[PromptGrant] = []
    deadline = time.monotonic() + 5.0
    while len(grants) < 4 and time.monotonic() < deadline:
        grants += client.request_work(2 * B, 2, timeout_s=0.05)
    assert [g.prompt_id for g in grants] == [14, 15, 16, 17]
    for g in grants[:2]:
        client.send_group(answer(g, 2))
    assert client.wait_acked(3.0)
    before = first.metrics()
    assert before["transport/filter/filtered_total"] == 7 and before["transport/queue_depth"] == 1
    saved = encode_plain(first.state_dict())  # as a checkpoint holds it: msgpack bytes, no pickle
    first.close()
    client.close(linger_s=0.0)

    second = coordinator_factory(n_records, s, autostart=False, **kwargs)
    second.load_state_dict(decode_plain(saved))
    second.start()
    m = second.metrics()
    assert m["transport/filter/filtered_total"] == 7 and m["transport/trained_total"] == 8
    assert m["transport/trained"] == before["transport/trained"] == 8  # counters carry over
    # 19 leases issued (ids 0-18), 15 settled before the save (8 trained, 7 filtered); the three still out when it
    # was taken (16, 17, 18) were lost with the old coordinator: wasted grants now, their prompts granted again
    assert before["transport/filter/grants_per_trained_group"] == pytest.approx(15 / 8)
    assert m["transport/filter/grants_per_trained_group"] == pytest.approx(18 / 8)
    fresh = client_factory(second.address, "actor-1")
    fresh.hello(loaded_version=2)
    resent: list[int] = []

    def answer_fresh(g: PromptGrant, v: int) -> RolloutGroup:
        return answer(g, v, "actor-1")

    groups = fill_step(second, fresh, 2, answer_fresh, resent)
    assert sorted(g.prompt_id for g in groups) == [14, 16, 17, 18]
    assert resent[:3] == [16, 17, 18]  # the leases outstanding at the save come back first; 15 never does
    after = second.metrics()
    assert after["transport/filter/filtered_groups"] == 1  # 15, filtered before the save, counted for this step
    second.mark_trained([g.prompt_id for g in groups])
    trained += [g.prompt_id for g in groups]
    second.set_policy_version(3)
    # on to the end of the data (24 prompts): whatever is left is handed over, nothing was lost or repeated
    version = 3
    while True:
        groups = fill_step(second, fresh, version, answer_fresh, resent)  # the last one short, then []
        if not groups:
            break
        second.mark_trained([g.prompt_id for g in groups])
        trained += [g.prompt_id for g in groups]
        second.set_policy_version(version + 1)
        version += 1
    assert len(trained) == len(set(trained)) == 17  # 4 + 4 + 4 + 4 + the last one, 23
    assert CONSTANT.isdisjoint(resent)  # no filtered prompt is ever granted again
    assert sorted(set(trained) | CONSTANT) == list(range(n_records))
    end = second.metrics()
    assert end["transport/trained_total"] + end["transport/filter/filtered_total"] == n_records
    second.check_invariants()


def test_a_filtered_prompt_is_consumed_for_its_epoch_only(
    coordinator_factory: Factory, client_factory: ClientFactory, make_group: GroupMaker
) -> None:
    """Prompt ids run on across epochs (id = epoch x records + position): a record filtered in epoch 0 is granted
    again, under a new id, in epoch 1."""
    n_records = 6
    coord = coordinator_factory(
        n_records,
        fast(max_staleness=0, groups_per_step=2),
        sampling=SAMPLING,
        filter_groups=FilterGroupsConfig(enable=True, metric="reward"),
        max_epochs=2,
    )
    client = client_factory(coord.address)
    client.hello()
    flat_in_epoch0 = {0, 2, 4}
    sent: list[int] = []
    trained: list[int] = []
    for version in range(3):
        deadline = time.monotonic() + 10.0
        while True:
            assert time.monotonic() < deadline
            for g in client.request_work(4, version, timeout_s=0.05):
                client.send_group(by_reward(make_group, g, version, g.prompt_id in flat_in_epoch0))
                sent.append(g.prompt_id)
            assert client.wait_acked(3.0)
            try:
                groups = coord.get_groups(2, timeout_s=0.05)
                break
            except TimeoutError:
                continue
        coord.mark_trained([g.prompt_id for g in groups])
        trained += [g.prompt_id for g in groups]
        coord.set_policy_version(version + 1)
    assert sorted(trained) == [1, 3, 5, 6, 7, 8]  # 6 and 8 are records 0 and 2 again, informative this time
    assert coord.source.record(6) is coord.source.records[0] and coord.source.record(8) is coord.source.records[2]
    m = coord.metrics()
    assert m["transport/filter/filtered_total"] == 3 and m["transport/data_epoch"] == 1
