"""Environments in a child process: many live episodes per actor, a time limit per call and per episode.

Why a process: environment code (user tools, a code runner) can hang, crash the interpreter or print; none of that may
take the actor down. :class:`EnvWorker` starts one child (``python -m async_rl.envs.sandbox``) holding a dict
``episode_id -> env instance`` and speaks to it over its stdin and a private copy of its stdout with length-prefixed
msgpack frames (:mod:`async_rl.frames`, never pickle). The child points ``sys.stdout`` and fd 1 at stderr and
fd 0 at ``/dev/null``, so prints and ``input()`` in env code cannot touch the frames.

Order of one call: parent writes ``{"id", "op", "episode", ...}`` -> child runs the env method under
``signal.setitimer`` -> child writes ``{"id", "ok", "error", "timeout", ...}``.

Failures and what the caller sees (an episode that ends this way is closed on both sides):

* env ``step`` (or ``reset``, or ``final_reward``) raises, returns an invalid :class:`StepResult`, or calls
  ``sys.exit``: the episode ends, reward 0, the error text as a role ``"user"`` observation, ``info`` counts
  ``tool_errors`` and ``env_error``. The interrupted env's state is unknown, so it is not stepped again. A failed
  ``reset`` returns normally; the episode's first ``step`` reports it.
* a call runs past ``call_timeout_s``: SIGALRM in the child raises a ``BaseException`` in the env code (a plain
  ``except Exception`` cannot swallow it); the episode ends as above with ``step_timeout``; the child's other episodes
  live on. Code that blocks signals (a C loop) or swallows even that is caught by the parent's hard deadline,
  ``call_timeout_s + grace_s``: it kills the child's process group and starts a fresh child at the next call.
* the child dies (killed, ``os._exit``, a segfault): every episode it held is lost; each one's next ``step`` returns
  ``done``, reward 0, ``info`` ``{"tool_errors": 1, "env_crashed": 1}``.
* a ``step`` that starts past ``episode_timeout_s`` after the episode's ``reset`` returns ``done``, reward 0,
  ``info["episode_timeout"] = 1``.

Caveat (as for the reward worker): the child asks the kernel for SIGTERM when the thread that started it exits, so a
child (re)started from a pool thread that later ends is lost then and restarted at the next call.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from async_rl.envs.base import Message, StepResult, check_step_result, load_environment_class
from async_rl.frames import ENCODE_ERRORS, encode_frame, kill_child, read_frame, spawn_child, write_frame

logger = logging.getLogger(__name__)

EpisodeId = int | str
T = TypeVar("T")


def _ended(text: str, **counters: float) -> StepResult:
    """An episode ended by a failure: one observation saying why, reward 0."""
    info = {"tool_errors": 1.0, **{k: float(v) for k, v in counters.items()}}
    return StepResult(observations=[{"role": "user", "content": text}], reward=0.0, done=True, info=info)


@dataclass
class _Episode:
    generation: int  # the child that holds it
    deadline: float  # time.monotonic() past which a step ends it
    failure: StepResult | None = None  # its reset failed: what its first step returns
    lost: bool = False  # its child died


class _ChildLost(Exception):
    """The child died or was killed during a call; every episode it held is gone."""

    def __init__(self, message: str, *, timed_out: bool) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class _StartFailed(RuntimeError):
    """A child could not be started or could not load the environment."""


class _BadRequest(Exception):
    """A request msgpack cannot carry (e.g. a non-msgpack value in ``extra``); nothing was sent."""


def _check_kwargs(cls: type, spec: str, kwargs: dict[str, Any]) -> None:
    """``ValueError`` when ``cls(**kwargs)`` would fail on its signature (checked without building one)."""
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):  # no signature to read (some C types): the first reset will tell
        return
    try:
        signature.bind(**kwargs)
    except TypeError as exc:
        raise ValueError(f"env kwargs {sorted(kwargs)} do not fit {spec!r}: {exc}") from exc


class EnvWorker:
    """Runs episodes of the environment class ``spec`` (``"module:Class"``), built with ``kwargs``, in one child.

    Thread-safe: calls from several threads are serialised by a lock (the child runs one call at a time). Counters,
    through :meth:`metrics`: calls (reset, step, final_reward), errors (env raised or returned something invalid, a
    failed reset, a dead child), timeouts (calls past ``call_timeout_s``), restarts, episode_timeouts, episodes_lost.
    """

    def __init__(
        self,
        spec: str,
        kwargs: dict[str, Any] | None = None,
        *,
        call_timeout_s: float,
        episode_timeout_s: float,
        grace_s: float = 2.0,
        startup_timeout_s: float = 60.0,
    ) -> None:
        for key, value in (("call_timeout_s", call_timeout_s), ("episode_timeout_s", episode_timeout_s)):
            if not value > 0:
                raise ValueError(f"env {key} must be > 0, got {value}")
        if grace_s < 0 or not startup_timeout_s > 0:
            raise ValueError(f"need grace_s >= 0 and startup_timeout_s > 0, got {grace_s}, {startup_timeout_s}")
        cls = load_environment_class(spec)  # fail fast in the parent with a clear message
        self.spec = spec
        self.kwargs = dict(kwargs or {})
        _check_kwargs(cls, spec, self.kwargs)
        try:
            encode_frame({"kwargs": self.kwargs})
        except ENCODE_ERRORS as exc:
            raise ValueError(f"env kwargs for {spec!r} must be msgpack-serialisable: {exc}") from exc
        self.call_timeout_s = call_timeout_s
        self.episode_timeout_s = episode_timeout_s
        self.grace_s = grace_s
        self.startup_timeout_s = startup_timeout_s
        self.calls = 0
        self.errors = 0
        self.timeouts = 0
        self.restarts = 0
        self.episode_timeouts = 0
        self.episodes_lost = 0
        self._episodes: dict[EpisodeId, _Episode] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._generation = 0
        self._next_id = 0
        self._closed = False
        self._lock = threading.Lock()
        self._logged_error = False
        self._start()  # eagerly: a child that cannot load the env raises here, in the caller's thread

    # -- the child process -------------------------------------------------------------------------------------

    def _start(self) -> None:
        if self._generation:
            self.restarts += 1
        self._generation += 1
        proc = spawn_child("async_rl.envs.sandbox")  # its own process group: killed as a whole (frames.kill_child)
        self._proc = proc
        assert proc.stdin is not None and proc.stdout is not None
        init = {
            "op": "init",
            "spec": self.spec,
            "kwargs": self.kwargs,
            "call_timeout_s": self.call_timeout_s,
            "sys_path": list(sys.path),  # so a spec the parent can import resolves the same way in the child
        }
        try:
            write_frame(proc.stdin, init)
            reply = read_frame(proc.stdout.fileno(), time.monotonic() + self.startup_timeout_s)
        except (TimeoutError, EOFError, OSError, ValueError) as exc:
            self._kill()
            raise _StartFailed(f"environment worker for {self.spec!r} did not start: {exc!r}") from exc
        if not reply.get("ok"):
            self._kill()
            raise _StartFailed(f"environment worker for {self.spec!r} failed to start: {reply.get('error')}")

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            kill_child(proc)

    def _lose_child(self) -> None:
        """Kill the child and mark every episode it held as lost."""
        self._kill()
        for episode in self._episodes.values():
            if episode.generation == self._generation and episode.failure is None and not episode.lost:
                episode.lost = True
                self.episodes_lost += 1

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"EnvWorker for {self.spec!r} is shut down")

    def _ensure_child(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        if self._proc is not None:  # died between calls
            self._log_once(f"environment worker for {self.spec!r} exited with {self._proc.returncode}; restarting")
            self._lose_child()
        self._start()

    def _exchange(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send one request and wait for its reply; :class:`_ChildLost` when the child dies or overruns ``timeout``."""
        self._ensure_child()
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        self._next_id += 1
        request = {"id": self._next_id, **request}
        try:
            data = encode_frame(request)
        except ENCODE_ERRORS as exc:
            raise _BadRequest(f"cannot send {request.get('op')} request: {exc}") from exc
        try:
            proc.stdin.write(data)
            proc.stdin.flush()
            reply = read_frame(proc.stdout.fileno(), time.monotonic() + timeout)
        except TimeoutError:
            self._lose_child()
            raise _ChildLost(
                f"environment call exceeded {timeout:.1f} s; its process was killed", timed_out=True
            ) from None
        except (EOFError, OSError, ValueError) as exc:  # msgspec.DecodeError is a ValueError
            self._lose_child()
            raise _ChildLost(f"environment process died ({exc!r})", timed_out=False) from exc
        if not isinstance(reply, dict) or reply.get("id") != request["id"]:
            self._lose_child()
            raise _ChildLost(f"environment process sent an unexpected reply {reply!r:.200}", timed_out=False)
        return reply

    def _hard_timeout(self) -> float:
        return self.call_timeout_s + self.grace_s

    def _log_once(self, message: str) -> None:
        if not self._logged_error:
            logger.warning("%s (further environment errors are only counted)", message)
            self._logged_error = True

    def _child_failed(self, reply: dict[str, Any], what: str) -> StepResult:
        """Count a failed reply and turn it into the result that ends the episode."""
        if reply.get("timeout"):
            self.timeouts += 1
            self._log_once(f"environment {self.spec!r} {what} exceeded {self.call_timeout_s} s")
            return _ended(f"environment error: {what} exceeded {self.call_timeout_s} s", step_timeout=1)
        self.errors += 1
        self._log_once(f"environment {self.spec!r} {what} failed: {reply.get('error')}")
        return _ended(f"environment error: {reply.get('error')}", env_error=1)

    def _crashed(self, exc: _ChildLost) -> StepResult:
        if exc.timed_out:
            self.timeouts += 1
            self._log_once(f"environment {self.spec!r}: {exc}")
            return _ended(f"environment error: {exc}", step_timeout=1, env_crashed=1)
        self.errors += 1
        self._log_once(f"environment {self.spec!r}: {exc}")
        return _ended(f"environment error: {exc}", env_crashed=1)

    # -- the episode API ---------------------------------------------------------------------------------------

    def reset(
        self, episode_id: EpisodeId, prompt: list[Message] | str, ground_truth: str, extra: dict[str, Any]
    ) -> None:
        """Start episode ``episode_id`` (replacing a live one of that id). Never raises for env failures: a failed
        reset is reported by the episode's first :meth:`step`."""
        with self._lock:
            self._check_open()
            self.calls += 1
            deadline = time.monotonic() + self.episode_timeout_s
            self._episodes.pop(episode_id, None)
            request = {
                "op": "reset",
                "episode": episode_id,
                "prompt": prompt,
                "ground_truth": ground_truth,
                "extra": extra or {},
            }
            failure: StepResult | None = None
            try:
                reply = self._exchange(request, self._hard_timeout())
                if not reply.get("ok"):
                    failure = self._child_failed(reply, "reset")
            except _ChildLost as exc:
                failure = self._crashed(exc)
            except (_BadRequest, _StartFailed) as exc:
                self.errors += 1
                failure = _ended(f"environment error: {exc}", env_error=1)
            self._episodes[episode_id] = _Episode(self._generation, deadline, failure=failure)

    def _take(self, episode_id: EpisodeId) -> _Episode:
        episode = self._episodes.get(episode_id)
        if episode is None:
            raise KeyError(f"unknown episode {episode_id!r} (never reset, already done, or closed)")
        return episode

    def step(self, episode_id: EpisodeId, assistant_text: str) -> StepResult:
        """Answer one assistant turn of ``episode_id``; never raises for env failures (see the module docstring).
        ``KeyError`` for an episode that is not live."""
        with self._lock:
            self._check_open()
            episode = self._take(episode_id)
            self.calls += 1
            if episode.failure is not None:
                del self._episodes[episode_id]
                return episode.failure
            if not episode.lost and (self._proc is None or self._proc.poll() is not None):
                self._lose_child()  # died since the last call: it held this episode
            if episode.lost or episode.generation != self._generation:
                del self._episodes[episode_id]
                return _ended("environment error: the environment process was restarted; episode lost", env_crashed=1)
            if time.monotonic() > episode.deadline:
                del self._episodes[episode_id]
                self.episode_timeouts += 1
                self._close_in_child(episode_id)
                return StepResult(
                    observations=[{"role": "user", "content": f"episode exceeded {self.episode_timeout_s} s"}],
                    reward=0.0,
                    done=True,
                    info={"episode_timeout": 1.0},
                )
            try:
                reply = self._exchange(
                    {"op": "step", "episode": episode_id, "text": assistant_text}, self._hard_timeout()
                )
            except _ChildLost as exc:
                del self._episodes[episode_id]
                return self._crashed(exc)
            except (_BadRequest, _StartFailed) as exc:
                del self._episodes[episode_id]
                self.errors += 1
                return _ended(f"environment error: {exc}", env_error=1)
            if not reply.get("ok"):
                del self._episodes[episode_id]
                return self._child_failed(reply, "step")
            result = StepResult(**reply["result"])
            if result.done:
                del self._episodes[episode_id]
            return result

    def final_reward(self, episode_id: EpisodeId, assistant_text: str) -> float:
        """The reward of an episode the driver ends itself (turn limit), from the env's ``final_reward`` (0 when it
        has none, failed, or the episode was lost or timed out). Ends the episode."""
        with self._lock:
            self._check_open()
            episode = self._take(episode_id)
            self.calls += 1
            del self._episodes[episode_id]
            if episode.failure is not None or episode.lost or episode.generation != self._generation:
                return 0.0
            if time.monotonic() > episode.deadline:
                self.episode_timeouts += 1
                self._close_in_child(episode_id)
                return 0.0
            try:
                reply = self._exchange(
                    {"op": "final_reward", "episode": episode_id, "text": assistant_text}, self._hard_timeout()
                )
            except _ChildLost as exc:
                self._crashed(exc)
                return 0.0
            except (_BadRequest, _StartFailed):
                self.errors += 1
                return 0.0
            if not reply.get("ok"):
                self._child_failed(reply, "final_reward")
                return 0.0
            return float(reply["reward"])

    def _close_in_child(self, episode_id: EpisodeId) -> None:
        if self._proc is None or self._proc.poll() is not None:
            return
        try:
            self._exchange({"op": "close", "episode": episode_id}, self._hard_timeout())
        except (_ChildLost, _BadRequest, _StartFailed):
            pass  # a lost child held nothing worth closing

    def close(self, episode_id: EpisodeId) -> None:
        """Drop episode ``episode_id`` (a no-op when it is not live)."""
        with self._lock:
            episode = self._episodes.pop(episode_id, None)
            if episode is not None and episode.generation == self._generation and not episode.lost:
                self._close_in_child(episode_id)

    def close_all(self) -> None:
        """Drop every live episode; the child stays up."""
        with self._lock:
            self._episodes.clear()
            if self._proc is not None and self._proc.poll() is None:
                try:
                    self._exchange({"op": "close_all"}, self._hard_timeout())
                except (_ChildLost, _BadRequest, _StartFailed):
                    pass

    def shutdown(self) -> None:
        """Drop every episode and stop the child (EOF on its stdin, then SIGKILL after a second). Idempotent."""
        with self._lock:
            self._episodes.clear()
            self._closed = True
            proc = self._proc
            if proc is None:
                return
            if proc.stdin is not None:
                try:
                    proc.stdin.close()
                except OSError:
                    pass
            try:
                proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
            self._kill()

    def live_episodes(self) -> int:
        """How many episodes are live (reset, not yet done or closed)."""
        with self._lock:
            return len(self._episodes)

    def metrics(self) -> dict[str, float]:
        """The counters by bare name (``calls``, ``errors``, ...); the caller namespaces them (``actor/env_calls``)."""
        with self._lock:
            return {
                "calls": float(self.calls),
                "errors": float(self.errors),
                "timeouts": float(self.timeouts),
                "restarts": float(self.restarts),
                "episode_timeouts": float(self.episode_timeouts),
                "episodes_lost": float(self.episodes_lost),
            }

    def __enter__(self) -> EnvWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


