"""The calculator: safe evaluation, a hand-played episode, tool errors, and the word-problem maker."""

from __future__ import annotations

import re
from fractions import Fraction

import pytest

from async_rl.envs.calculator import (
    CalcError,
    CalculatorEnv,
    calculator,
    format_number,
    last_number,
    make_calculator_problems,
    safe_eval,
)
from tests.envs.env_fixtures import tool_options


def call(expression: str) -> str:
    return f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}</tool_call>'


def response(content: str) -> str:
    return f'<tool_response>\n{{"name": "calculator", "content": "{content}"}}\n</tool_response>'


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("3*(4+5)", 27),
        ("23*17", 391),
        ("-7 + 2", -5),
        ("--3", 3),
        ("+4", 4),
        ("7/2", 3.5),
        ("7//2", 3),
        ("-7//2", -4),
        ("17 % 5", 2),
        ("2**10", 1024),
        ("2**-1", 0.5),
        ("1.5*4", 6.0),
        (" 12 × 3 ", 36),  # the multiplication sign a model may write
        ("10**18", 10**18),  # at the bound
    ],
)
def test_safe_eval_computes(expression: str, value: float) -> None:
    assert safe_eval(expression) == value
    assert type(safe_eval(expression)) is type(value)


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("x + 1", "names are not allowed"),
        ("__import__('os')", "function calls are not allowed"),
        ("(1).real", "attributes are not allowed"),
        ("abs(-3)", "function calls are not allowed"),
        ("1, 2", "tuples are not allowed"),
        ("[1, 2]", "unsupported syntax: List"),
        ("'ab' * 3", "unsupported constant"),
        ("True + 1", "unsupported constant"),
        ("1j", "unsupported constant"),
        ("2 ^ 3", "write \\*\\* for powers"),
        ("1 < 2", "unsupported syntax: Compare"),
        ("lambda: 1", "unsupported syntax: Lambda"),
        ("9**9**9", "exponent 387420489 is too large"),
        ("10**19", "result too large"),
        ("99999999999 * 99999999999", "result too large"),
        ("1e308 * 10", "result too large"),
        ("1e999", "not a finite number"),
        ("2**0.5", "whole-number exponents"),
        ("1/0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("0**-1", "division by zero"),
        ("", "empty expression"),
        ("1+" * 150 + "1", "longer than 200"),
        ("1\x00", "cannot parse"),
        ("3 +", "cannot parse"),
    ],
)
def test_safe_eval_refuses(expression: str, reason: str) -> None:
    with pytest.raises(CalcError, match=reason):
        safe_eval(expression)


def test_number_formatting_and_answer_extraction() -> None:
    assert calculator("391/17") == "23"  # a whole float prints without ".0"
    assert calculator("1/3") == "0.333333333333"
    assert format_number(-2.5) == "-2.5"
    assert last_number("first 12, then 1,234.") == Fraction(1234)
    assert last_number("it is -3.5 degrees") == Fraction(-7, 2)
    assert last_number("no digits") is None
    assert last_number("9" * 5000) is None  # past Python's int-string limit: no answer, no crash


def test_a_two_turn_episode_rewards_the_right_answer() -> None:
    env = CalculatorEnv(**tool_options())
    env.reset([{"role": "user", "content": "23 boxes of 17 apples?"}], "391", {"data_source": "calculator_tool"})
    first = env.step(f"I need 23*17. {call('23*17')}")
    assert first.done is False and first.reward == 0.0
    assert first.observations == [{"role": "tool", "content": response("391")}]
    assert first.info == {"tool_calls": 1.0, "tool_errors": 0.0, "tool_calls_dropped": 0.0}
    final = env.step("There are 391 apples.")
    assert final.done is True and final.reward == 1.0 and final.observations == []
    assert env.turns == 2

    env.reset("23 boxes of 17 apples?", "391", {})
    assert env.step("There are 390 apples.").reward == 0.0
    env.reset("q", "391", {})
    assert env.step("No number at all.").reward == 0.0


