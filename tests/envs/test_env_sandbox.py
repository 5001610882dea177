"""EnvWorker with a real child process: episodes, call and episode timeouts, crashes, prints, restarts."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from async_rl.envs.base import StepResult
from async_rl.envs.calculator import CalculatorEnv, make_calculator_problems
from async_rl.envs.sandbox import EnvWorker
from tests.envs.env_fixtures import tool_options

ECHO = f"{Path(__file__).parent / 'env_fixtures.py'}:EchoEnv"


@pytest.fixture
def worker() -> Iterator[EnvWorker]:
    with EnvWorker(ECHO, {"tag": "t"}, call_timeout_s=0.5, episode_timeout_s=60, grace_s=5.0) as w:
        yield w


def echo(result: StepResult) -> tuple[int, str]:
    """(the child's pid, the rest) of an EchoEnv reply."""
    (message,) = result.observations
    assert message["role"] == "user" and result.done is False and result.reward == 0.0
    pid, rest = message["content"].split(" ", 1)
    return int(pid), rest


def test_episodes_live_side_by_side_in_one_child(worker: EnvWorker) -> None:
    worker.reset("a", "prompt a", "gt-a", {})
    worker.reset(7, [{"role": "user", "content": "b"}], "gt-b", {"data_source": "x"})
    pid, rest = echo(worker.step("a", "hello"))
    assert pid != os.getpid() and rest == "turn 1: hello [t|gt-a]"
    assert echo(worker.step(7, "x")) == (pid, "turn 1: x [t|gt-b]")
    assert echo(worker.step("a", "again")) == (pid, "turn 2: again [t|gt-a]")
    done = worker.step("a", "done")
    assert done == StepResult([], 1.0, True, {"turns": 3.0, "tool_calls": 0.0, "tool_errors": 0.0})
    with pytest.raises(KeyError, match="unknown episode 'a'"):
        worker.step("a", "after done")  # a done episode is closed on both sides
    assert worker.final_reward(7, "stop") == 0.5  # the driver's turn limit; it ends the episode
    assert worker.live_episodes() == 0
    assert worker.metrics() == {
        "calls": 7.0,  # the KeyError call is not one
        "errors": 0.0,
        "timeouts": 0.0,
        "restarts": 0.0,
        "episode_timeouts": 0.0,
        "episodes_lost": 0.0,
    }


def test_a_slow_step_times_out_in_the_child_and_the_others_live_on(worker: EnvWorker) -> None:
    worker.reset("slow", "p", "g", {})
    worker.reset("other", "p", "g", {})
    pid, _ = echo(worker.step("other", "first"))
    start = time.monotonic()
    slow = worker.step("slow", "sleep 5")
    assert time.monotonic() - start < 3.0  # the 0.5 s alarm, not the 5 s sleep or the 5.5 s hard deadline
    assert (slow.done, slow.reward) == (True, 0.0)
    assert slow.info == {"tool_errors": 1.0, "step_timeout": 1.0, "tool_calls": 0.0}
    assert slow.observations == [{"role": "user", "content": "environment error: step exceeded 0.5 s"}]
    worker.reset("swallower", "p", "g", {})
    assert worker.step("swallower", "catch-all").info["step_timeout"] == 1.0  # `except Exception` cannot swallow it
    assert echo(worker.step("other", "still here")) == (pid, "turn 2: still here [t|g]")  # same child, same episode
    metrics = worker.metrics()
    assert (metrics["timeouts"], metrics["restarts"], metrics["errors"]) == (2.0, 0.0, 0.0)


def test_a_step_that_ignores_the_alarm_is_killed_at_the_hard_deadline() -> None:
    with EnvWorker(ECHO, call_timeout_s=0.3, grace_s=0.5, episode_timeout_s=600.0) as worker:
        worker.reset("hung", "p", "g", {})
        worker.reset("bystander", "p", "g", {})
        old_pid, _ = echo(worker.step("bystander", "hi"))
        start = time.monotonic()
        hung = worker.step("hung", "hang")
        assert 0.7 < time.monotonic() - start < 5.0
        assert (hung.done, hung.reward) == (True, 0.0)
        assert hung.info == {"tool_errors": 1.0, "step_timeout": 1.0, "env_crashed": 1.0, "tool_calls": 0.0}
        lost = worker.step("bystander", "hi again")
        assert (lost.done, lost.reward, lost.info["env_crashed"]) == (True, 0.0, 1.0)
        worker.reset("fresh", "p", "g", {})
        new_pid, rest = echo(worker.step("fresh", "hi"))
        assert new_pid != old_pid and rest == "turn 1: hi [|g]"
        metrics = worker.metrics()
        assert (metrics["timeouts"], metrics["restarts"], metrics["episodes_lost"]) == (1.0, 1.0, 2.0)


def test_an_env_that_kills_its_process_loses_only_that_childs_episodes(worker: EnvWorker) -> None:
    worker.reset("a", "p", "g", {})
    worker.reset("b", "p", "g", {})
    old_pid, _ = echo(worker.step("b", "hi"))
    crashed = worker.step("a", "exit")
    assert (crashed.done, crashed.reward) == (True, 0.0)
    assert crashed.info == {"tool_errors": 1.0, "env_crashed": 1.0, "tool_calls": 0.0}
    assert crashed.observations[0]["content"].startswith("environment error: environment process died")
    worker.reset("c", "p", "g", {})  # a new episode starts the new child
    lost = worker.step("b", "hi")
    assert lost == StepResult(
        [{"role": "user", "content": "environment error: the environment process was restarted; episode lost"}],
        0.0,
        True,
        {"tool_errors": 1.0, "env_crashed": 1.0, "tool_calls": 0.0},
    )
    new_pid, rest = echo(worker.step("c", "hi"))
    assert new_pid != old_pid and rest == "turn 1: hi [t|g]"
    metrics = worker.metrics()
    assert (metrics["errors"], metrics["restarts"], metrics["episodes_lost"]) == (1.0, 1.0, 2.0)


def test_a_child_killed_between_calls_is_noticed(worker: EnvWorker) -> None:
    worker.reset("a", "p", "g", {})
    worker.reset("b", "p", "g", {})
    old_pid, _ = echo(worker.step("a", "hi"))
    os.kill(old_pid, signal.SIGKILL)  # the child this test's worker started, by its pid
    deadline = time.monotonic() + 5
    while worker._proc is not None and worker._proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert worker.step("a", "hi").info["env_crashed"] == 1.0
    assert worker.final_reward("b", "x") == 0.0  # lost: not the env's 0.5
    worker.reset("c", "p", "g", {})
    assert echo(worker.step("c", "hi"))[0] != old_pid
    metrics = worker.metrics()
    assert (metrics["restarts"], metrics["episodes_lost"], metrics["errors"]) == (1.0, 2.0, 0.0)


def test_prints_in_env_code_do_not_corrupt_the_frames(worker: EnvWorker) -> None:
    worker.reset("loud", "p", "g", {})
    pid, rest = echo(worker.step("loud", "print"))
    assert rest == "turn 1: print [t|g]"
    assert echo(worker.step("loud", "quiet")) == (pid, "turn 2: quiet [t|g]")
    assert worker.metrics()["restarts"] == 0.0


def test_env_exceptions_end_the_episode_with_an_error(worker: EnvWorker) -> None:
    worker.reset("r", "p", "g", {})
    raised = worker.step("r", "raise")
    assert raised.observations == [{"role": "user", "content": "environment error: ValueError: step blew up"}]
    assert (raised.done, raised.reward, raised.info["env_error"], raised.info["tool_errors"]) == (True, 0.0, 1.0, 1.0)
    worker.reset("bad", "p", "g", {})
    bad = worker.step("bad", "bad")
    assert bad.observations[0]["content"] == "environment error: TypeError: env step must return a StepResult, got str"
    worker.reset("f", "p", "fail", {})  # reset raises in the child: reported by the first step
    failed = worker.step("f", "hi")
    assert failed.observations[0]["content"] == "environment error: RuntimeError: reset refused" and failed.done
    worker.reset("unsendable", "p", "g", {"obj": object()})  # not msgpack: never sent, reported the same way
    unsendable = worker.step("unsendable", "hi")
    assert unsendable.done and "cannot send reset request" in unsendable.observations[0]["content"]
    worker.reset("ok", "p", "g", {})
    assert echo(worker.step("ok", "hi"))[1] == "turn 1: hi [t|g]"
    assert worker.metrics()["errors"] == 4.0 and worker.metrics()["restarts"] == 0.0


def test_a_step_after_the_episode_deadline_ends_it() -> None:
    with EnvWorker(ECHO, call_timeout_s=2.0, episode_timeout_s=0.4) as worker:
        worker.reset("e", "p", "g", {})
        echo(worker.step("e", "in time"))
        time.sleep(0.5)
        late = worker.step("e", "too late")
        assert late == StepResult(
            [{"role": "user", "content": "episode exceeded 0.4 s"}],
            0.0,
            True,
            {"episode_timeout": 1.0, "tool_calls": 0.0, "tool_errors": 0.0},
        )
        assert worker.metrics()["episode_timeouts"] == 1.0
        worker.reset("e", "p", "g", {})  # the same id again is a fresh episode with a fresh deadline
        assert echo(worker.step("e", "hi"))[1] == "turn 1: hi [|g]"


def test_the_calculator_through_the_worker_matches_it_in_process() -> None:
    record = make_calculator_problems(1, seed=0)[0]  # 876 + 530 = 1406
    turns = ['<tool_call>{"name": "calculator", "arguments": {"expression": "876+530"}}</tool_call>', "It is 1406."]
    local = CalculatorEnv(**tool_options())
    local.reset(record["prompt"], record["ground_truth"], record["extra"])
    expected = [local.step(t) for t in turns]
    with EnvWorker(
        "async_rl.envs.calculator:CalculatorEnv", tool_options(), call_timeout_s=5.0, episode_timeout_s=600.0
    ) as worker:
        worker.reset(0, record["prompt"], record["ground_truth"], record["extra"])
        assert [worker.step(0, t) for t in turns] == expected
    assert expected[0].observations[0]["content"].endswith('"content": "1406"}\n</tool_response>')
    assert expected[1].reward == 1.0 and expected[1].done


def test_built_in_envs_take_their_options_through_the_worker() -> None:
    # the keyword arguments the actor passes a tool environment (runtime.actor_main.environment_kwargs)
    options = tool_options(max_parallel_calls=2, max_tool_response_length=64, truncate_side="left")
    with EnvWorker(
        "async_rl.envs.guessing:GuessingEnv", {"decay": 0.25}, call_timeout_s=5.0, episode_timeout_s=600.0
    ) as w:
        w.reset("g", "pick a number", "3", {"hi": 10})
        assert w.step("g", "5").observations == [{"role": "user", "content": "lower"}]
        assert w.step("g", "i say 3").reward == 0.75  # turn 2 with decay 0.25
    with EnvWorker("async_rl.envs.calculator:CalculatorEnv", options, call_timeout_s=5.0, episode_timeout_s=600.0) as w:
        w.reset("c", "q", "4", {})
        turn = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>'
        assert w.step("c", turn * 3).info["tool_calls_dropped"] == 1.0


def test_calls_from_many_threads_are_serialised(worker: EnvWorker) -> None:
    replies: dict[int, list[str]] = {}

    def play(i: int) -> None:
        worker.reset(i, "p", str(i), {})
        replies[i] = [echo(worker.step(i, f"m{j}"))[1] for j in range(3)]

    threads = [threading.Thread(target=play, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert replies == {i: [f"turn {j + 1}: m{j} [t|{i}]" for j in range(3)] for i in range(6)}
    assert worker.metrics()["calls"] == 24.0


def test_bad_settings_fail_fast_and_shutdown_is_final() -> None:
    with pytest.raises(ValueError, match="cannot import environment module"):
        EnvWorker("no_such_module_xyz:Env", call_timeout_s=1.0, episode_timeout_s=600.0)
    with pytest.raises(ValueError, match="msgpack-serialisable"):
        EnvWorker(ECHO, {"tag": object()}, call_timeout_s=1.0, episode_timeout_s=600.0)
    with pytest.raises(ValueError, match="call_timeout_s must be > 0"):
        EnvWorker(ECHO, call_timeout_s=0, episode_timeout_s=600.0)
    with pytest.raises(ValueError, match=r"env kwargs \['colour'\] do not fit .*unexpected keyword argument 'colour'"):
        EnvWorker(ECHO, {"colour": "red"}, call_timeout_s=1.0, episode_timeout_s=600.0)
    worker = EnvWorker(ECHO, call_timeout_s=1.0, episode_timeout_s=600.0)
    proc = worker._proc
    assert proc is not None
    worker.reset("a", "p", "g", {})
    worker.shutdown()
    assert proc.poll() is not None and worker.live_episodes() == 0
    worker.shutdown()  # idempotent
    with pytest.raises(RuntimeError, match="shut down"):
        worker.reset("a", "p", "g", {})
