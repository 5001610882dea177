"""The actor loop with eval grants, on the emulated engine (fixed token rate, real version tracking and pauses) and a
scripted client: an eval grant waits for exactly its pinned version, one pinned to a version the engine has moved
past is dropped unstarted, and a version published while a round on the loaded one runs here is received at once but
loaded only when this actor's part of the round is done (a newer one replacing it; a failed receive harmless)."""

from __future__ import annotations

from typing import Any

from _loop_fakes import InstantWeightSync, ScriptedClient, make_grant, make_plan, run_loop

from async_rl.actor.emulated import EmulatedEngine, EmulatedScorer
from async_rl.actor.loop import ActorLoop
from async_rl.transport.protocol import GroupSampling, PromptGrant, RolloutGroup
from async_rl.weight_sync.errors import WeightSyncError


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


def test_a_version_published_during_a_round_is_held_until_the_actors_part_is_done() -> None:
    engine = EmulatedEngine(40.0, response_len=4, version=1)  # 2 x 4 tokens at 40 tokens/s: 0.2 s per group
    # version 2 is published a few loop passes after the eval group started; a training grant needs version 2
    grants = [make_grant(0, min_version=1, eval_round=2), make_grant(5, min_version=2)]
    client = ScriptedClient(grants, publish=2, publish_when=lambda c: c.polls >= 3)
    sync = InstantWeightSync()
    loop = run_loop(engine, client, max_groups=2, max_concurrent_groups=4, weight_sync=sync)
    evaluation, train = client.sent
    assert evaluation.eval_round == 2 and _versions(evaluation) == [(1, 1), (1, 1)]  # the round kept its weights
    assert train.prompt_id == 5 and _versions(train) == [(2, 2), (2, 2)]  # started once version 2 was loaded
    assert sync.held == [2] and sync.loaded_held == [2] and sync.updates == []  # received at once, loaded after
    assert engine.version == 2 and loop.stats.updates_held == 1 and loop.metrics()["actor/updates_held"] == 1.0


class _RoundClient(ScriptedClient):
    """The coordinator still has prompts of the round on version 1 to grant until the 40th poll; versions 2 and 3 are
    published at polls 2 and 10."""

    def poll(self, timeout_s: float = 0.0) -> None:
        super().poll(timeout_s)
        self.eval_version = 1 if self.polls < 40 else -1
        for at, version in ((2, 2), (10, 3)):
            if self.polls == at:
                self.weight_sync = make_plan(version=version)


class _PollStamps(InstantWeightSync):
    def __init__(self, client: ScriptedClient) -> None:
        super().__init__()
        self.client = client
        self.loaded_at: list[int] = []

    async def load_staged(self, version: int) -> dict[str, Any]:
        self.loaded_at.append(self.client.polls)
        return await super().load_staged(version)


def test_a_held_version_waits_for_the_coordinators_last_prompts_and_a_newer_one_replaces_it() -> None:
    engine = EmulatedEngine(2000.0, response_len=4, version=1)
    client = _RoundClient([make_grant(5, min_version=3)])
    sync = _PollStamps(client)
    loop = run_loop(engine, client, max_groups=1, max_concurrent_groups=2, weight_sync=sync)
    assert sync.held == [2, 3] and sync.loaded_held == [3]  # version 3 replaced the held 2, which was never loaded
    assert sync.loaded_at[0] >= 40  # not before the coordinator said no prompt of the round is left to grant
    assert [_versions(g) for g in client.sent] == [[(3, 3), (3, 3)]] and loop.stats.updates_held == 1


