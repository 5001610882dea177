"""The calculator environment: arithmetic word problems that a small model solves by calling a calculator tool.

The tool evaluates an expression with a whitelist walk of Python's ``ast`` (numbers, ``+ - * / // % **``, unary
signs, parentheses), never ``eval``: names, attributes, calls and anything else are an error the model reads back.
Exponents and every intermediate result are bounded, so ``9**9**9`` is refused instead of eating the CPU.

The final answer is the last number of the first assistant turn without a tool call; the reward is 1.0 when it equals
the ground truth, else 0.0. Problems are 2-3 digit multiplications and additions, which SmolLM2-135M gets wrong by
itself but can copy from a tool response.
"""

from __future__ import annotations

import ast
import math
import operator
import random
import re
import zlib
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from async_rl.envs.base import Message, Tool, ToolEnvironment
from async_rl.envs.tool_format import (
    ToolCall,
    render_tool_call,
    render_tool_response,
    strip_tool_calls,
    tools_system_prompt,
)

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_ABS = 10**18
"""Largest magnitude of any literal or intermediate result."""


class CalcError(ValueError):
    """An expression the calculator refuses or cannot evaluate; its message is shown to the model."""


_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_REFUSED = {
    ast.Name: "names are not allowed",
    ast.Attribute: "attributes are not allowed",
    ast.Call: "function calls are not allowed",
    ast.Tuple: "tuples are not allowed (write numbers without commas)",
}


def _bounded(value: int | float) -> int | float:
    if isinstance(value, float) and not math.isfinite(value):
        raise CalcError("result is not a finite number")
    if abs(value) > MAX_ABS:
        raise CalcError(f"result too large (limit {MAX_ABS:.0e})")
    return value


