"""A reward worker: runs the user's reward function in a child process with a per-call time limit.

Why a process and not a thread: a hung thread cannot be stopped, and a reward function (a sympy-based verifier, user
code) can hang or crash the interpreter. The parent speaks to the child over its stdin and a private copy of its stdout
with length-prefixed msgpack frames (never pickle). The child points its own ``sys.stdout`` at stderr so that prints in
user code cannot corrupt the frames.

Order of one call: parent writes ``{"id", "prompt", "completion", "ground_truth", "extra"}`` -> child calls the
function -> child writes ``{"id", "score", "components", "error"}``. If no reply arrives within ``timeout_s`` the parent
kills the child (its process group), counts a timeout, returns score 0 and starts a fresh child for the next call.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from typing import Any

import msgspec

from async_rl import metric_catalog as mc
from async_rl.frames import kill_child, read_frame, spawn_child, write_frame
from async_rl.rewards.base import RewardResult, load_reward_fn, normalize_reward

logger = logging.getLogger(__name__)


class RewardWorker:
    """Scores completions with ``spec`` (``module:function``) in a child process, ``timeout_s`` per call.

    Counters: ``calls``, ``errors`` (the function raised or returned something invalid), ``timeouts``, ``restarts``.
    """

    def __init__(self, spec: str, *, timeout_s: float, verl_style: bool = False) -> None:
        if timeout_s <= 0:
            raise ValueError(f"reward timeout_s must be > 0, got {timeout_s}")
        load_reward_fn(spec, verl_style=verl_style)  # fail fast in the parent with a clear message
        self.spec = spec
        self.timeout_s = timeout_s
        self.verl_style = verl_style
        self.calls = 0
        self.errors = 0
        self.timeouts = 0
        self.restarts = 0
        self._next_id = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._logged_error = False

    def _start(self) -> subprocess.Popen[bytes]:
        self._proc = spawn_child("async_rl.rewards.worker", self.spec, "1" if self.verl_style else "0")
        return self._proc

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            kill_child(proc)

    def score(
        self, prompt: str, completion: str, ground_truth: str, extra: dict[str, Any] | None = None
    ) -> RewardResult:
        """Score one completion; never raises for a misbehaving reward function."""
        self.calls += 1
        proc = self._proc if self._proc is not None and self._proc.poll() is None else None
        if proc is None:
            if self._proc is not None:
                self.restarts += 1
                self._kill()
            proc = self._start()
        assert proc.stdin is not None and proc.stdout is not None
        self._next_id += 1
        request = {
            "id": self._next_id,
            "prompt": prompt,
            "completion": completion,
            "ground_truth": ground_truth,
            "extra": extra or {},
        }
        try:
            write_frame(proc.stdin, request)
            reply = read_frame(proc.stdout.fileno(), time.monotonic() + self.timeout_s)
        except TimeoutError:
            self.timeouts += 1
            self.restarts += 1
            self._kill()
            self._log_once(f"reward function {self.spec} exceeded {self.timeout_s}s; scored 0")
            return RewardResult(score=0.0, error="timeout")
        except (EOFError, BrokenPipeError, OSError, ValueError, msgspec.DecodeError) as exc:
            self.errors += 1
            self.restarts += 1
            self._kill()
            self._log_once(f"reward worker for {self.spec} died ({exc!r}); scored 0")
            return RewardResult(score=0.0, error=f"worker died: {exc!r}")
        if reply.get("error"):
            self.errors += 1
            self._log_once(f"reward function {self.spec} failed: {reply['error']}; scored 0")
            return RewardResult(score=0.0, error=str(reply["error"]))
        return RewardResult(score=float(reply["score"]), components=dict(reply.get("components") or {}))

    def _log_once(self, message: str) -> None:
        if not self._logged_error:
            logger.warning("%s (further reward errors are only counted)", message)
            self._logged_error = True

    def metrics(self) -> dict[str, float]:
        return {
            mc.REWARD_CALLS: float(self.calls),
            mc.REWARD_ERRORS: float(self.errors),
            mc.REWARD_TIMEOUTS: float(self.timeouts),
            mc.REWARD_WORKER_RESTARTS: float(self.restarts),
        }

    def close(self) -> None:
        self._kill()

    def __enter__(self) -> RewardWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _child_main(spec: str, verl_style: bool) -> None:
    from async_rl.runtime.parent_watch import watch_parent

    # In its own session (a hung function must not take signals meant for the actor), so it would outlive a killed
    # actor while stuck in user code; EOF on stdin ends it otherwise. (It is started from the actor's scoring thread,
    # so PDEATHSIG also fires when that thread ends: only at the actor's shutdown, when the worker is closed anyway.)
    watch_parent(grace_s=1.0)
    reply_fd = os.dup(1)
    os.dup2(2, 1)  # user prints go to stderr, never into the reply pipe
    sys.stdout = sys.stderr
    replies = os.fdopen(reply_fd, "wb")
    fn = load_reward_fn(spec, verl_style=verl_style)
    while True:
        try:
            request = read_frame(0, None)
        except EOFError:
            return
        reply: dict[str, Any] = {"id": request.get("id")}
        try:
            result = normalize_reward(
                fn(request["prompt"], request["completion"], request["ground_truth"], request.get("extra") or {})
            )
            reply.update(score=result.score, components=result.components, error=None)
        except Exception as exc:  # a user function may raise anything; it is scored 0 and counted by the parent
            reply.update(score=0.0, components={}, error=f"{type(exc).__name__}: {exc}")
        write_frame(replies, reply)


if __name__ == "__main__":
    _child_main(sys.argv[1], sys.argv[2] == "1")
