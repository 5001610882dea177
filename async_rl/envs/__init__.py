"""Multi-turn environments and tools: the interface, Hermes tool calls, two built-in envs and a sandboxed worker.

An environment answers each assistant turn of an episode with new messages and, when the episode is done, its reward
(:class:`Environment`, :class:`StepResult`). :class:`ToolEnvironment` turns a dict of Python tools into one: it parses
Hermes ``<tool_call>`` blocks (:mod:`async_rl.envs.tool_format`), runs them and ends the episode on a turn without a
call. Built in: :class:`CalculatorEnv` (word problems with a safe calculator tool) and :class:`GuessingEnv` (find a
number from "higher"/"lower"), each with a seeded problem maker. The actor runs environments inside
:class:`async_rl.envs.sandbox.EnvWorker` (not imported here: it is the child's ``__main__`` too), a child process
with per-call and per-episode time limits, spoken to with msgpack frames.

Environments are named in config as ``"package.module:Class"``, e.g. ``"async_rl.envs.calculator:CalculatorEnv"``.
"""

from async_rl.envs.base import (
    Environment,
    Message,
    StepResult,
    Tool,
    ToolEnvironment,
    check_arguments,
    check_step_result,
    load_environment_class,
)
from async_rl.envs.calculator import CalcError, CalculatorEnv, calculator, make_calculator_problems, safe_eval
from async_rl.envs.guessing import GuessingEnv, make_guessing_problems
from async_rl.envs.tool_format import (
    ToolCall,
    ToolCallError,
    parse_tool_calls,
    render_tool_call,
    render_tool_response,
    strip_tool_calls,
    tools_system_prompt,
    truncate_text,
)

__all__ = [
    "CalcError",
    "CalculatorEnv",
    "Environment",
    "GuessingEnv",
    "Message",
    "StepResult",
    "Tool",
    "ToolCall",
    "ToolCallError",
    "ToolEnvironment",
    "calculator",
    "check_arguments",
    "check_step_result",
    "load_environment_class",
    "make_calculator_problems",
    "make_guessing_problems",
    "parse_tool_calls",
    "render_tool_call",
    "render_tool_response",
    "safe_eval",
    "strip_tool_calls",
    "tools_system_prompt",
    "truncate_text",
]
