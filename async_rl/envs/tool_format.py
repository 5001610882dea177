"""Hermes-style tool calls: parse them out of a model's turn, render tool responses and the tools' system prompt.

The model calls a tool by writing a JSON object between tags, anywhere in its turn and possibly several times::

    <tool_call>{"name": "calculator", "arguments": {"expression": "3*(4+5)"}}</tool_call>

and gets the result back as the content of a role ``"tool"`` message::

    <tool_response>
    {"name": "calculator", "content": "27"}
    </tool_response>

(the Hermes response form: the JSON names which call answered, when a turn made several, and escapes the content so a
tool's output cannot close the tag). The tags are written into the message content because small chat templates such
as SmolLM2's ChatML render a ``"tool"`` message's content as is; a template that adds its own ``<tool_response>``
wrapping would show it twice.

:func:`parse_tool_calls` never raises: a block it cannot read becomes a :class:`ToolCallError` that the environment
answers with an error observation, so a model learns the format from the replies instead of crashing the actor.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
RESPONSE_OPEN = "<tool_response>"
RESPONSE_CLOSE = "</tool_response>"

TRUNCATE_SIDES = ("left", "middle", "right")
TRUNCATION_MARK = "...(truncated)"


@dataclass(frozen=True)
class ToolCall:
    """One well-formed call: the tool's ``name`` and its keyword ``arguments``."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolCallError:
    """A ``<tool_call>`` block that could not be read: its ``raw`` text (between the tags) and the ``reason``."""

    raw: str
    reason: str


def _parse_block(body: str) -> ToolCall | ToolCallError:
    text = body.strip()
    if not text:
        return ToolCallError(raw=body, reason="empty tool call")
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError; deep nesting raises RecursionError
        return ToolCallError(raw=body, reason=f"invalid JSON: {exc}")
    if not isinstance(obj, dict):
        return ToolCallError(raw=body, reason=f"tool call must be a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return ToolCallError(raw=body, reason='missing "name" (a non-empty string)')
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):  # OpenAI's wire form: the arguments object JSON-encoded as a string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):
            return ToolCallError(raw=body, reason='"arguments" is a string that is not a JSON object')
    if not isinstance(arguments, dict):
        return ToolCallError(raw=body, reason=f'"arguments" must be an object, got {type(arguments).__name__}')
    return ToolCall(name=name.strip(), arguments=arguments)


def parse_tool_calls(text: str) -> list[ToolCall | ToolCallError]:
    """Every ``<tool_call>...</tool_call>`` block of ``text``, in order; an empty list means the turn made no call.

    A block opened and never closed (or opened again before it closed) is a :class:`ToolCallError` with reason
    "unclosed <tool_call> tag"; a stray closing tag is ignored. Never raises, whatever ``text`` is.
    """
    if not isinstance(text, str):
        return [ToolCallError(raw=repr(text)[:200], reason=f"turn is not text: {type(text).__name__}")]
    calls: list[ToolCall | ToolCallError] = []
    pos = text.find(CALL_OPEN)
    while pos != -1:
        start = pos + len(CALL_OPEN)
        end = text.find(CALL_CLOSE, start)
        reopen = text.find(CALL_OPEN, start)
        if end == -1 or (reopen != -1 and reopen < end):
            stop = len(text) if reopen == -1 else reopen
            calls.append(ToolCallError(raw=text[start:stop], reason=f"unclosed {CALL_OPEN} tag"))
            pos = reopen
            continue
        calls.append(_parse_block(text[start:end]))
        pos = text.find(CALL_OPEN, end + len(CALL_CLOSE))
    return calls


# Tool-call parsers by format name (actor_rollout_ref.rollout.multi_turn.format).
TOOL_FORMATS: dict[str, Callable[[str], list[ToolCall | ToolCallError]]] = {"hermes": parse_tool_calls}