def _power(base: int | float, exponent: int | float) -> int | float:
    if isinstance(exponent, float) and not exponent.is_integer():
        raise CalcError("only whole-number exponents are allowed")
    exponent = int(exponent)
    if abs(exponent) > MAX_EXPONENT:
        raise CalcError(f"exponent {exponent} is too large (limit {MAX_EXPONENT})")
    if exponent > 0 and abs(base) > 1 and exponent * math.log10(abs(base)) > math.log10(MAX_ABS):
        raise CalcError(f"result too large (limit {MAX_ABS:.0e})")
    return base**exponent


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise CalcError(f"unsupported constant {node.value!r:.40}")
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _bounded(_UNARY[type(node.op)](_eval(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        try:
            if isinstance(node.op, ast.Pow):
                return _bounded(_power(left, right))
            return _bounded(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise CalcError("division by zero") from None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitXor):
        raise CalcError("^ is not supported; write ** for powers")
    reason = next((text for kind, text in _REFUSED.items() if isinstance(node, kind)), None)
    raise CalcError(reason or f"unsupported syntax: {type(node).__name__}")


def safe_eval(expression: str) -> int | float:
    """The value of an arithmetic ``expression``; :class:`CalcError` for anything but numbers and + - * / // % **."""
    if not isinstance(expression, str):
        raise CalcError(f"expression must be a string, got {type(expression).__name__}")
    text = expression.strip().replace("×", "*").replace("÷", "/")
    if not text:
        raise CalcError("empty expression")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalcError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        raise CalcError(f"cannot parse {text!r}") from None
    try:
        return _eval(tree.body)
    except (OverflowError, RecursionError):
        raise CalcError("result too large") from None


def format_number(value: int | float) -> str:
    """``value`` as the calculator prints it: whole numbers without a decimal point, others to 12 significant digits."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return str(value) if isinstance(value, int) else f"{value:.12g}"


def calculator(expression: str) -> str:
    """The calculator tool: the value of ``expression`` as text (raises :class:`CalcError`)."""
    return format_number(safe_eval(expression))


CALCULATOR_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "for example 23*17"}},
            "required": ["expression"],
        },
    },
}

_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")


def last_number(text: str) -> Fraction | None:
    """The last number written in ``text`` (``1,234`` and ``-3.5`` included) as an exact fraction, or None."""
    matches = _NUMBER.findall(text)
    if not matches:
        return None
    try:
        return Fraction(matches[-1].replace(",", ""))
    except (ValueError, ZeroDivisionError):  # a number past Python's int-string limit
        return None


class CalculatorEnv(ToolEnvironment):
    """Word problems with one ``calculator(expression)`` tool; reward 1.0 for the right final number, else 0.0.

    Keyword arguments are :class:`ToolEnvironment`'s (``max_parallel_calls``, ``max_tool_response_length``,
    ``truncate_side``, ``tool_format``). The driver enforces the turn limit and then asks :meth:`final_reward` of the
    last turn.
    """

    tools = [CALCULATOR_TOOL]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__({"calculator": Tool(CALCULATOR_TOOL, calculator)}, **kwargs)

    def final_reward(self, assistant_text: str) -> float:
        """1.0 when the last number of the turn (outside tool-call blocks) equals the ground truth, else 0.0."""
        answer = last_number(strip_tool_calls(assistant_text))
        truth = last_number(self.ground_truth)
        return 1.0 if answer is not None and answer == truth else 0.0


INSTRUCTIONS = "Solve the math word problem. Use the calculator tool for the arithmetic, then give the answer."
EXAMPLE_CALL = ToolCall("calculator", {"expression": "23*17"})

# (question, the expression that solves it, operand ranges) per template; c is unused by two-operand templates.
_TEMPLATES: list[tuple[str, str, tuple[tuple[int, int], ...]]] = [
    (
        "A shop has {a} boxes with {b} apples in each box. How many apples are there?",
        "{a}*{b}",
        ((12, 99), (12, 99)),
    ),
    (
        "Each ticket costs {b} dollars. How many dollars do {a} tickets cost?",
        "{a}*{b}",
        ((12, 99), (12, 99)),
    ),
    (
        "A school has {a} classes with {b} students each. How many students are there?",
        "{a}*{b}",
        ((11, 60), (15, 40)),
    ),
    (
        "Sam had {a} stamps and bought {b} more. How many stamps does Sam have now?",
        "{a}+{b}",
        ((100, 999), (100, 999)),
    ),
    (
        "A library had {a} books and lent out {b} of them. How many books are left?",
        "{a}-{b}",
        ((500, 999), (100, 499)),
    ),
    (
        "A farmer plants {a} rows of {b} trees and then {c} more trees. How many trees are there?",
        "{a}*{b}+{c}",
        ((12, 60), (12, 60), (10, 99)),
    ),
]


def _in_split(key: str, split: str) -> bool:
    return (zlib.crc32(key.encode()) % 10 == 0) == (split == "eval")


# One solved exchange shown before each problem (one-shot prompting): untrained, SmolLM2-135M-Instruct never calls
# the tool from the instructions alone (0 of 128 samples at temperature 1), and sometimes does after one example.
DEMONSTRATION: list[Message] = [
    {"role": "user", "content": "A farm has 12 rows with 31 trees in each row. How many trees are there?"},
    {"role": "assistant", "content": render_tool_call(ToolCall("calculator", {"expression": "12*31"}))},
    {"role": "tool", "content": render_tool_response("calculator", "372")},
    {"role": "assistant", "content": "There are 372 trees."},
]


def _problems(n: int, *, seed: int, split: str) -> list[tuple[str, str, str]]:
    """``n`` problems of ``split`` as (question, solving expression, answer); the same seed gives the same list."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    rng = random.Random(seed)
    out: list[tuple[str, str, str]] = []
    while len(out) < n:
        index = rng.randrange(len(_TEMPLATES))
        question, expression, ranges = _TEMPLATES[index]
        a, b, c = ([rng.randint(lo, hi) for lo, hi in ranges] + [0])[:3]
        if not _in_split(f"calc:{index}:{a}:{b}:{c}", split):
            continue
        expr = expression.format(a=a, b=b, c=c)
        out.append((question.format(a=a, b=b, c=c), expr, calculator(expr)))
    return out


def _prompt(question: str, demonstration: bool) -> list[Message]:
    system = tools_system_prompt([CALCULATOR_TOOL], INSTRUCTIONS, example=EXAMPLE_CALL)
    return [
        {"role": "system", "content": system},
        *(DEMONSTRATION if demonstration else []),
        {"role": "user", "content": question},
    ]


def make_calculator_problems(
    n: int, *, seed: int, split: str = "train", demonstration: bool = True
) -> list[dict[str, Any]]:
    """``n`` word problems for :class:`CalculatorEnv`; ``split`` is "train" or "eval" (about 10%, never overlapping:
    a hash of the template and operands decides, as in :mod:`async_rl.data.arith`). The same seed gives the same list.

    Each record is ``{"prompt": [system, *DEMONSTRATION, user], "ground_truth": "391", "extra": {"data_source":
    "calculator_tool"}}`` (``demonstration=False``: ``[system, user]``).
    """
    return [
        {
            "prompt": _prompt(question, demonstration),
            "ground_truth": answer,
            "extra": {"data_source": "calculator_tool"},
        }
        for question, _, answer in _problems(n, seed=seed, split=split)
    ]


FINAL_ANSWER = "The answer is {answer}."
"""The final turn of a solved transcript."""


def make_calculator_transcripts(
    env: CalculatorEnv, n: int, *, seed: int, split: str = "train", demonstration: bool = True
) -> list[dict[str, Any]]:
    """The same ``n`` problems as :func:`make_calculator_problems` (same seed and split), each solved by the
    environment itself: ``{"messages": [*prompt, call, tool, answer]}``, where the assistant calls the calculator on
    the expression that solves the problem, the tool message is what :class:`CalculatorEnv` answers that call with,
    and the last turn states the result (:data:`FINAL_ANSWER`), which the environment rewards 1.0 (checked here).
    Supervised fine-tuning on them teaches the call format and copying the result: the warm start multi-turn RL
    needs for a model that never calls the tool by itself."""
    out = []
    for question, expression, answer in _problems(n, seed=seed, split=split):
        prompt = _prompt(question, demonstration)
        env.reset(prompt, answer, {})
        call = render_tool_call(ToolCall("calculator", {"expression": expression}))
        tool = env.step(call)
        final = FINAL_ANSWER.format(answer=answer)
        end = env.step(final)
        said = [m["content"] for m in tool.observations]
        if said != [render_tool_response("calculator", answer)] or not end.done or end.reward != 1.0:
            raise AssertionError(f"the environment did not reward its own solution of {question!r}: {final!r}")
        out.append(
            {
                "messages": [
                    *prompt,
                    {"role": "assistant", "content": call},
                    *tool.observations,
                    {"role": "assistant", "content": final},
                ]
            }
        )
    return out
