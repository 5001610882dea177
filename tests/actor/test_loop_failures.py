"""Failures that must end an actor at once rather than leave it silent: a dead vLLM engine, and a weight update that
does not fit the model (a tensor left out, e.g. tied embeddings). Both used to stall the learner: the first until
the weight-sync rendezvous timed out (600 s), the second forever (the actor paused, waiting for a good update)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from _loop_fakes import InstantWeightSync, ScriptedClient, make_grant, make_plan

from async_rl.actor.emulated import EmulatedEngine, EmulatedScorer
from async_rl.actor.engine import EngineDead, EngineOutput
from async_rl.actor.loop import ActorFailed, ActorLoop
from async_rl.transport.protocol import GroupSampling
from async_rl.weight_sync.errors import WeightMismatchError, WeightSyncError
from async_rl.weight_sync.membership import JoinInfo


class _DyingEngine(EmulatedEngine):
    """Generates normally for ``good`` requests, then its engine core 'dies' (as vLLM's EngineDeadError)."""

    def __init__(self, good: int) -> None:
        super().__init__(2000.0, response_len=4)
        self.good = good
        self.dead = False

    async def generate(self, prompt_token_ids: list[int], sampling: GroupSampling) -> list[EngineOutput]:
        if self.stats.requests >= self.good:
            self.dead = True
            raise EngineDead("the vLLM engine died while generating g3-v0: EngineDeadError()")
        return await super().generate(prompt_token_ids, sampling)


class _FailingWeightSync(InstantWeightSync):
    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error
        self.attempts = 0

    async def update(self, version: int) -> dict[str, Any]:
        self.attempts += 1
        raise self.error


def _loop(engine: EmulatedEngine, client: ScriptedClient, weight_sync: Any, max_groups: int | None) -> ActorLoop:
    return ActorLoop(
        actor_id="a0",
        client=client,
        engine=engine,
        scorer=EmulatedScorer(),
        weight_sync=weight_sync,
        max_concurrent_groups=1,
        max_concurrent_eval=1,
        max_groups=max_groups,
        update_mode="inflight",
        poll_interval_s=0.005,
    )


def test_a_dead_engine_ends_the_actor_with_the_cause() -> None:
    engine = _DyingEngine(good=2)
    client = ScriptedClient([make_grant(i, min_version=0) for i in range(10)])
    loop = _loop(engine, client, InstantWeightSync(), max_groups=None)
    with pytest.raises(ActorFailed, match="a0: the vLLM engine died while generating"):
        asyncio.run(asyncio.wait_for(loop.run(), timeout=10.0))
    assert [g.prompt_id for g in client.sent] == [0, 1]  # what finished before the death was still delivered


def test_a_weight_update_that_does_not_fit_the_model_ends_the_actor() -> None:
    error = WeightMismatchError("tensor 'lm_head.weight' left out of the update", tensor="lm_head.weight")
    sync = _FailingWeightSync(error)
    client = ScriptedClient([make_grant(i, min_version=0) for i in range(10)], publish=1)
    loop = _loop(EmulatedEngine(2000.0, response_len=4), client, sync, max_groups=None)
    with pytest.raises(ActorFailed, match=r"version 1 does not fit .*'lm_head.weight' left out of the update"):
        asyncio.run(asyncio.wait_for(loop.run(), timeout=10.0))
    assert sync.attempts == 1 and loop.stats.update_failures == 1


def test_a_broken_transfer_still_only_pauses_the_actor() -> None:
    sync = _FailingWeightSync(WeightSyncError("broadcast of bucket 3 failed: connection reset"))
    client = ScriptedClient([make_grant(0, min_version=0)], publish=1)
    loop = _loop(EmulatedEngine(2000.0, response_len=4), client, sync, max_groups=None)

    async def run_a_while() -> None:
        task = asyncio.ensure_future(loop.run())
        await asyncio.sleep(0.3)
        assert not task.done()  # still alive, waiting for a re-formed update
        client.shutdown_requested = True
        await asyncio.wait_for(task, timeout=5.0)

    asyncio.run(run_a_while())
    assert sync.attempts == 1 and loop.stats.update_failures == 1


def test_an_actor_not_invited_announces_itself_once_per_epoch_and_keeps_generating() -> None:
    sync = InstantWeightSync()
    client = ScriptedClient([make_grant(i, min_version=0) for i in range(3)])
    client.weight_sync = make_plan(("other",), epoch=0, version=1)
    loop = _loop(EmulatedEngine(2000.0, response_len=4), client, sync, max_groups=3)
    asyncio.run(asyncio.wait_for(loop.run(), timeout=10.0))
    assert len(sync.announced) == 1 and sync.joins == [] and sync.updates == []
    assert [g.prompt_id for g in client.sent] == [0, 1, 2]  # version 0 weights are still good for these grants


class _LeftOutWeightSync(InstantWeightSync):
    async def join(self, info: JoinInfo) -> None:
        self.joins.append(info)
        raise WeightSyncError("actor a0 was not ready in time for weight-sync epoch 3; it announces itself again")


def test_an_actor_left_out_of_an_epoch_keeps_its_weights_and_announces_again() -> None:
    sync = _LeftOutWeightSync()
    client = ScriptedClient([make_grant(i, min_version=0) for i in range(3)])
    client.weight_sync = make_plan(("a0",), epoch=3, version=1)
    loop = _loop(EmulatedEngine(2000.0, response_len=4), client, sync, max_groups=3)
    asyncio.run(asyncio.wait_for(loop.run(), timeout=10.0))
    assert [j.member for j in sync.joins] == ["a0"] and sync.joins[0].plan.epoch == 3  # one try per epoch
    assert loop.stats.joins_left_out == 1 and loop.stats.update_failures == 0
    assert len(sync.announced) == 1  # a fresh announcement: the learner may invite it to a later epoch
    assert [g.prompt_id for g in client.sent] == [0, 1, 2] and loop.engine.version == 0


class _FailsOnce(InstantWeightSync):
    """The first transfer breaks half-way (the model is half loaded); later ones succeed."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    async def update(self, version: int) -> dict[str, Any]:
        if not self.failed:
            self.failed = True
            raise WeightSyncError("broadcast of bucket 3 failed: connection reset")
        return await super().update(version)


def test_a_broken_transfer_aborts_running_groups_until_a_later_update_succeeds() -> None:
    """One pause/resume path, the engine's: a failed load aborts what runs and keeps the engine paused (no token of
    a half-loaded model is sampled); the next update, to a re-formed group, resumes it on the new weights."""
    engine = EmulatedEngine(20.0, response_len=4)  # 2 x 4 tokens at 20 tokens/s: 0.4 s per group
    sync = _FailsOnce()
    client = ScriptedClient(
        [make_grant(i, min_version=0) for i in range(2)], publish=1, publish_when=lambda c: c.polls >= 3
    )
    loop = _loop(engine, client, sync, max_groups=1)

    async def until(pred: Any) -> None:
        for _ in range(400):
            if pred():
                return
            await asyncio.sleep(0.005)
        raise AssertionError("timed out")

    async def run() -> None:
        task = asyncio.ensure_future(loop.run())
        await until(lambda: loop.stats.groups_aborted == 1)  # prompt 0 was running when the transfer broke
        assert sync.failed and engine.pacer.paused and engine.version == 0 and client.sent == []
        await asyncio.sleep(0.1)
        assert client.grants and client.sent == []  # invalid weights: no new work is even asked for
        client.weight_sync = make_plan(("a0",), epoch=1, version=2)  # the learner re-forms the group
        await asyncio.wait_for(task, timeout=5.0)

    asyncio.run(run())
    assert sync.updates == [2] and engine.version == 2 and not engine.pacer.paused
    assert [(g.prompt_id, g.version) for g in client.sent] == [(1, 2)]  # generated on the new weights only
    assert loop.stats.update_failures == 1 and [j.plan.epoch for j in sync.joins] == [0, 1]


class _LoRAEngine(EmulatedEngine):
    """Serves 'adapters': after an update its probe log-probs are ``served`` (a stuck adapter: not the learner's)."""

    def __init__(self, served: list[float]) -> None:
        super().__init__(2000.0, response_len=4)
        self.lora = True
        self.served = served

    def adapter_dir(self, version: int) -> str:
        return f"/nonexistent/v{version}"

    async def probe(self, token_ids: list[int]) -> list[float]:
        assert len(token_ids) == len(self.served) + 1
        return self.served


class _AdapterSync(InstantWeightSync):
    async def update_adapter(self, version: int, adapter_dir: str, adapter_config: dict[str, Any]) -> dict[str, Any]:
        assert adapter_dir.endswith(f"/v{version}") and adapter_config["r"] == 8
        return await self.update(version)


def _lora_plan(learner_logprobs: list[float]) -> Any:
    import msgspec

    from async_rl.transport.protocol import AdapterPlan, ServedCheck

    check = ServedCheck(token_ids=(1, 2, 3, 4), logprobs=tuple(learner_logprobs), tolerance=1e-3)
    adapter = AdapterPlan(rank=8, alpha=16.0, target_modules=("q_proj", "v_proj"))
    return msgspec.structs.replace(make_plan(("a0",), epoch=0, version=1), adapter=adapter, served_check=check)


@pytest.mark.parametrize("stuck", [False, True])
def test_an_actor_whose_served_adapter_is_not_the_learners_stops_generating(stuck: bool) -> None:
    learner = [-1.0, -2.0, -0.5]
    engine = _LoRAEngine([-1.3, -2.4, -0.1] if stuck else [-1.0002, -2.0, -0.4999])
    client = ScriptedClient([make_grant(i, min_version=1) for i in range(3)])
    client.weight_sync = _lora_plan(learner)
    loop = _loop(engine, client, _AdapterSync(), max_groups=3)

    async def run_a_while() -> None:
        task = asyncio.ensure_future(loop.run())
        await asyncio.sleep(0.5)
        client.shutdown_requested = True
        await asyncio.wait_for(task, timeout=5.0)

    asyncio.run(run_a_while())
    assert engine.version == 1 and loop.stats.served_checks == 1
    if stuck:  # loudly out of work, not silently training on samples of the wrong policy
        assert loop.stats.served_check_failures == 1 and loop.stats.served_check_diff == pytest.approx(1.1 / 3)
        assert client.sent == []
    else:
        assert loop.stats.served_check_failures == 0 and loop.stats.served_check_diff < 1e-3
        assert [g.prompt_id for g in client.sent] == [0, 1, 2]


def test_a_served_check_that_cannot_run_is_logged_and_the_update_stands(caplog: pytest.LogCaptureFixture) -> None:
    class _NoProbe(_LoRAEngine):
        async def probe(self, token_ids: list[int]) -> list[float]:
            raise ValueError("prompt longer than max_model_len")

    engine = _NoProbe([-1.0, -2.0, -0.5])
    client = ScriptedClient([make_grant(i, min_version=1) for i in range(3)])
    client.weight_sync = _lora_plan([-1.0, -2.0, -0.5])
    loop = _loop(engine, client, _AdapterSync(), max_groups=3)
    asyncio.run(asyncio.wait_for(loop.run(), timeout=10.0))
    assert engine.version == 1 and loop.stats.update_failures == 0 and loop.stats.served_checks == 0
    assert [g.prompt_id for g in client.sent] == [0, 1, 2]
    assert any("served-weights check of version 1 could not run" in r.message for r in caplog.records)