def test_tool_errors_are_observations_and_counted() -> None:
    env = CalculatorEnv(**tool_options(max_parallel_calls=5))
    env.reset("q", "4", {})
    turn = (
        call("x+1")
        + '<tool_call>{"name": "search", "arguments": {"q": "4"}}</tool_call>'
        + '<tool_call>{"name": "calculator", "arguments": {"expr": "2+2"}}</tool_call>'
        + '<tool_call>{"name": "calculator", "arguments": {"expression": 4}}</tool_call>'
        + "<tool_call>not json</tool_call>"
    )
    result = env.step(turn)
    assert result.done is False
    assert result.info == {"tool_calls": 5.0, "tool_errors": 5.0, "tool_calls_dropped": 0.0}
    contents = [m["content"] for m in result.observations]
    assert contents[0] == response("error: names are not allowed")
    assert contents[1] == (
        "<tool_response>\n"
        '{"name": "search", "content": "error: unknown tool \'search\'; available: [\'calculator\']"}\n'
        "</tool_response>"
    )
    assert "error: missing required argument 'expression'" in contents[2]
    assert "error: argument 'expression' must be string, got int" in contents[3]
    assert contents[4].startswith('<tool_response>\n{"name": "", "content": "error: invalid JSON')
    assert all(m["role"] == "tool" for m in result.observations)


def test_calls_past_max_parallel_are_dropped_and_long_responses_cut() -> None:
    env = CalculatorEnv(**tool_options(max_tool_response_length=4, truncate_side="left"))
    env.reset("q", "1", {})
    result = env.step(call("10**12") + call("1+1") + call("2+2"))
    assert result.info == {"tool_calls": 1.0, "tool_errors": 0.0, "tool_calls_dropped": 2.0}
    assert result.observations == [{"role": "tool", "content": response("1000...(truncated)")}]


def test_the_turn_limit_reward_ignores_tool_call_blocks() -> None:
    env = CalculatorEnv(**tool_options())
    env.reset("q", "391", {})
    assert env.final_reward(f"391 {call('23*17')}") == 1.0  # the answer outside the block counts
    assert env.final_reward(f"so {call('23*17')}") == 0.0  # 17 inside the block does not


def test_problems_are_deterministic_disjoint_and_correct() -> None:
    train = make_calculator_problems(400, seed=3)
    assert train == make_calculator_problems(400, seed=3)
    assert train != make_calculator_problems(400, seed=4)
    held_out = make_calculator_problems(100, seed=3, split="eval")
    questions = {r["prompt"][-1]["content"] for r in train}
    assert questions.isdisjoint(r["prompt"][-1]["content"] for r in held_out)
    system = train[0]["prompt"][0]
    assert system["role"] == "system" and '"name": "calculator"' in system["content"]
    for record in train + held_out:
        assert record["prompt"][0] == system and record["prompt"][-1]["role"] == "user"
        assert record["extra"] == {"data_source": "calculator_tool"}
        question = record["prompt"][-1]["content"]
        numbers = [int(x) for x in re.findall(r"\d+", question)]
        if len(numbers) == 3:  # "a rows of b trees and then c more"
            expected = {numbers[0] * numbers[1] + numbers[2]}
        elif "more" in question:
            expected = {numbers[0] + numbers[1]}
        elif "left" in question:
            expected = {numbers[0] - numbers[1]}
        else:
            expected = {numbers[0] * numbers[1]}
        assert int(record["ground_truth"]) in expected, record
        assert max(numbers) >= 11  # no single-digit problems a model could do in its head
    kinds = {tuple(r["prompt"][-1]["content"].split()[:2]) for r in train}
    assert len(kinds) == 6  # every template appears


def test_problem_maker_worked_example_and_bad_arguments() -> None:
    # seed 0's first draw, computed by hand: 876 + 530 = 1406.
    first = make_calculator_problems(1, seed=0)[0]
    assert (
        first["prompt"][-1]["content"] == "Sam had 876 stamps and bought 530 more. How many stamps does Sam have now?"
    )
    assert first["ground_truth"] == "1406"
    assert make_calculator_problems(0, seed=0) == []
    with pytest.raises(ValueError, match="split"):
        make_calculator_problems(1, split="test", seed=0)
    with pytest.raises(ValueError, match="n must be"):
        make_calculator_problems(-1, seed=0)
