"""The multi-turn environment interface, its loader, and :class:`ToolEnvironment`, the base of tool-calling envs.

An episode is one environment instance. The driver (the actor) calls ``reset`` once with the dataset record, then
``step`` with the decoded text of each assistant turn; each :class:`StepResult` carries the messages to append to the
conversation (role ``"tool"`` or ``"user"``) and, when ``done``, the episode's reward. When the driver ends an episode
itself (its turn or token limit), it asks ``final_reward(last_assistant_text)`` where the environment has one, and
takes 0 where it does not.

Environments are named in config as ``"package.module:Class"`` (or ``"path/to/file.py:Class"``) and constructed with
keyword arguments from config, once per episode, usually inside :class:`async_rl.envs.sandbox.EnvWorker`'s child
process.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from async_rl.envs.tool_format import (
    TOOL_FORMATS,
    TRUNCATE_SIDES,
    ToolCall,
    ToolCallError,
    function_spec,
    render_tool_response,
    truncate_text,
)
from async_rl.imports import import_attr

Message = dict[str, str]
"""One chat message: ``{"role": ..., "content": ...}``."""


@dataclass
class StepResult:
    """What one assistant turn led to.

    ``observations``: new messages to append (role ``"tool"`` or ``"user"``). ``reward``: the reward of this step; when
    ``done`` it is the episode's final reward. ``info``: numeric counters of this step; ``tool_calls`` and
    ``tool_errors`` are always present (0 when the env does not set them).
    """

    observations: list[Message]
    reward: float
    done: bool
    info: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.info.setdefault("tool_calls", 0.0)
        self.info.setdefault("tool_errors", 0.0)


def check_step_result(value: object) -> StepResult:
    """``value`` as a clean :class:`StepResult` (floats, str messages); ``TypeError``/``ValueError`` saying what is
    wrong otherwise. Used on what user environments return before it crosses a process boundary."""
    if not isinstance(value, StepResult):
        raise TypeError(f"env step must return a StepResult, got {type(value).__name__}")
    observations: list[Message] = []
    for msg in value.observations:
        if (
            not isinstance(msg, Mapping)
            or not isinstance(msg.get("role"), str)
            or not isinstance(msg.get("content"), str)
        ):
            raise TypeError(f"each observation must be a dict with str 'role' and 'content', got {msg!r:.200}")
        observations.append({"role": msg["role"], "content": msg["content"]})
    if isinstance(value.reward, bool) or not isinstance(value.reward, int | float) or not math.isfinite(value.reward):
        raise ValueError(f"env reward must be a finite number, got {value.reward!r}")
    info: dict[str, float] = {}
    for key, num in value.info.items():
        if not isinstance(num, int | float) or not math.isfinite(num):
            raise ValueError(f"env info[{key!r}] must be a finite number, got {num!r:.100}")
        info[str(key)] = float(num)
    return StepResult(observations=observations, reward=float(value.reward), done=bool(value.done), info=info)


class Environment(Protocol):
    """A multi-turn environment; one instance per episode.

    Optional: a ``tools`` attribute (the OpenAI function schemas it offers, for the system prompt) and
    ``final_reward(assistant_text) -> float`` (the reward when the driver ends the episode at its turn limit).
    """

    def reset(self, prompt: list[Message] | str, ground_truth: str, extra: dict[str, Any]) -> None:
        """Start the episode. ``prompt`` is the dataset's prompt (its system text already describes any tools)."""
        ...

    def step(self, assistant_text: str) -> StepResult:
        """Answer one assistant turn (its decoded text)."""
        ...


def load_environment_class(spec: str) -> type[Environment]:
    """The environment class named by ``spec`` (``"module:Class"`` or ``"file.py:Class"``).

    Raises ``ValueError`` naming ``spec`` when it cannot be imported, is not a class, or lacks ``reset``/``step``.
    """
    target = import_attr(spec, what="environment", form="module:Class")
    if not isinstance(target, type):
        raise ValueError(f"environment {spec!r} is not a class (got {type(target).__name__})")
    missing = [m for m in ("reset", "step") if not callable(getattr(target, m, None))]
    if missing:
        raise ValueError(f"environment class {spec!r} lacks method(s) {missing}")
    return target


class Tool(NamedTuple):
    """A tool of a :class:`ToolEnvironment`: its OpenAI function ``schema`` and ``fn(**arguments) -> str``."""

    schema: dict[str, Any]
    fn: Callable[..., str]


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "number": (int, float),
    "integer": (int,),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


def _matches_type(value: Any, kind: str) -> bool:
    if kind not in _JSON_TYPES:
        return True  # a type this check does not know is left to the tool
    if isinstance(value, bool) and kind in ("number", "integer"):
        return False
    return isinstance(value, _JSON_TYPES[kind])


