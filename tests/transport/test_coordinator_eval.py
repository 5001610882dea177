"""Validation rounds through a real coordinator and RolloutClients over loopback ZeroMQ: eval work is granted first,
only to actors on the pinned version, never reaches the learner's get_groups or the ledger, does not hold training
back, is granted again when its actor dies or returns another version, and late results of a closed round are
dropped."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np
import pytest
from _plane_config import plane_config
from _plane_helpers import collect_grants as _collect
from _plane_helpers import wait_until as _wait

from async_rl.config import Config
from async_rl.transport import Coordinator, GroupSampling, PromptRecord, RolloutClient
from async_rl.transport.protocol import PromptGrant, RolloutGroup

Factory = Callable[..., Coordinator]
ClientFactory = Callable[..., RolloutClient]
GroupMaker = Callable[..., RolloutGroup]
GREEDY = GroupSampling.defaults(n=1, temperature=0.0, max_tokens=4)


def fast(**overrides: Any) -> Config:
    return plane_config(heartbeat_interval_s=0.1, peer_timeout_s=1.0, **overrides)


def _val_records(n: int) -> list[PromptRecord]:
    """Validation prompt i: tokens [100 + i, 101 + i] (disjoint from the training records' [i, ..., i + 3])."""
    return [PromptRecord(np.array([100 + i, 101 + i], dtype=np.int32), {"ground_truth": f"v{i}"}) for i in range(n)]


def _answer(make_group: GroupMaker, grant: PromptGrant, actor_id: str, version: int, vmax: int | None = None) -> Any:
    group = make_group(grant, actor_id, version=version, version_max=vmax)
    return msgspec.structs.replace(group, eval_round=grant.eval_round)


def _one_actor_and_a_round(
    coordinator_factory: Factory, client_factory: ClientFactory
) -> tuple[Coordinator, RolloutClient, int]:
    """A coordinator with training admission cap (1 + 1) x 2 = 4, one actor on version 0, and a round of 3 prompts."""
    s = fast(max_staleness=1, groups_per_step=2)
    coord = coordinator_factory(16, s)
    client = client_factory(coord.address, cfg=s)
    client.hello(loaded_version=0)
    return coord, client, coord.start_eval(0, _val_records(3), GREEDY)


def test_eval_grants_come_first_and_never_reach_the_learner(
    coordinator_factory: Factory, client_factory: ClientFactory, make_group: GroupMaker
) -> None:
    coord, client, round_id = _one_actor_and_a_round(coordinator_factory, client_factory)
    grants = _collect(client, 7, loaded=0)
    evals = [g for g in grants if g.is_eval]
    train = [g for g in grants if not g.is_eval]
    assert [g.prompt_id for g in evals] == [0, 1, 2] and len(train) == 4  # eval does not count against admission
    assert grants[:3] == evals  # the round is served before training work
    assert all(g.eval_round == round_id and g.min_version == 0 and g.sampling == GREEDY for g in evals)
    assert [int(g.prompt_token_ids.length) for g in evals] == [2, 2, 2] and evals[1].extras == {"ground_truth": "v1"}
    # the training and eval prompt ids overlap (0, 1, 2 in both): the round id keeps their acks apart
    for g in evals + train:
        client.send_group(_answer(make_group, g, "actor-0", version=0) if g.is_eval else make_group(g, "actor-0", 0))
    assert client.wait_acked(3.0)
    assert client.metrics()["transport/client/acks/accepted"] == 7
    assert coord.wait_eval(round_id, timeout_s=2.0)
    got = coord.get_groups(4, timeout_s=2.0)
    assert sorted(g.prompt_id for g in got) == sorted(g.prompt_id for g in train)
    assert all(g.eval_round == -1 for g in got)  # no trained group comes from an eval request
    result = coord.finish_eval(round_id)
    assert result.complete and result.version == 0 and sorted(result.completions) == [0, 1, 2]
    # completion i of an answer is the reversed prompt + [i]: each result belongs to its own val prompt
    assert [int(t) for t in result.completions[1][0].token_ids.data.cast("i")] == [102, 101, 0]
    m = coord.metrics()
    assert m["transport/eval/grants"] == 3 and m["transport/eval/rounds"] == 1
    assert m["transport/groups_received_total"] == 4  # the ledger saw the training groups only
    assert m["transport/data_position"] == 4 and m["transport/eval/open_prompts"] == 0
    coord.check_invariants()


def test_a_round_never_holds_back_the_groups_a_waiting_learner_lacks(
    coordinator_factory: Factory, client_factory: ClientFactory, make_group: GroupMaker
) -> None:
    coord, client, round_id = _one_actor_and_a_round(coordinator_factory, client_factory)
    got: list[RolloutGroup] = []
    learner = threading.Thread(target=lambda: got.extend(coord.get_groups(2, timeout_s=10.0)))
    learner.start()  # the learner waits for its step's 2 groups (the round before training, as at step 1)
    assert _wait(lambda: coord._learner_wants == 2)  # it is blocked in get_groups
    grants = _collect(client, 7, loaded=0)
    # the 2 groups the learner lacks first, then the round, then the rest of the admission allowance
    assert [g.is_eval for g in grants] == [False, False, True, True, True, False, False]
    first_two = grants[:2]
    for g in first_two:
        client.send_group(make_group(g, "actor-0", 0))
    learner.join(timeout=5.0)
    assert sorted(g.prompt_id for g in got) == sorted(g.prompt_id for g in first_two)
    for g in grants[2:]:
        client.send_group(_answer(make_group, g, "actor-0", version=0) if g.is_eval else make_group(g, "actor-0", 0))
    assert client.wait_acked(3.0)
    assert coord.wait_eval(round_id, timeout_s=2.0) and coord.finish_eval(round_id).complete
    coord.check_invariants()


def test_training_goes_on_while_a_round_is_pending(
    coordinator_factory: Factory, client_factory: ClientFactory, make_group: GroupMaker
) -> None:
    s = fast(max_staleness=0, groups_per_step=2)  # K = 0: the next step's work only after train + new version
    coord = coordinator_factory(16, s)
    evaluator = client_factory(coord.address, "evaluator", cfg=s)
    trainer = client_factory(coord.address, "trainer", cfg=s)
    evaluator.hello(loaded_version=0)
    round_id = coord.start_eval(0, _val_records(2), GREEDY)
    held = _collect(evaluator, 2, loaded=0)  # the evaluator holds the whole round and does not answer yet
    assert [g.is_eval for g in held] == [True, True]
    trainer.hello(loaded_version=0)
    for step in range(3):
        grants = _collect(trainer, 2, loaded=step)
        assert [g.is_eval for g in grants] == [False, False]  # nothing of the round is left to grant
        for g in grants:
            trainer.send_group(make_group(g, "trainer", version=step))
        assert trainer.wait_acked(2.0)
        groups = coord.get_groups(2, timeout_s=2.0)
        coord.mark_trained([g.prompt_id for g in groups])
        assert not coord.wait_eval(round_id, timeout_s=0.0)
        if step < 2:
            coord.set_policy_version(step + 1)
        evaluator.poll()
    assert coord.metrics()["transport/trained"] == 6
    # the round is still pinned to version 0 although the learner moved on
    for g in held:
        evaluator.send_group(_answer(make_group, g, "evaluator", version=0))
    assert evaluator.wait_acked(2.0)
    assert coord.wait_eval(round_id, timeout_s=2.0)
    assert coord.finish_eval(round_id).version == 0


def test_only_actors_on_the_pinned_version_get_eval_work(
    coordinator_factory: Factory, client_factory: ClientFactory, make_group: GroupMaker
) -> None:
    s = fast(max_staleness=1, groups_per_step=2)
    coord = coordinator_factory(16, s, initial_version=2)
    client = client_factory(coord.address, cfg=s)
    client.hello(loaded_version=1)
    round_id = coord.start_eval(2, _val_records(2), GREEDY)
    old = _collect(client, 2, loaded=1, timeout_s=1.0)
    assert old and not any(g.is_eval for g in old)  # version 1 may start training work (K = 1) but not the round
    for g in old:
        client.send_group(make_group(g, "actor-0", version=1))
    assert client.wait_acked(2.0)
    new = _collect(client, 2, loaded=2)  # the actor loaded version 2
    assert [(g.is_eval, g.min_version) for g in new] == [(True, 2), (True, 2)]
    for g in new:
        client.send_group(_answer(make_group, g, "actor-0", version=2))
    assert client.wait_acked(2.0) and coord.wait_eval(round_id, timeout_s=2.0)


def test_a_dead_actors_eval_work_is_granted_to_another_actor(
    coordinator_factory: Factory, client_factory: ClientFactory, make_group: GroupMaker
) -> None:
    coord = coordinator_factory(16)
    victim = client_factory(coord.address, "victim")
    victim.hello(loaded_version=0)
    round_id = coord.start_eval(0, _val_records(2), GREEDY)
    taken = [g for g in _collect(victim, 2, loaded=0) if g.is_eval]
    assert [g.prompt_id for g in taken] == [0, 1]
    # the victim stops polling: presumed dead after peer_timeout_s = 1 s, and its eval leases expire
    assert _wait(lambda: coord.metrics()["transport/eval/lease_expiries"] == 2, timeout_s=3.0)
    survivor = client_factory(coord.address, "survivor")
    survivor.hello(loaded_version=0)
    again = [g for g in _collect(survivor, 4, loaded=0) if g.is_eval]
    assert [g.prompt_id for g in again] == [0, 1]
    assert {g.lease_id for g in again}.isdisjoint(g.lease_id for g in taken)
    for g in again:
        survivor.send_group(_answer(make_group, g, "survivor", version=0))
    assert survivor.wait_acked(2.0) and coord.wait_eval(round_id, timeout_s=2.0)
    # the victim comes back with its old results: the round has them already
    for g in taken:
        victim.send_group(_answer(make_group, g, "victim", version=0))
    assert victim.wait_acked(3.0)
    assert victim.metrics()["transport/client/acks/duplicate"] == 2
    # the coordinator counts every copy it receives: the victim's client may re-send one after its reconnect
    assert coord.metrics()["transport/eval/duplicates"] >= 2
    result = coord.finish_eval(round_id)
    assert result.complete and sorted(result.completions) == [0, 1]


def test_a_result_under_another_version_is_granted_again(
    coordinator_factory: Factory, client_factory: ClientFactory, make_group: GroupMaker
) -> None:
    coord = coordinator_factory(16, initial_version=1)
    client = client_factory(coord.address)
    client.hello(loaded_version=1)
    round_id = coord.start_eval(1, _val_records(1), GREEDY)
    (grant,) = [g for g in _collect(client, 1, loaded=1) if g.is_eval]
    client.send_group(_answer(make_group, grant, "actor-0", version=1, vmax=2))  # spanned an update 1 -> 2
    assert client.wait_acked(2.0)
    assert client.metrics()["transport/client/acks/stale"] == 1
    assert coord.metrics()["transport/eval/wrong_version"] == 1 and not coord.wait_eval(round_id, 0.0)
    (again,) = [g for g in _collect(client, 1, loaded=1) if g.is_eval]
    assert again.prompt_id == 0 and again.lease_id != grant.lease_id
    client.send_group(_answer(make_group, again, "actor-0", version=1))
    assert client.wait_acked(2.0) and coord.wait_eval(round_id, timeout_s=2.0)


def test_closing_a_round_early_keeps_partial_results_and_drops_late_ones(
    coordinator_factory: Factory, client_factory: ClientFactory, make_group: GroupMaker
) -> None:
    coord = coordinator_factory(16)
    client = client_factory(coord.address)
    client.hello(loaded_version=0)
    round_id = coord.start_eval(0, _val_records(3), GREEDY)
    evals = [g for g in _collect(client, 3, loaded=0) if g.is_eval]
    client.send_group(_answer(make_group, evals[0], "actor-0", version=0))
    assert client.wait_acked(2.0)
    assert not coord.wait_eval(round_id, timeout_s=0.2)
    result = coord.finish_eval(round_id)
    assert not result.complete and sorted(result.completions) == [0] and result.num_prompts == 3
    client.send_group(_answer(make_group, evals[1], "actor-0", version=0))  # too late
    assert client.wait_acked(2.0)
    assert client.metrics()["transport/client/acks/unknown"] == 1 and coord.metrics()["transport/eval/late"] == 1
    nxt = coord.start_eval(0, _val_records(1), GREEDY)  # a new round may start now
    assert nxt == round_id + 1


def test_eval_api_checks_arguments(coordinator_factory: Factory) -> None:
    coord = coordinator_factory(4, initial_version=2)
    with pytest.raises(ValueError, match="newest published version is 2"):
        coord.start_eval(3, _val_records(1), GREEDY)
    with pytest.raises(ValueError, match="records"):
        coord.start_eval(2, [{"prompt": "x"}], GREEDY)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="GroupSampling"):
        coord.start_eval(2, _val_records(1), GroupSampling.defaults(top_p=0.0))
    round_id = coord.start_eval(2, _val_records(1), GREEDY)
    with pytest.raises(RuntimeError, match="still open"):
        coord.start_eval(2, _val_records(1), GREEDY)
    with pytest.raises(ValueError, match="not open"):
        coord.wait_eval(round_id + 1, 0.0)
    coord.finish_eval(round_id)
    with pytest.raises(ValueError, match="not open"):
        coord.finish_eval(round_id)


