"""Test-only environments for the sandbox tests, loaded by the child process from this file's path.

``EchoEnv`` behaves; the others misbehave in one way each, chosen by the assistant text so one class covers every
case: ``"sleep <s>"`` sleeps, ``"hang"`` ignores SIGALRM and sleeps, ``"exit"`` kills its own process, ``"print"``
writes junk to stdout (Python and fd 1), ``"raise"`` raises, ``"bad"`` returns something that is not a StepResult,
``"catch-all"`` sleeps inside ``except Exception``.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

from async_rl.envs.base import Message, StepResult


def tool_options(**changes: Any) -> dict[str, Any]:
    """A tool environment's keyword arguments as the actor passes them (``runtime.actor_main.environment_kwargs``),
    at ``multi_turn``'s config defaults, with ``changes``."""
    options = {
        "max_parallel_calls": 1,
        "max_tool_response_length": 256,
        "truncate_side": "middle",
        "tool_format": "hermes",
    }
    return {**options, **changes}


class EchoEnv:
    """Answers turn ``n`` with ``"<pid> turn <n>: <text>"``; ``"done"`` ends the episode with reward 1.0, and
    ``final_reward`` is 0.5. Constructor kwargs are echoed in the first reply so their passing can be checked."""

    def __init__(self, tag: str = "") -> None:
        self.tag = tag
        self.turns = 0
        self.ground_truth = ""

    def reset(self, prompt: list[Message] | str, ground_truth: str, extra: dict[str, Any]) -> None:
        if ground_truth == "fail":
            raise RuntimeError("reset refused")
        self.ground_truth = ground_truth

    def step(self, assistant_text: str) -> StepResult:
        self.turns += 1
        if assistant_text == "done":
            return StepResult([], reward=1.0, done=True, info={"turns": self.turns})
        if assistant_text.startswith("sleep "):
            time.sleep(float(assistant_text.split()[1]))
        elif assistant_text == "hang":
            signal.signal(signal.SIGALRM, signal.SIG_IGN)
            time.sleep(30)
        elif assistant_text == "exit":
            os._exit(3)
        elif assistant_text == "print":
            print("junk on stdout", flush=True)
            sys.stdout.write("\x00\x00\x00\x10more junk\n")
            os.write(1, b"\xff\xff\xff\xff raw fd 1\n")
        elif assistant_text == "raise":
            raise ValueError("step blew up")
        elif assistant_text == "bad":
            return "not a StepResult"  # type: ignore[return-value]
        elif assistant_text == "catch-all":
            try:
                time.sleep(30)
            except Exception:
                return StepResult([], reward=1.0, done=True)
        content = f"{os.getpid()} turn {self.turns}: {assistant_text} [{self.tag}|{self.ground_truth}]"
        return StepResult([{"role": "user", "content": content}], reward=0.0, done=False)

    def final_reward(self, assistant_text: str) -> float:
        return 0.5
