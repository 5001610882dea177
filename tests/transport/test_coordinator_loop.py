"""Coordinator + RolloutClient over real loopback sockets, in one process: joining, credits and admission, the
staleness bound, K = 0 synchrony, liveness, oversize reporting, and the learner API's argument checks."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np
import pytest
import zmq
from _plane_config import coordinator, plane_config
from _plane_helpers import collect_grants as _collect
from _plane_helpers import wait_until as _wait

from async_rl.config import Config
from async_rl.transport import (
    Coordinator,
    GroupSampling,
    MessageTooLarge,
    PromptRecord,
    RolloutClient,
)
from async_rl.transport.admission import inflight_cap
from async_rl.transport.protocol import RolloutGroup, WeightSyncPlan, group_seed

Factory = Callable[..., Coordinator]
ClientFactory = Callable[..., RolloutClient]
GroupMaker = Callable[..., RolloutGroup]


def fast(**overrides: Any) -> Config:
    """A test config with quick liveness: heartbeats every 0.1 s, a peer is dead after 1 s of silence."""
    return plane_config(heartbeat_interval_s=0.1, peer_timeout_s=1.0, **overrides)


def test_hello_gets_welcome_with_version_and_weight_sync(coordinator_factory: Factory, client_factory: ClientFactory):
    coord = coordinator_factory(initial_version=3)
    plan = WeightSyncPlan(
        host="10.0.0.1", port=29500, backend="gloo", timeout_s=60.0, join_timeout_s=10.0, version=-1, epoch=-1,
        candidates=(),
    )  # fmt: skip
    coord.set_policy_version(3, weight_sync=plan)  # the publisher's plan before any epoch: where to announce
    assert coord.address.startswith("tcp://127.0.0.1:")
    assert "transport/actors/loaded_version_min" not in coord.metrics()  # no live actor: nothing to report
    client = client_factory(coord.address)
    welcome = client.hello(loaded_version=3)
    assert welcome.policy_version == 3
    assert welcome.min_version == 2  # 3 - K with the default K = 1
    assert welcome.weight_sync == plan and client.weight_sync == plan  # typed, field for field
    assert _wait(lambda: coord.metrics()["transport/actors_alive"] == 1)
    invited = msgspec.structs.replace(plan, version=4, epoch=0, candidates=("actor-0",))
    coord.set_policy_version(4, weight_sync=invited)
    assert _wait(lambda: client.weight_sync == invited, poll=client.poll)  # it rides on the VersionUpdate
    with pytest.raises(ValueError, match="WeightSyncPlan"):
        coord.set_policy_version(5, weight_sync={"host": "10.0.0.1"})  # type: ignore[arg-type]


def test_grants_carry_prompt_data_and_are_capped_by_admission(
    coordinator_factory: Factory, client_factory: ClientFactory, make_group: GroupMaker
) -> None:
    s = fast(max_staleness=1, groups_per_step=2)  # cap = (1 + 1) x 2 = 4
    coord = coordinator_factory(8, s)
    client = client_factory(coord.address, cfg=s)
    client.hello()
    grants = _collect(client, 10, loaded=0, timeout_s=1.0)
    assert [g.prompt_id for g in grants] == [0, 1, 2, 3]  # only 4 despite asking for 10
    assert grants[1].prompt_token_ids.length == 4 and grants[1].extras == {"ground_truth": "1"}
    n = grants[1].sampling.n
    assert [g.sampling.seed for g in grants] == [group_seed(0, g.prompt_id, n) for g in grants]  # per prompt
    for g in grants:
        client.send_group(make_group(g, "actor-0", version=0))
    assert client.wait_acked(3.0)
    assert client.metrics()["transport/client/acks/accepted"] == 4
    assert client.request_work(10, 0, timeout_s=0.3) == []  # buffer full: not granted, the actor waits
    assert coord.metrics()["transport/credit_waits"] >= 1
    groups = coord.get_groups(2, timeout_s=2.0)
    coord.mark_trained([g.prompt_id for g in groups])  # frees 2 cap slots, but version 1 is not published yet:
    # new prompts would queue behind the 2 buffered groups and be trained at version 2, so they must start under >= 1
    assert client.request_work(10, 0, timeout_s=0.3) == []
    coord.set_policy_version(1)
    assert client.request_work(10, 0, timeout_s=0.3) == []  # the actor still has version 0 loaded
    more = _collect(client, 2, loaded=1, timeout_s=2.0)
    assert [g.prompt_id for g in more] == [4, 5] and {g.min_version for g in more} == {1}
    m = coord.metrics()
    assert m["transport/in_flight"] == 4 and m["transport/trained_total"] == 2


def test_synchronous_mode_k0_grants_the_next_step_only_after_train_and_version(
    coordinator_factory: Factory, client_factory: ClientFactory, make_group: GroupMaker
) -> None:
    s = fast(max_staleness=0, groups_per_step=3)
    coord = coordinator_factory(30, s)
    client = client_factory(coord.address, cfg=s)
    client.hello()
    for version in range(3):
        grants = _collect(client, 3, loaded=version)
        assert len(grants) == 3 and all(g.min_version == version for g in grants)
        assert client.request_work(5, version, timeout_s=0.2) == []  # nothing beyond this step's groups
        for g in grants:
            client.send_group(make_group(g, "actor-0", version=version))
        groups = coord.get_groups(3, timeout_s=3.0)
        assert {g.version for g in groups} == {version}
        coord.mark_trained([g.prompt_id for g in groups])
        assert client.request_work(5, version, timeout_s=0.2) == []  # trained, but no new version yet
        coord.set_policy_version(version + 1)
        assert client.request_work(5, version, timeout_s=0.2) == []  # actor still on the old weights
    assert coord.metrics()["transport/staleness/0"] == 9  # 3 steps x 3 groups, all at staleness 0


def test_stale_groups_are_never_returned(
    coordinator_factory: Factory, client_factory: ClientFactory, make_group: GroupMaker
) -> None:
    s = fast(max_staleness=1, groups_per_step=2, stale_policy="regrant")
    coord = coordinator_factory(8, s)
    client = client_factory(coord.address, cfg=s)
    client.hello()
    grants = _collect(client, 4, loaded=0)
    client.send_group(make_group(grants[0], "actor-0", version=0))  # buffered at version 0
    assert client.wait_acked(2.0)
    coord.set_policy_version(2)  # 2 - 0 > K = 1: the buffered group is now stale
    client.send_group(make_group(grants[1], "actor-0", version=0))  # stale on arrival
    client.send_group(make_group(grants[2], "actor-0", version=1, version_max=2))  # 2 - 1 <= 1: fine
    assert client.wait_acked(2.0)
    assert client.metrics()["transport/client/acks/stale"] == 1
    (group,) = coord.get_groups(1, timeout_s=2.0)
    assert group.prompt_id == grants[2].prompt_id
    m = coord.metrics()
    assert m["transport/drops/stale"] == 2
    assert m["transport/version_span/1"] == 1  # the group spanning versions 1..2
    assert m["transport/regrant_queue"] == 2  # regrant policy: both stale prompts will be generated again
    coord.check_invariants()


def test_silent_actor_is_presumed_dead_and_its_late_work_is_still_accepted(
    coordinator_factory: Factory, client_factory: ClientFactory, make_group: GroupMaker
) -> None:
    coord = coordinator_factory(8)
    client = client_factory(coord.address)
    client.hello()
    grants = _collect(client, 2, loaded=0)
    t0 = time.monotonic()
    assert _wait(lambda: coord.metrics()["transport/lease_expiries"] == 2, timeout_s=3.0)  # client is not polling
    detected_after = time.monotonic() - t0
    assert 0.9 < detected_after < 1.6  # peer_timeout_s = 1.0, plus a scheduling tick
    assert coord.metrics()["transport/actors_alive"] == 0
    client.send_group(make_group(grants[0], "actor-0", version=0))  # comes back: rejoins, delivers late
    assert client.wait_acked(2.0)
    assert client.metrics()["transport/client/acks/accepted"] == 1
    m = coord.metrics()
    assert m["transport/late_accepted"] == 1 and m["transport/actors_alive"] == 1
    assert client.metrics()["transport/client/rejoins"] == 1


def test_client_reconnects_and_resends_to_a_restarted_coordinator(
    coordinator_factory: Factory, client_factory: ClientFactory, make_group: GroupMaker
) -> None:
    first = coordinator_factory(8)
    client = client_factory(first.address, ack_timeout_s=0.3)
    client.hello()
    grants = _collect(client, 2, loaded=0)
    state = first.state_dict()  # the learner checkpoints with 2 prompts leased out
    first.close(notify_actors=False)  # the coordinator dies without a word
    for g in grants:
        client.send_group(make_group(g, "actor-0", version=0))  # nobody acks: kept
    assert client.unacked == 2
    assert _wait(lambda: client.metrics().get("transport/client/reconnects", 0) >= 1, 3.0, client.poll)
    assert client.unacked == 2  # a lost coordinator does not lose finished work
    second = coordinator_factory(8, fast(port=first.port), autostart=False)
    second.load_state_dict(state)
    second.start()
    assert client.wait_acked(5.0)  # Hello + re-sent groups reach the new coordinator: late accepts
    groups = second.get_groups(2, timeout_s=2.0)
    assert sorted(g.prompt_id for g in groups) == [0, 1]
    assert second.metrics()["transport/late_accepted"] == 2


def test_oversize_group_is_reported_by_the_sender(
    coordinator_factory: Factory, client_factory: ClientFactory, make_group: GroupMaker
) -> None:
    s = fast(max_message_bytes=4096)
    coord = coordinator_factory(4, s)
    client = client_factory(coord.address, cfg=s)
    client.hello()
    (grant, *_) = _collect(client, 1, loaded=0)
    small = make_group(grant, "actor-0", version=0)
    big = RolloutGroup(prompt_id=small.prompt_id, lease_id=small.lease_id, actor_id="actor-0", completions=[])
    big.completions = [small.completions[0]] * 200  # 200 x (5 tokens x 8 bytes) = 8000 bytes of arrays > 4096
    with pytest.raises(MessageTooLarge, match="4096"):
        client.send_group(big)
    assert client.metrics()["transport/client/oversize"] == 1
    assert client.unacked == 0  # nothing tracked, nothing sent: the caller must shrink the group
    client.send_group(small)
    assert client.wait_acked(2.0)


def test_zmq_itself_drops_an_oversize_message_silently(coordinator_factory: Factory) -> None:
    """Why senders must check sizes: past MAXMSGSIZE zmq just disconnects the peer, the receiver sees nothing."""
    coord = coordinator_factory(4, fast(max_message_bytes=4096))
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.ROUTING_ID, b"big")
    sock.connect(coord.address)
    sock.send(b"\x00" * 10_000)  # 10,000 bytes > 4096
    time.sleep(0.3)
    sock.close(linger=0)
    ctx.term()
    m = coord.metrics()
    assert m["transport/decode_errors_total"] == 0 and m["transport/groups_received_total"] == 0


def test_a_prompt_that_cannot_fit_in_a_grant_is_dropped_and_counted(
    coordinator_factory: Factory, client_factory: ClientFactory, make_records: Callable
) -> None:
    recs = make_records(3)
    recs[1] = PromptRecord(np.zeros(2000, dtype=np.int32))  # 8000 bytes of tokens > max_message_bytes = 4096
    s = fast(max_message_bytes=4096)
    coord = coordinator_factory(cfg=s, records=recs, max_epochs=1)
    client = client_factory(coord.address, cfg=s)
    client.hello()
    grants = _collect(client, 3, loaded=0, timeout_s=1.0)
    assert [g.prompt_id for g in grants] == [0, 2]
    m = coord.metrics()
    assert m["transport/drops/oversize"] == 1 and m["transport/send_failures/oversize"] == 1


def test_learner_api_checks_arguments(coordinator_factory: Factory, client_factory: ClientFactory) -> None:
    coord = coordinator_factory(4, fast(groups_per_step=2))
    with pytest.raises(ValueError, match="num_groups"):
        coord.get_groups(0, timeout_s=None)
    with pytest.raises(ValueError, match="admission cap 4"):
        coord.get_groups(5, timeout_s=None)  # could never be satisfied
    with pytest.raises(TimeoutError, match="0 of 1"):
        coord.get_groups(1, timeout_s=0.1)
    coord.set_policy_version(2)
    with pytest.raises(ValueError, match="must not decrease"):
        coord.set_policy_version(1)
    with pytest.raises(ValueError, match="prompt_ids"):
        coord.mark_trained([0])
    other = coordinator_factory(4)
    client = client_factory(other.address)
    client.hello()
    assert _collect(client, 1, loaded=0)
    with pytest.raises(ValueError, match="before any work is granted"):
        other.load_state_dict(coord.state_dict())
    assert all(key.startswith("transport/") for key in coord.metrics())
    with pytest.raises(ValueError, match=r"GroupSampling: Expected `float` <= 1.0 - at `\$.top_p`"):
        coordinator([PromptRecord(np.arange(2))], fast(), sampling=GroupSampling.defaults(top_p=1.5), seed=0)


def test_the_inflight_cap_is_derived_when_the_config_leaves_it_null(coordinator_factory: Factory) -> None:
    assert inflight_cap(None, max_staleness=2, groups_per_step=4) == 12  # (2 + 1) x 4
    assert inflight_cap(5, max_staleness=2, groups_per_step=4) == 5
    assert coordinator_factory(4, fast(max_staleness=2, groups_per_step=4)).inflight_cap == 12
    assert coordinator_factory(4, fast(groups_per_step=4, max_inflight_groups=7)).inflight_cap == 7
    with pytest.raises(TypeError, match="hots"):
        fast(hots="127.0.0.1")  # the test helper refuses a typo too


def test_grants_follow_weights_actually_sent_not_an_actors_claim(
    coordinator_factory: Factory, client_factory: ClientFactory, make_group: GroupMaker
) -> None:
    s = fast(max_staleness=0, groups_per_step=2)  # K = 0: work at version 1 needs version 1 weights
    coord = coordinator_factory(8, s, trust_claimed_versions=False)
    liar = client_factory(coord.address, "liar", cfg=s)
    honest = client_factory(coord.address, "honest", cfg=s)
    liar.hello(loaded_version=0)
    honest.hello(loaded_version=0)
    first = _collect(liar, 2, loaded=0, timeout_s=1.0)  # version 0 is where every actor starts: no transfer needed
    assert [g.min_version for g in first] == [0, 0]
    for g in first:
        liar.send_group(make_group(g, "liar", version=0))
    assert liar.wait_acked(3.0)
    coord.mark_trained([g.prompt_id for g in coord.get_groups(2, timeout_s=2.0)])
    coord.set_policy_version(1)
    assert _collect(liar, 2, loaded=1, timeout_s=0.5) == []  # claims version 1, but was never sent it
    coord.confirm_weights(1, ["honest"])
    assert {g.min_version for g in _collect(honest, 2, loaded=1, timeout_s=2.0)} == {1}
    assert coord.actors()["liar"].loaded_version == 0 and coord.actors()["honest"].loaded_version == 1
    m = coord.metrics()  # the versions the live actors serve, on every step's line
    assert (m["transport/actors/loaded_version_min"], m["transport/actors/loaded_version_max"]) == (0, 1)


def test_actors_are_told_at_once_while_the_learner_waits_for_them(
    coordinator_factory: Factory, client_factory: ClientFactory
) -> None:
    """The coordinator's heartbeat carries whether the learner is blocked in get_groups (it may lend its cores to
    the actors then); sent when that changes, not a heartbeat interval later."""
    import threading

    s = plane_config(heartbeat_interval_s=30.0)  # no periodic heartbeat within the test: only the immediate ones
    coord = coordinator_factory(8, s)
    client = client_factory(coord.address, cfg=s)
    client.hello()
    assert _wait(lambda: coord.metrics()["transport/actors_alive"] == 1)
    # a new actor's first heartbeat goes at once, not a heartbeat interval (30 s here) later
    assert _wait(lambda: client.learner_waiting is False, poll=client.poll, timeout_s=1.0)
    learner = threading.Thread(target=lambda: pytest.raises(TimeoutError, coord.get_groups, 1, timeout_s=1.5))
    learner.start()
    assert _wait(lambda: client.learner_waiting, poll=client.poll, timeout_s=1.0)
    learner.join()
    assert _wait(lambda: not client.learner_waiting, poll=client.poll, timeout_s=1.0)


def test_a_learner_waiting_for_the_weight_sync_roster_is_told_too(
    coordinator_factory: Factory, client_factory: ClientFactory
) -> None:
    """learner_waits(): the publisher's wait for actors to join an epoch lets them lend it cores, as get_groups does."""
    s = plane_config(heartbeat_interval_s=30.0)
    coord = coordinator_factory(8, s)
    client = client_factory(coord.address, cfg=s)
    client.hello()
    assert _wait(lambda: coord.metrics()["transport/actors_alive"] == 1)
    with coord.learner_waits():
        assert _wait(lambda: client.learner_waiting, poll=client.poll, timeout_s=1.0)
    assert _wait(lambda: not client.learner_waiting, poll=client.poll, timeout_s=1.0)


