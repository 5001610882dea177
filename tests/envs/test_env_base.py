"""The environment interface: the class loader, StepResult checks, argument checks and ToolEnvironment's step."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from async_rl.envs.base import (
    StepResult,
    Tool,
    ToolEnvironment,
    check_arguments,
    check_step_result,
    load_environment_class,
)
from async_rl.envs.calculator import CalculatorEnv
from async_rl.envs.guessing import GuessingEnv
from tests.envs.env_fixtures import tool_options

FIXTURES = Path(__file__).parent / "env_fixtures.py"


def test_load_environment_class_by_module_and_by_file() -> None:
    assert load_environment_class("async_rl.envs.calculator:CalculatorEnv") is CalculatorEnv
    assert load_environment_class("async_rl.envs:GuessingEnv") is GuessingEnv
    assert load_environment_class(f"{FIXTURES}:EchoEnv").__name__ == "EchoEnv"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("async_rl.envs.calculator", "must be given as 'module:Class'"),
        (":CalculatorEnv", "must be given as 'module:Class'"),
        ("no_such_module_xyz:Env", "cannot import environment module 'no_such_module_xyz'"),
        ("async_rl.envs.calculator:Nope", "has no attribute 'Nope'"),
        ("async_rl.envs.calculator:calculator", "is not a class"),
        ("async_rl.envs.calculator:CalcError", r"lacks method\(s\) \['reset', 'step'\]"),
        ("/no/such/file.py:Env", "environment file not found"),
    ],
)
def test_load_environment_class_errors_name_the_spec(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        load_environment_class(spec)
    assert repr(spec) in str(info.value)


def test_step_result_always_has_the_tool_counters() -> None:
    assert StepResult([], 1.0, True).info == {"tool_calls": 0.0, "tool_errors": 0.0}
    assert StepResult([], 0.0, False, {"tool_calls": 2}).info == {"tool_calls": 2, "tool_errors": 0.0}


def test_check_step_result_cleans_and_rejects() -> None:
    clean = check_step_result(StepResult([{"role": "user", "content": "hi", "x": "y"}], 1, 1, {"n": True}))
    assert clean == StepResult(
        [{"role": "user", "content": "hi"}], 1.0, True, {"n": 1.0, "tool_calls": 0.0, "tool_errors": 0.0}
    )
    assert type(clean.reward) is float and clean.done is True
    with pytest.raises(TypeError, match="must return a StepResult"):
        check_step_result({"reward": 1.0})
    with pytest.raises(TypeError, match="str 'role' and 'content'"):
        check_step_result(StepResult([{"role": "user", "content": 3}], 0.0, False))  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="finite number"):
        check_step_result(StepResult([], math.nan, True))
    with pytest.raises(ValueError, match=r"info\['n'\]"):
        check_step_result(StepResult([], 0.0, True, {"n": "many"}))  # type: ignore[dict-item]


def test_check_arguments() -> None:
    params = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": ["string", "null"]}, "c": {"type": "number"}},
        "required": ["a"],
    }
    assert check_arguments(params, {"a": 1, "b": None, "c": 2.5}) is None
    assert check_arguments(params, {"b": "x"}) == "missing required argument 'a'"
    assert check_arguments(params, {"a": 1, "d": 0}) == "unexpected argument(s) ['d']; expected ['a', 'b', 'c']"
    assert check_arguments(params, {"a": True}) == "argument 'a' must be integer, got bool"
    assert check_arguments(params, {"a": 1.0}) == "argument 'a' must be integer, got float"
    assert check_arguments(params, {"a": 1, "b": 3}) == "argument 'b' must be string or null, got int"
    assert check_arguments({**params, "additionalProperties": True}, {"a": 1, "d": 0}) is None
    assert check_arguments({}, {"anything": [1]}) is None


def _boom(**_: Any) -> str:
    raise RuntimeError("disk on fire")


class _TwoTools(ToolEnvironment):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(
            {
                "boom": Tool({"name": "boom", "parameters": {"type": "object", "properties": {}}}, _boom),
                "count": ({"type": "function", "function": {"name": "count"}}, lambda n=3: list(range(n))),
            },
            **kwargs,
        )

    def final_reward(self, assistant_text: str) -> float:
        return 0.25


def test_tool_environment_runs_tools_and_never_raises() -> None:
    env = _TwoTools(**tool_options(max_parallel_calls=3))
    env.reset("p", "gt", {"k": 1})
    assert [t.get("name") or t["function"]["name"] for t in env.tools] == ["boom", "count"]
    result = env.step(
        '<tool_call>{"name": "boom", "arguments": {}}</tool_call><tool_call>{"name": "count", "arguments": {"n": 2}}'
        "</tool_call>"
    )
    assert [m["content"] for m in result.observations] == [
        '<tool_response>\n{"name": "boom", "content": "error: disk on fire"}\n</tool_response>',
        '<tool_response>\n{"name": "count", "content": "[0, 1]"}\n</tool_response>',  # a non-str result is str()-ed
    ]
    assert result.info["tool_calls"] == 2.0 and result.info["tool_errors"] == 1.0
    unexpected = env.step('<tool_call>{"name": "count", "arguments": {"m": 1}}</tool_call>')
    # no declared properties, so the schema check passes and the call itself fails
    assert "unexpected keyword argument 'm'" in unexpected.observations[0]["content"]
    assert unexpected.info["tool_errors"] == 1.0
    done = env.step("all done")
    assert (done.done, done.reward, env.turns) == (True, 0.25, 3)


def test_tool_environment_validates_its_settings() -> None:
    with pytest.raises(ValueError, match="max_parallel_calls"):
        _TwoTools(**tool_options(max_parallel_calls=0))
    with pytest.raises(ValueError, match="truncate_side"):
        _TwoTools(**tool_options(truncate_side="top"))
    with pytest.raises(ValueError, match="max_tool_response_length"):
        _TwoTools(**tool_options(max_tool_response_length=0))

    class Misnamed(_TwoTools):
        def __init__(self) -> None:
            ToolEnvironment.__init__(self, {"a": ({"name": "b"}, str)}, **tool_options())

    with pytest.raises(ValueError, match="registered as 'a' but its schema names 'b'"):
        Misnamed()