# -- the child ---------------------------------------------------------------------------------------------------


class _CallTimeout(BaseException):
    """Raised by SIGALRM inside env code; a BaseException so that ``except Exception`` in the env lets it through."""


def _on_alarm(signum: int, frame: object) -> None:
    raise _CallTimeout


class _Host:
    """The child's side: live episodes by id, each env call under a SIGALRM deadline."""

    def __init__(self, cls: type, kwargs: dict[str, Any], call_timeout_s: float) -> None:
        self.cls = cls
        self.kwargs = kwargs
        self.call_timeout_s = call_timeout_s
        self.episodes: dict[EpisodeId, Any] = {}

    def _timed(self, fn: Callable[[], T]) -> T:
        signal.setitimer(signal.ITIMER_REAL, self.call_timeout_s)
        try:
            return fn()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)

    def _env(self, episode_id: EpisodeId) -> Any:
        if episode_id not in self.episodes:
            raise LookupError(f"unknown episode {episode_id!r}")
        return self.episodes[episode_id]

    def _reset(self, request: dict[str, Any]) -> None:
        episode_id = request["episode"]
        self.episodes.pop(episode_id, None)

        def make() -> Any:
            env = self.cls(**self.kwargs)
            env.reset(request["prompt"], request["ground_truth"], request.get("extra") or {})
            return env

        self.episodes[episode_id] = self._timed(make)

    def _step(self, request: dict[str, Any]) -> dict[str, Any]:
        episode_id = request["episode"]
        env = self._env(episode_id)
        try:
            result = check_step_result(self._timed(lambda: env.step(request["text"])))
        except BaseException:
            del self.episodes[episode_id]  # its state is unknown after a failed step
            raise
        if result.done:
            del self.episodes[episode_id]
        return asdict(result)

    def _final_reward(self, request: dict[str, Any]) -> float:
        env = self.episodes.pop(request["episode"], None)
        if env is None:
            raise LookupError(f"unknown episode {request['episode']!r}")
        fn = getattr(env, "final_reward", None)
        if fn is None:
            return 0.0
        reward = self._timed(lambda: fn(request["text"]))
        if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
            raise ValueError(f"final_reward must return a finite number, got {reward!r:.100}")
        return float(reward)

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        reply: dict[str, Any] = {"id": request.get("id"), "ok": True, "error": None, "timeout": False}
        op = request.get("op")
        try:
            if op == "reset":
                self._reset(request)
            elif op == "step":
                reply["result"] = self._step(request)
            elif op == "final_reward":
                reply["reward"] = self._final_reward(request)
            elif op == "close":
                self.episodes.pop(request["episode"], None)
            elif op == "close_all":
                self.episodes.clear()
            else:
                raise ValueError(f"unknown op {op!r}")
        except _CallTimeout:
            reply.update(ok=False, timeout=True, error=f"exceeded {self.call_timeout_s} s")
        except (Exception, SystemExit) as exc:  # env code may raise anything; the parent counts it
            reply.update(ok=False, error=f"{type(exc).__name__}: {exc}")
        return reply