def check_arguments(parameters: Mapping[str, Any], arguments: Mapping[str, Any]) -> str | None:
    """Why ``arguments`` do not fit the JSON schema ``parameters`` (required keys, unknown keys, basic types), or
    None when they do. A shallow check: nested schemas are the tool's business."""
    properties = parameters.get("properties") or {}
    for key in parameters.get("required") or []:
        if key not in arguments:
            return f"missing required argument {key!r}"
    if properties and parameters.get("additionalProperties") is not True:
        unknown = sorted(set(arguments) - set(properties))
        if unknown:
            return f"unexpected argument(s) {unknown}; expected {sorted(properties)}"
    for key, value in arguments.items():
        kinds = (properties.get(key) or {}).get("type")
        if kinds is None:
            continue
        kinds = [kinds] if isinstance(kinds, str) else list(kinds)
        if not any(_matches_type(value, k) for k in kinds):
            return f"argument {key!r} must be {' or '.join(kinds)}, got {type(value).__name__}"
    return None


class ToolEnvironment(ABC):
    """An environment whose assistant turns call tools; a turn without a tool call ends the episode.

    ``step`` parses the turn's Hermes ``<tool_call>`` blocks, runs the first ``max_parallel_calls`` of them (further
    ones are dropped, counted in ``info["tool_calls_dropped"]``, as verl drops them) and answers each with one role
    ``"tool"`` message. Unknown tools, arguments that do not fit the schema, a tool that raises and unreadable blocks
    are answered with ``"error: ..."`` text (never raised) and counted in ``info["tool_errors"]``; ``tool_calls``
    counts every block answered, readable or not. Responses longer than ``max_tool_response_length`` characters are
    cut per ``truncate_side`` (:func:`async_rl.envs.tool_format.truncate_text`, verl's semantics). A turn with no
    block is the final answer: ``done`` with reward :meth:`final_reward`. The keyword arguments are ``multi_turn``'s
    tool options, which the actor passes (``runtime.actor_main.environment_kwargs``).
    """

    tools: list[dict[str, Any]] = []

    def __init__(
        self,
        tools: Mapping[str, Tool | tuple[dict[str, Any], Callable[..., str]]],
        *,
        max_parallel_calls: int,
        max_tool_response_length: int,
        truncate_side: str,
        tool_format: str,
    ) -> None:
        if tool_format not in TOOL_FORMATS:
            raise ValueError(f"tool_format must be one of {sorted(TOOL_FORMATS)}, got {tool_format!r}")
        self._parse = TOOL_FORMATS[tool_format]
        if max_parallel_calls < 1:
            raise ValueError(f"max_parallel_calls must be >= 1, got {max_parallel_calls}")
        if max_tool_response_length < 1:
            raise ValueError(f"max_tool_response_length must be >= 1, got {max_tool_response_length}")
        if truncate_side not in TRUNCATE_SIDES:
            raise ValueError(f"truncate_side must be one of {TRUNCATE_SIDES}, got {truncate_side!r}")
        self._tools: dict[str, Tool] = {}
        for name, (schema, fn) in tools.items():
            declared = function_spec(schema)["name"]
            if declared != name:
                raise ValueError(f"tool registered as {name!r} but its schema names {declared!r}")
            self._tools[name] = Tool(schema=schema, fn=fn)
        self.tools = [tool.schema for tool in self._tools.values()]
        self.max_parallel_calls = max_parallel_calls
        self.max_tool_response_length = max_tool_response_length
        self.truncate_side = truncate_side
        self.prompt: list[Message] | str = []
        self.ground_truth = ""
        self.extra: dict[str, Any] = {}
        self.turns = 0

    def reset(self, prompt: list[Message] | str, ground_truth: str, extra: dict[str, Any]) -> None:
        """Keep the episode's record; subclasses that override it call ``super().reset``."""
        self.prompt = prompt
        self.ground_truth = ground_truth
        self.extra = dict(extra)
        self.turns = 0

    @abstractmethod
    def final_reward(self, assistant_text: str) -> float:
        """The episode's reward given its final assistant turn (also asked when the driver ends the episode)."""

    def _run(self, call: ToolCall | ToolCallError) -> tuple[str, str, bool]:
        """(tool name, response text, ok) for one call; never raises."""
        if isinstance(call, ToolCallError):
            return "", f"error: {call.reason}", False
        tool = self._tools.get(call.name)
        if tool is None:
            return call.name, f"error: unknown tool {call.name!r}; available: {sorted(self._tools)}", False
        problem = check_arguments(function_spec(tool.schema).get("parameters") or {}, call.arguments)
        if problem is not None:
            return call.name, f"error: {problem}", False
        try:
            result = tool.fn(**call.arguments)
        except Exception as exc:  # a tool may raise anything; the model sees the error, the episode goes on
            return call.name, f"error: {exc}" if str(exc) else f"error: {type(exc).__name__}", False
        return call.name, result if isinstance(result, str) else str(result), True

    def step(self, assistant_text: str) -> StepResult:
        self.turns += 1
        calls = self._parse(assistant_text)
        if not calls:
            return StepResult(observations=[], reward=float(self.final_reward(assistant_text)), done=True)
        run = calls[: self.max_parallel_calls]
        observations: list[Message] = []
        errors = 0
        for call in run:
            name, text, ok = self._run(call)
            errors += not ok
            text = truncate_text(text, self.max_tool_response_length, self.truncate_side)
            observations.append({"role": "tool", "content": render_tool_response(name, text)})
        info = {
            "tool_calls": float(len(run)),
            "tool_errors": float(errors),
            "tool_calls_dropped": float(len(calls) - len(run)),
        }
        return StepResult(observations=observations, reward=0.0, done=False, info=info)