def test_a_learner_polling_in_slices_is_told_as_one_wait(
    coordinator_factory: Factory, client_factory: ClientFactory
) -> None:
    """The learner waits in slices (get_groups with a timeout, again and again); the moments between two slices
    must not reach the actors, who would give the lent cores back and take them again each time."""
    import threading

    from async_rl.transport.protocol import Heartbeat

    s = plane_config(heartbeat_interval_s=30.0)
    coord = coordinator_factory(8, s)
    client = client_factory(coord.address, cfg=s)
    client.hello()
    assert _wait(lambda: coord.metrics()["transport/actors_alive"] == 1)
    told: list[bool] = []
    handle = client._handle

    def spy(msg: Any) -> None:
        if isinstance(msg, Heartbeat):
            told.append(msg.learner_waiting)
        handle(msg)

    client._handle = spy  # type: ignore[method-assign]

    def learner() -> None:
        for _ in range(6):  # six slices of 0.15 s, a millisecond apart
            with pytest.raises(TimeoutError):
                coord.get_groups(1, timeout_s=0.15)
            time.sleep(0.001)

    thread = threading.Thread(target=learner)
    thread.start()
    while thread.is_alive():
        client.poll()
        time.sleep(0.005)
    assert _wait(lambda: not client.learner_waiting, poll=client.poll, timeout_s=1.0)
    assert told == [True, False]