def test_an_eval_grant_queued_in_the_client_holds_the_loaded_version() -> None:
    engine = EmulatedEngine(2000.0, response_len=4, version=1)
    client = ScriptedClient([])
    loop = ActorLoop(
        actor_id="a0", client=client, engine=engine, scorer=EmulatedScorer(), weight_sync=InstantWeightSync(),
        max_concurrent_groups=1, max_concurrent_eval=1, update_mode="inflight",
    )  # fmt: skip
    assert not loop._round_runs_here()
    client.queued_grants = (make_grant(0, min_version=1, eval_round=0),)  # received, not handed out yet
    assert loop._round_runs_here()
    client.queued_grants = (make_grant(0, min_version=0, eval_round=0), make_grant(1, min_version=1))
    assert not loop._round_runs_here()  # another version's round, and training work, hold nothing
    client.eval_version = 1
    assert loop._round_runs_here()


class _StageFails(InstantWeightSync):
    async def stage(self, version: int) -> dict[str, Any]:
        raise WeightSyncError("connection reset by peer")


def test_a_failed_receive_of_a_held_version_keeps_the_loaded_weights_serving() -> None:
    engine = EmulatedEngine(40.0, response_len=4, version=1)
    grants = [make_grant(0, min_version=1, eval_round=2), make_grant(5, min_version=1)]
    client = ScriptedClient(grants, publish=2, publish_when=lambda c: c.polls >= 3)
    sync = _StageFails()
    loop = run_loop(engine, client, max_groups=2, max_concurrent_groups=1, weight_sync=sync)
    assert sorted(g.prompt_id for g in client.sent) == [0, 5]  # both generated on version 1 after the failure
    assert all(_versions(g) == [(1, 1), (1, 1)] for g in client.sent)
    assert loop.stats.update_failures == 1 and sync.held == [] and engine.version == 1
    assert sync.announced  # out of the group's epoch: it announces itself for the next one


class _CountingEngine(EmulatedEngine):
    """Records how many eval and training groups generate at once."""

    def __init__(self) -> None:
        super().__init__(200.0, response_len=4)  # 4 tokens per sample at 200 tokens/s: each group runs a while
        self.running = {True: 0, False: 0}
        self.peak = {True: 0, False: 0}

    async def generate(self, prompt_token_ids: Any, sampling: Any) -> Any:
        kind = sampling.n == 1  # the round's prompts have one sample, the training groups two
        self.running[kind] += 1
        self.peak[kind] = max(self.peak[kind], self.running[kind])
        try:
            return await super().generate(prompt_token_ids, sampling)
        finally:
            self.running[kind] -= 1


def test_a_round_fills_its_own_cap_while_training_keeps_its_own() -> None:
    """Validation prompts count against max_concurrent_eval, not against the training groups' cap: a round of
    one-sample prompts runs as many at once as the training groups' samples would (counted as groups, 2 at a time)."""
    engine = _CountingEngine()
    one = GroupSampling.defaults(n=1, temperature=0.0, max_tokens=4)
    grants = [make_grant(i, min_version=0, eval_round=0, sampling=one) for i in range(10)]
    grants += [make_grant(100 + i, min_version=0) for i in range(4)]
    client = ScriptedClient(grants)
    client.eval_version = 0  # the coordinator still has prompts of a round on the loaded version to grant
    loop = run_loop(engine, client, max_groups=14, max_concurrent_groups=2, max_concurrent_eval=8)
    assert sorted(g.prompt_id for g in client.sent) == [*range(10), 100, 101, 102, 103]  # nothing lost or repeated
    assert engine.peak[True] == 8  # the round filled its cap ...
    assert engine.peak[False] == 2  # ... and training groups never exceeded theirs
    assert loop.stats.eval_groups_sent == 10


def test_without_an_open_round_credit_is_the_training_cap() -> None:
    engine = _CountingEngine()
    client = ScriptedClient([make_grant(100 + i, min_version=0) for i in range(6)])
    requested: list[int] = []
    request = client.request_work

    def recording(max_groups: int, loaded_version: int, timeout_s: float = 0.0) -> list[PromptGrant]:
        requested.append(max_groups)
        return request(max_groups, loaded_version, timeout_s)

    client.request_work = recording  # type: ignore[method-assign]
    run_loop(engine, client, max_groups=6, max_concurrent_groups=3, max_concurrent_eval=50)
    assert max(requested) == 3 and engine.peak[False] == 3