def _child_main() -> None:
    from async_rl.runtime.parent_watch import watch_parent

    watch_parent(grace_s=1.0)  # in a session of its own, so it would outlive a killed actor otherwise
    request_fd, reply_fd = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # input() in env code reads nothing instead of eating frames
    os.close(devnull)
    os.dup2(2, 1)  # env prints go to stderr, never into the reply pipe
    sys.stdout = sys.stderr
    replies = os.fdopen(reply_fd, "wb")
    init = read_frame(request_fd, None)
    parent_path = list(init.get("sys_path") or [])
    sys.path[:] = parent_path + [p for p in sys.path if p not in parent_path]
    try:
        host = _Host(load_environment_class(init["spec"]), dict(init.get("kwargs") or {}), init["call_timeout_s"])
    except Exception as exc:
        write_frame(replies, {"id": init.get("id"), "ok": False, "error": f"{type(exc).__name__}: {exc}"})
        return
    signal.signal(signal.SIGALRM, _on_alarm)
    write_frame(replies, {"id": init.get("id"), "ok": True, "error": None})
    while True:
        try:
            request = read_frame(request_fd, None)
        except EOFError:
            return
        write_frame(replies, host.handle(request))


if __name__ == "__main__":
    _child_main()


__all__ = ["EnvWorker", "EpisodeId"]