def test_actors_are_told_the_rounds_version_until_its_last_prompt_is_granted(
    coordinator_factory: Factory, client_factory: ClientFactory
) -> None:
    """The heartbeat's ``eval_version``: the open round's version while some of its prompts are still to be granted,
    sent at once when it changes (an actor holds a newer version back until then), and always after the grants."""
    s = plane_config(heartbeat_interval_s=30.0, max_staleness=1, groups_per_step=2)  # only the immediate heartbeats
    coord = coordinator_factory(16, s)
    client = client_factory(coord.address, cfg=s)
    client.hello(loaded_version=0)
    assert _wait(lambda: coord.metrics()["transport/actors_alive"] == 1)
    assert client.eval_version == -1
    coord.start_eval(0, _val_records(3), GREEDY)
    assert _wait(lambda: client.eval_version == 0, poll=client.poll, timeout_s=1.0)
    got = [g for g in _collect(client, 2, loaded=0) if g.is_eval]  # credit for two: one prompt is left
    assert len(got) == 2 and client.eval_version == 0
    seen: list[tuple[int, int]] = []  # (eval grants received, eval_version) after each poll
    got += [g for g in client.request_work(4, 0) if g.is_eval]  # credit for the last prompt (and training work)

    def poll() -> None:
        client.poll()
        seen.append((len(got) + sum(g.is_eval for g in client.queued_grants), client.eval_version))

    assert _wait(lambda: client.eval_version == -1, poll=poll, timeout_s=1.0)
    assert seen[-1] == (3, -1)  # the last grant had arrived when the client learned that none is left
