"""The actor loop with eval grants, on the emulated engine (fixed token rate, real version tracking and pauses) and a
scripted client: an eval grant waits for exactly its pinned version, one pinned to a version the engine has moved
past is dropped unstarted, and a weight update during an eval request shows in the version span it reports."""

from __future__ import annotations

from _loop_fakes import ScriptedClient, make_grant, run_loop

from async_rl.actor.emulated import EmulatedEngine
from async_rl.actor.loop import ActorLoop
from async_rl.transport.protocol import RolloutGroup


def _run(engine: EmulatedEngine, client: ScriptedClient, max_groups: int) -> ActorLoop:
    return run_loop(engine, client, max_groups=max_groups, max_concurrent_groups=4)


def _versions(group: RolloutGroup) -> list[tuple[int, int]]:
    return [(c.version_min, c.version_max) for c in group.completions]


def test_an_eval_grant_waits_for_its_pinned_version() -> None:
    engine = EmulatedEngine(2000.0, response_len=4)  # version 0: 2 x 4 tokens = 4 ms per group
    # The round is pinned to version 1; the training grant may start on version 0 (min_version 0).
    client = ScriptedClient(
        [make_grant(0, min_version=1, eval_round=5), make_grant(7, min_version=0)],
        publish=1,
        publish_when=lambda c: len(c.sent) >= 1,  # version 1 is published after the training group came back
    )
    loop = _run(engine, client, max_groups=2)
    train, evaluation = client.sent
    assert (train.prompt_id, train.eval_round, _versions(train)) == (7, -1, [(0, 0), (0, 0)])
    assert (evaluation.prompt_id, evaluation.eval_round) == (0, 5)
    assert _versions(evaluation) == [(1, 1), (1, 1)]  # generated entirely under the pinned version
    assert loop.stats.eval_groups_sent == 1
    assert loop.weight_sync is not None and loop.weight_sync.updates == [1]  # type: ignore[attr-defined]


def test_an_eval_grant_for_an_older_version_is_dropped_unstarted() -> None:
    engine = EmulatedEngine(2000.0, response_len=4, version=2)
    client = ScriptedClient([make_grant(0, min_version=1, eval_round=0), make_grant(9, min_version=1)])
    loop = _run(engine, client, max_groups=1)
    assert [g.prompt_id for g in client.sent] == [9]  # training work at min_version 1 runs on version 2 ...
    assert loop.stats.eval_grants_dropped == 1  # ... the round pinned to 1 cannot, and is left to the coordinator
    assert engine.stats.requests == 1 and loop.metrics()["actor/eval_grants_dropped"] == 1.0


def test_a_weight_update_during_an_eval_request_shows_in_its_version_span() -> None:
    engine = EmulatedEngine(40.0, response_len=4, version=1)  # 2 x 4 tokens at 40 tokens/s: 0.2 s per group
    # version 2 is published a few loop passes after the eval group started (an in-flight update)
    grants = [make_grant(0, min_version=1, eval_round=2)]
    client = ScriptedClient(grants, publish=2, publish_when=lambda c: c.polls >= 3)
    loop = _run(engine, client, max_groups=1)
    (group,) = client.sent
    assert group.eval_round == 2 and _versions(group) == [(1, 2), (1, 2)]  # the coordinator will grant it again
    assert engine.version == 2 and loop.stats.eval_groups_sent == 1