def strip_tool_calls(text: str) -> str:
    """``text`` without its tool-call blocks (an unclosed block runs to the end), e.g. to read a final answer."""
    out: list[str] = []
    pos = 0
    while True:
        start = text.find(CALL_OPEN, pos)
        if start == -1:
            out.append(text[pos:])
            break
        out.append(text[pos:start])
        end = text.find(CALL_CLOSE, start + len(CALL_OPEN))
        if end == -1:
            break
        pos = end + len(CALL_CLOSE)
    return "".join(out)


def render_tool_response(name: str, content: str) -> str:
    """The content of the role ``"tool"`` message that answers a call of tool ``name`` (``""`` when unreadable)."""
    body = json.dumps({"name": name, "content": content}, ensure_ascii=False)
    return f"{RESPONSE_OPEN}\n{body}\n{RESPONSE_CLOSE}"


def truncate_text(text: str, max_length: int, side: str) -> str:
    """Shorten a tool response longer than ``max_length`` characters the way verl's tool agent loop does.

    verl (``verl/experimental/agent_loop/tool_agent_loop.py``, ``multi_turn.tool_response_truncate_side``) names the
    side that is KEPT: ``"left"`` keeps the first ``max_length`` characters (``text[:max] + "...(truncated)"``),
    ``"right"`` keeps the last (``"(truncated)..." + text[-max:]``), ``"middle"`` keeps ``max // 2`` of each end with
    ``"...(truncated)..."`` between them. As in verl, the marker comes on top of ``max_length``.
    """
    if side not in TRUNCATE_SIDES:
        raise ValueError(f"truncate_side must be one of {TRUNCATE_SIDES}, got {side!r}")
    if max_length < 1:
        raise ValueError(f"max_tool_response_length must be >= 1, got {max_length}")
    if len(text) <= max_length:
        return text
    if side == "left":
        return text[:max_length] + TRUNCATION_MARK
    if side == "right":
        return "(truncated)..." + text[-max_length:]
    half = max_length // 2
    return text[:half] + "...(truncated)..." + (text[-half:] if half else "")


def function_spec(tool: Mapping[str, Any]) -> dict[str, Any]:
    """The function part of a tool schema: ``tool["function"]`` of OpenAI's ``{"type": "function", ...}`` form, or
    ``tool`` itself when bare (``{"name", "description", "parameters"}``). ``ValueError`` when it has no name."""
    spec = tool["function"] if isinstance(tool.get("function"), Mapping) else tool
    if not isinstance(spec, Mapping) or not isinstance(spec.get("name"), str) or not spec["name"]:
        raise ValueError(f"a tool schema needs a function name, got {dict(tool)!r}")
    return dict(spec)


def render_tool_call(call: ToolCall) -> str:
    """``call`` written the way the model should write it."""
    body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
    return f"{CALL_OPEN}{body}{CALL_CLOSE}"


def tools_system_prompt(
    tools: Sequence[Mapping[str, Any]], instructions: str, *, example: ToolCall | None = None
) -> str:
    """The system message: ``instructions``, each tool's function schema as one JSON line, and the call format.

    Kept short for small models (SmolLM2-135M): one line per tool, the call syntax (``example`` written out in full
    when given, a placeholder otherwise), and how the turn ends.
    """
    if not tools:
        raise ValueError("tools_system_prompt needs at least one tool")
    lines = [instructions.strip(), ""] if instructions.strip() else []
    lines.append("Tools:")
    lines.extend(json.dumps(function_spec(tool), ensure_ascii=False) for tool in tools)
    lines += [
        "",
        "To call a tool, write:",
        render_tool_call(example)
        if example
        else f'{CALL_OPEN}{{"name": "TOOL_NAME", "arguments": {{...}}}}{CALL_CLOSE}',
        f"The result comes back in {RESPONSE_OPEN}. Reply without a tool call to give your final answer.",
    ]
    return "\n".join(lines)
