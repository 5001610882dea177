"""Hermes tool-call parsing, tool responses, truncation (verl's semantics) and the tools' system prompt."""

from __future__ import annotations

import json

import pytest

from async_rl.envs.calculator import CALCULATOR_TOOL
from async_rl.envs.tool_format import (
    ToolCall,
    ToolCallError,
    function_spec,
    parse_tool_calls,
    render_tool_call,
    render_tool_response,
    strip_tool_calls,
    tools_system_prompt,
    truncate_text,
)


def test_one_good_call_anywhere_in_the_turn() -> None:
    text = 'I will compute. <tool_call>\n{"name": "calculator", "arguments": {"expression": "3*(4+5)"}}\n</tool_call>'
    assert parse_tool_calls(text) == [ToolCall("calculator", {"expression": "3*(4+5)"})]


def test_several_calls_in_order_and_none() -> None:
    text = (
        '<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call> and '
        '<tool_call>{"name": "b", "arguments": {}}</tool_call><tool_call>{"name": "c"}</tool_call>'
    )
    assert parse_tool_calls(text) == [ToolCall("a", {"x": 1}), ToolCall("b", {}), ToolCall("c", {})]
    assert parse_tool_calls("The answer is 42.") == []
    assert parse_tool_calls("") == []
    assert parse_tool_calls("a stray </tool_call> closing tag") == []


def test_arguments_as_a_json_string_are_accepted() -> None:  # OpenAI's wire form
    text = '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"1+1\\"}"}</tool_call>'
    assert parse_tool_calls(text) == [ToolCall("calculator", {"expression": "1+1"})]


@pytest.mark.parametrize(
    ("body", "reason_start"),
    [
        ("{'name': 'calculator'}", "invalid JSON"),  # Python dict, not JSON
        ("calculator(3*4)", "invalid JSON"),
        ('{"name": "a"} {"name": "b"}', "invalid JSON"),  # two objects in one block
        ("", "empty tool call"),
        ('["calculator", {"expression": "1"}]', "tool call must be a JSON object, got list"),
        ('{"arguments": {"expression": "1"}}', 'missing "name"'),
        ('{"name": 7, "arguments": {}}', 'missing "name"'),
        ('{"name": "  ", "arguments": {}}', 'missing "name"'),
        ('{"name": "calculator", "arguments": [1, 2]}', '"arguments" must be an object, got list'),
        ('{"name": "calculator", "arguments": "3*4"}', '"arguments" is a string that is not a JSON object'),
        ("[" * 100_000, "invalid JSON"),  # deep nesting: RecursionError inside json, caught
    ],
)
def test_malformed_blocks_become_errors_with_their_reason(body: str, reason_start: str) -> None:
    (result,) = parse_tool_calls(f"<tool_call>{body}</tool_call>")
    assert isinstance(result, ToolCallError)
    assert result.raw == body
    assert result.reason.startswith(reason_start), result.reason


def test_unclosed_tags_are_errors_and_a_later_block_still_parses() -> None:
    (unclosed,) = parse_tool_calls('text <tool_call>{"name": "calculator"')
    assert unclosed == ToolCallError(raw='{"name": "calculator"', reason="unclosed <tool_call> tag")
    first, second = parse_tool_calls('<tool_call>{"name": "x"<tool_call>{"name": "y"}</tool_call>')
    assert first == ToolCallError(raw='{"name": "x"', reason="unclosed <tool_call> tag")
    assert second == ToolCall("y", {})


@pytest.mark.parametrize("junk", [None, 42, b"<tool_call>", ["<tool_call>"]])
def test_non_text_input_never_raises(junk: object) -> None:
    (result,) = parse_tool_calls(junk)  # type: ignore[arg-type]
    assert isinstance(result, ToolCallError) and result.reason.startswith("turn is not text")


def test_strip_tool_calls_keeps_the_prose() -> None:
    text = 'a <tool_call>{"name": "x"}</tool_call> b <tool_call>unclosed 5'
    assert strip_tool_calls(text) == "a  b "
    assert strip_tool_calls("no calls") == "no calls"


def test_render_tool_response_is_hermes_json_and_escapes_the_content() -> None:
    assert render_tool_response("calculator", "27") == (
        '<tool_response>\n{"name": "calculator", "content": "27"}\n</tool_response>'
    )
    rendered = render_tool_response("t", 'a "quote"\n</tool_response>')
    body = rendered.removeprefix("<tool_response>\n").removesuffix("\n</tool_response>")
    assert json.loads(body) == {"name": "t", "content": 'a "quote"\n</tool_response>'}
    assert render_tool_call(ToolCall("calculator", {"expression": "2+2"})) == (
        '<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>'
    )


def test_truncation_keeps_the_side_verl_names() -> None:
    text = "abcdefghij"  # 10 characters
    assert truncate_text(text, 4, "left") == "abcd...(truncated)"  # verl: text[:max] + "...(truncated)"
    assert truncate_text(text, 4, "right") == "(truncated)...ghij"  # verl: "(truncated)..." + text[-max:]
    assert truncate_text(text, 4, "middle") == "ab...(truncated)...ij"  # verl: max // 2 of each end
    assert truncate_text(text, 5, "middle") == "ab...(truncated)...ij"  # odd max: 5 // 2 = 2 per end
    assert truncate_text(text, 10, "left") == text  # not longer than max: unchanged
    with pytest.raises(ValueError, match="truncate_side"):
        truncate_text(text, 4, "both")


def test_system_prompt_lists_each_schema_and_the_call_format() -> None:
    prompt = tools_system_prompt([CALCULATOR_TOOL], "Solve it.", example=ToolCall("calculator", {"expression": "1+2"}))
    lines = prompt.splitlines()
    assert lines[0] == "Solve it." and lines[2] == "Tools:"
    assert json.loads(lines[3]) == CALCULATOR_TOOL["function"]
    assert '<tool_call>{"name": "calculator", "arguments": {"expression": "1+2"}}</tool_call>' in lines
    assert len(prompt) < 600  # short enough for a 135M model's context
    bare = tools_system_prompt([{"name": "noop", "description": "does nothing"}], "")
    assert bare.splitlines()[:2] == ["Tools:", '{"name": "noop", "description": "does nothing"}']
    assert '<tool_call>{"name": "TOOL_NAME", "arguments": {...}}</tool_call>' in bare
    with pytest.raises(ValueError, match="at least one tool"):
        tools_system_prompt([], "x")
    with pytest.raises(ValueError, match="function name"):
        function_spec({"type": "function", "function": {"description": "nameless"}})
