"""Group validation through a real coordinator and RolloutClients over loopback ZeroMQ: an invalid group is refused
with a final ack, counted by reason, and its prompt granted again; an actor that keeps sending them is quarantined
(no grants, no weights, its groups refused, logged once) while the others go on."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from _plane_config import plane_config
from _plane_helpers import collect_grants as _collect
from _plane_helpers import wait_until as _wait

from async_rl.config import Config
from async_rl.transport import Coordinator, GroupSampling, PromptRecord, RolloutClient, make_completion
from async_rl.transport.protocol import PromptGrant, RolloutGroup

Factory = Callable[..., Coordinator]
ClientFactory = Callable[..., RolloutClient]
GroupMaker = Callable[..., RolloutGroup]
SAMPLING = GroupSampling.defaults(n=2, max_tokens=8)
VOCAB = 50  # records(n) prompts are [i, ..., i + 3]: every answer (conftest.answer) stays far below it


def fast(**overrides: Any) -> Config:
    return plane_config(heartbeat_interval_s=0.1, peer_timeout_s=1.0, **overrides)


def _out_of_vocab(make_group: GroupMaker, grant: PromptGrant, actor_id: str) -> RolloutGroup:
    group = make_group(grant, actor_id, version=0)
    bad = make_completion([3, 1_000_000], [-0.5, -0.5], version_min=0)  # the id that crashed the embedding
    return msgspec.structs.replace(group, completions=[group.completions[0], bad])


def _short(make_group: GroupMaker, grant: PromptGrant, actor_id: str) -> RolloutGroup:
    group = make_group(grant, actor_id, version=0)
    return msgspec.structs.replace(group, completions=group.completions[:-1])  # n - 1 completions


def test_an_out_of_vocab_group_is_refused_and_its_prompt_granted_again(
    coordinator_factory: Factory, client_factory: ClientFactory, make_group: GroupMaker
) -> None:
    coord = coordinator_factory(8, sampling=SAMPLING, vocab_size=VOCAB)
    bad = client_factory(coord.address, "bad")
    bad.hello()
    (grant,) = _collect(bad, 1, loaded=0)
    bad.send_group(_out_of_vocab(make_group, grant, "bad"))
    assert bad.wait_acked(3.0)  # the "invalid" ack is final: nothing is left to re-send
    assert bad.metrics()["transport/client/acks/invalid"] == 1
    m = coord.metrics()
    assert m["transport/drops/invalid_token_out_of_vocab"] == 1 and m["transport/drops_total"] == 1
    assert m["transport/regrant_queue"] == 1 and m["transport/queue_depth"] == 0
    assert m["transport/actors_quarantined"] == 0  # one strike of the default three

    good = client_factory(coord.address, "good")
    good.hello()
    (again,) = _collect(good, 1, loaded=0)
    assert again.prompt_id == grant.prompt_id and again.lease_id != grant.lease_id
    good.send_group(make_group(again, "good", version=0))
    assert good.wait_acked(3.0) and good.metrics()["transport/client/acks/accepted"] == 1
    (trained,) = coord.get_groups(1, timeout_s=2.0)
    assert trained.prompt_id == grant.prompt_id and trained.actor_id == "good"
    coord.check_invariants()


def test_a_group_with_too_few_completions_is_refused(
    coordinator_factory: Factory, client_factory: ClientFactory, make_group: GroupMaker
) -> None:
    coord = coordinator_factory(8, sampling=SAMPLING, vocab_size=VOCAB)
    client = client_factory(coord.address)
    client.hello()
    first, second = _collect(client, 2, loaded=0)
    client.send_group(_short(make_group, first, "actor-0"))
    client.send_group(make_group(second, "actor-0", version=0))
    assert client.wait_acked(3.0)
    m = coord.metrics()
    assert m["transport/drops/invalid_wrong_completion_count"] == 1
    assert m["transport/drops/invalid_token_out_of_vocab"] == 0
    assert m["transport/queue_depth"] == 1 and m["transport/regrant_queue"] == 1
    assert client.metrics()["transport/client/acks/invalid"] == 1
    assert client.metrics()["transport/client/acks/accepted"] == 1


def test_a_repeat_offender_is_quarantined_while_a_good_actor_goes_on(
    coordinator_factory: Factory,
    client_factory: ClientFactory,
    make_group: GroupMaker,
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = fast(max_invalid_groups=3)
    coord = coordinator_factory(32, s, sampling=SAMPLING, vocab_size=VOCAB)
    bad = client_factory(coord.address, "bad", cfg=s)
    good = client_factory(coord.address, "good", cfg=s)
    bad.hello()
    good.hello()
    grants = _collect(bad, 4, loaded=0)
    assert len(grants) == 4 and coord.live_actor_ids() == ["bad", "good"]
    with caplog.at_level(logging.WARNING, logger="async_rl.transport.coordinator"):
        bad.send_group(_out_of_vocab(make_group, grants[0], "bad"))
        bad.send_group(_short(make_group, grants[1], "bad"))
        assert bad.wait_acked(3.0)
        assert coord.metrics()["transport/actors_quarantined"] == 0  # two strikes
        bad.send_group(_out_of_vocab(make_group, grants[2], "bad"))  # the third: quarantined
        assert bad.wait_acked(3.0)
        m = coord.metrics()
        assert m["transport/actors_quarantined"] == 1
        assert m["transport/drops/invalid_token_out_of_vocab"] == 2
        assert m["transport/drops/invalid_wrong_completion_count"] == 1
        assert coord.actors()["bad"].leases == 0  # its fourth lease was released ...
        assert m["transport/regrant_queue"] == 4  # ... and joins the three refused prompts to be granted again
        assert coord.live_actor_ids() == ["good"]  # no weight updates for it
        bad.send_group(make_group(grants[3], "bad", version=0))  # even a well-formed group is refused now
        assert bad.wait_acked(3.0)
        assert bad.request_work(4, 0, timeout_s=0.3) == []
    m = coord.metrics()
    assert m["transport/drops/quarantined"] == 1 and m["transport/queue_depth"] == 0
    assert bad.metrics()["transport/client/acks/invalid"] == 4
    quarantine_logs = [r for r in caplog.records if "quarantined" in r.getMessage() and r.levelno == logging.WARNING]
    assert len(quarantine_logs) == 1 and "bad" in quarantine_logs[0].getMessage()
    # the good actor gets the released prompts first (the re-grant queue), then new data, and they are trained
    taken = _collect(good, 4, loaded=0)
    assert sorted(g.prompt_id for g in taken) == sorted(g.prompt_id for g in grants)
    for g in taken:
        good.send_group(make_group(g, "good", version=0))
    assert good.wait_acked(3.0)
    got = coord.get_groups(4, timeout_s=2.0)
    assert sorted(g.prompt_id for g in got) == sorted(g.prompt_id for g in grants)
    assert _wait(lambda: coord.actors()["bad"].credit == 0)  # its work requests earn it nothing
    coord.check_invariants()


def test_an_invalid_eval_group_is_refused_and_its_prompt_granted_again(
    coordinator_factory: Factory,
    client_factory: ClientFactory,
    make_group: GroupMaker,
    make_records: Callable[..., list[PromptRecord]],
) -> None:
    coord = coordinator_factory(8, sampling=SAMPLING, vocab_size=VOCAB)
    client = client_factory(coord.address)
    client.hello()
    round_id = coord.start_eval(0, make_records(1), GroupSampling.defaults(n=2, max_tokens=8))
    (grant,) = [g for g in _collect(client, 1, loaded=0) if g.is_eval]
    bad = msgspec.structs.replace(_out_of_vocab(make_group, grant, "actor-0"), eval_round=round_id)
    client.send_group(bad)
    assert client.wait_acked(3.0) and client.metrics()["transport/client/acks/invalid"] == 1
    assert coord.metrics()["transport/drops/invalid_token_out_of_vocab"] == 1
    assert not coord.wait_eval(round_id, timeout_s=0.0)
    (again,) = [g for g in _collect(client, 1, loaded=0) if g.is_eval]
    assert again.prompt_id == grant.prompt_id and again.lease_id != grant.lease_id
    client.send_group(msgspec.structs.replace(make_group(again, "actor-0", version=0), eval_round=round_id))
    assert coord.wait_eval(round_id, timeout_s=3.0)
    result = coord.finish_eval(round_id)
    assert result.complete and result.counters["invalid"] == 1
