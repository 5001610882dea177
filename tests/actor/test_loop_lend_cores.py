"""Lending the learner's idle cores to the actor's engine (``async_training.actor.lend_learner_cores``): the loop sets
the engine's thread count from the coordinator's word that the learner waits, and the actor's start-up binds vLLM
to every core of the process only when the key is on and no binding was set."""

from __future__ import annotations

import logging

import pytest
from _loop_fakes import ScriptedClient, make_grant, run_loop

from async_rl.actor.emulated import EmulatedEngine
from async_rl.actor.loop import ActorLoop
from async_rl.config import load_config
from async_rl.runtime.actor_main import CPU_BIND_ENV, lend_threads


class ThreadsEngine(EmulatedEngine):
    """The emulated engine, recording every thread count it is set to."""

    def __init__(self) -> None:
        super().__init__(2000.0, response_len=4)
        self.threads: list[int] = []

    async def set_cpu_threads(self, n: int) -> None:
        self.threads.append(n)


class WaitingClient(ScriptedClient):
    """The learner waits while the first and the fourth groups are out (the coordinator's heartbeats say so)."""

    def poll(self, timeout_s: float = 0.0) -> None:
        super().poll(timeout_s)
        self.learner_waiting = len(self.sent) in (0, 3)


def _loop(engine: ThreadsEngine, client: ScriptedClient, lend: tuple[int, int] | None) -> ActorLoop:
    return run_loop(engine, client, max_groups=4, max_concurrent_groups=1, lend_threads=lend)


def test_the_engine_runs_wide_exactly_while_the_learner_waits() -> None:
    engine, client = ThreadsEngine(), WaitingClient([make_grant(i, min_version=0) for i in range(4)])
    loop = _loop(engine, client, lend=(1, 2))
    assert len(client.sent) == 4
    # waiting at first (the engine starts on 2 threads: no switch), not once a group is back (1), waiting again with 3
    # sent (2), then not (1)
    assert engine.threads == [1, 2, 1][: len(engine.threads)] and engine.threads[:2] == [1, 2]
    assert loop.stats.lend_switches == len(engine.threads)
    assert client.report["lend_switches"] == len(engine.threads)  # heartbeat -> transport/actors/lend_switches_total


class SilentThenBusyClient(ScriptedClient):
    """No heartbeat for the first polls (``learner_waiting`` None), then a learner that does not wait."""

    def poll(self, timeout_s: float = 0.0) -> None:
        super().poll(timeout_s)
        self.learner_waiting = None if self.polls <= 3 else False


def test_the_engine_keeps_its_start_width_until_the_coordinator_says() -> None:
    """Before the first heartbeat the engine stays on every core (it starts there: a learner waits for its first
    batch), and the first grants start on it; the first word that the learner is busy narrows it once."""
    engine, client = ThreadsEngine(), SilentThenBusyClient([make_grant(i, min_version=0) for i in range(4)])
    seen: list[tuple[int, int]] = []  # (poll, threads set so far) when each group is generated
    generate = engine.generate

    async def recording(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append((client.polls, len(engine.threads)))
        return await generate(*args, **kwargs)

    engine.generate = recording  # type: ignore[method-assign]
    loop = _loop(engine, client, lend=(1, 2))
    assert len(client.sent) == 4
    assert seen[0] == (1, 0)  # the first group started before any heartbeat, with no switch made: on 2 threads
    assert engine.threads == [1] and loop.stats.lend_switches == 1


def test_without_lending_the_thread_count_is_never_touched() -> None:
    engine, client = ThreadsEngine(), WaitingClient([make_grant(i, min_version=0) for i in range(4)])
    _loop(engine, client, lend=None)
    assert len(client.sent) == 4 and engine.threads == []


def test_lend_threads_binds_every_core_only_when_asked_and_unbound(caplog: pytest.LogCaptureFixture) -> None:
    on = load_config(["configs/demo_grpo.yaml"], ["async_training.actor.lend_learner_cores=true"])
    off = load_config(["configs/demo_grpo.yaml"], [])
    assert off.async_training.actor.lend_learner_cores is False
    env: dict[str, str] = {}
    assert lend_threads(off, env, [0, 1]) is None and env == {}
    assert lend_threads(on, env, [0, 1, 2, 3]) == (3, 4) and env == {CPU_BIND_ENV: "0,1,2,3"}
    assert lend_threads(on, {}, [5]) is None  # one core: nothing to lend
    with caplog.at_level(logging.WARNING):
        bound = {CPU_BIND_ENV: "0"}
        assert lend_threads(on, bound, [0, 1]) is None and bound == {CPU_BIND_ENV: "0"}
    assert "lend_learner_cores does nothing: VLLM_CPU_OMP_THREADS_BIND=0 is set" in caplog.text


class FailingThreadsEngine(ThreadsEngine):
    async def set_cpu_threads(self, n: int) -> None:
        self.threads.append(n)
        raise RuntimeError("engine core gone")


def test_a_failed_switch_stops_the_lending_and_generation_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    engine, client = FailingThreadsEngine(), WaitingClient([make_grant(i, min_version=0) for i in range(4)])
    with caplog.at_level(logging.WARNING):
        loop = _loop(engine, client, lend=(1, 2))
    assert len(client.sent) == 4 and engine.threads == [1]  # tried once, then never again
    assert loop.lend_threads is None and loop.stats.lend_switches == 0
    assert "stopped lending the learner's cores: RuntimeError('engine core gone')" in caplog.text
