"""An emulated actor: the real actor loop, rollout client and weight-sync receiver around a fixed-rate fake engine.

Why: measuring how well the pipeline overlaps generation with training (``tools/bench_pipeline.py``) needs a
generation side with a known, fixed capacity that takes almost no CPU from the learner (on a 2-core machine a vLLM CPU
actor and the learner fight for the same cores). So only the engine is replaced; everything else is the actor's
real code path:

* :class:`~async_rl.actor.loop.ActorLoop` drives it: hello, credits, grants, acks and the staleness gate (a grant
  starts only when the loaded version is ``>= grant.min_version``), exactly as for the vLLM actor;
* a real :class:`~async_rl.transport.RolloutClient` talks to the coordinator;
* :class:`ReceiveOnlyWeightSync` joins the weight-sync group at the rank the learner's plan assigns and receives
  every update with :class:`~async_rl.weight_sync.WeightReceiver` (every byte is digested and checked against the
  sender's digests), so the learner's broadcast costs what it costs; the received tensors are then discarded.

Pacing model (:class:`TokenRatePacer`, pure): one FIFO server producing ``tokens_per_s`` tokens per second. A group
of ``n`` completions of ``L`` tokens costs ``n * L`` tokens; submitted at time ``t`` it finishes at
``f = max(t, f_prev) + n * L / tokens_per_s``, where ``f_prev`` is the finish time of the group submitted before it.
A weight update pauses the server like the vLLM actor's in-flight update pauses its engine: work not finished when
the pause began is pushed back by the pause's length. The server's capacity is therefore exactly
``tokens_per_s / (n * L)`` groups per second whenever it has work, minus the time spent receiving weights. While a
group waits for its finish time the coroutine sleeps (near-zero CPU).

Completions: ``L`` token ids drawn (seeded by the grant's sampling seed) from the prompt's own token ids, so they are
valid ids of the model's vocabulary; a constant behaviour log-prob per token; ``min_version`` = the version loaded
when the group was submitted, ``max_version`` = the version loaded when it finished (in-flight updates span
versions, as with vLLM). :class:`EmulatedScorer` gives each completion a deterministic pseudo-random reward in
[0, 1) (a hash of prompt and completion), so GRPO advantages are non-zero and the learner trains for real.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np
import torch

from async_rl import metric_catalog as mc
from async_rl.actor.engine import EngineOutput, EngineStats, UpdateMode
from async_rl.rewards import RewardResult
from async_rl.transport.protocol import GroupSampling
from async_rl.weight_sync import WeightReceiver, WeightSyncError, WeightSyncGroup
from async_rl.weight_sync.membership import JoinInfo, announce_at, join_epoch

logger = logging.getLogger(__name__)

__all__ = ["EmulatedEngine", "EmulatedScorer", "ReceiveOnlyWeightSync", "TokenRatePacer"]


class TokenRatePacer:
    """Finish times of jobs on one FIFO server of fixed token rate, with pauses (pure: the caller passes ``now``).

    ``submit(now, tokens)`` -> ticket; ``finish_time(ticket)``; ``pause(now)`` / ``resume(now)`` shift every job not
    finished when the pause began by the pause's length; ``forget(ticket)`` drops a collected job, and
    ``abandon_all()`` every job (they were aborted).
    """

    def __init__(self, tokens_per_s: float) -> None:
        if not tokens_per_s > 0:
            raise ValueError(f"tokens_per_s must be > 0, got {tokens_per_s}")
        self.tokens_per_s = float(tokens_per_s)
        self.busy_until = float("-inf")
        self.paused_at: float | None = None
        self.paused_s = 0.0
        self._finish: dict[int, float] = {}
        self._next = 0

    def submit(self, now: float, tokens: int) -> int:
        """Queue a job of ``tokens`` tokens behind the ones already queued; returns its ticket."""
        if tokens < 0:
            raise ValueError(f"tokens must be >= 0, got {tokens}")
        # While paused the server makes no progress: the job starts no earlier than the pause (and is shifted later).
        effective_now = now if self.paused_at is None else self.paused_at
        start = max(effective_now, self.busy_until)
        self.busy_until = start + tokens / self.tokens_per_s
        ticket = self._next
        self._next += 1
        self._finish[ticket] = self.busy_until
        return ticket

    def finish_time(self, ticket: int) -> float:
        return self._finish[ticket]

    def forget(self, ticket: int) -> None:
        self._finish.pop(ticket, None)

    def abandon_all(self) -> None:
        """Every queued job was aborted: the server owes nothing, and the next job starts at once (or at resume)."""
        self._finish.clear()
        self.busy_until = float("-inf")

    @property
    def paused(self) -> bool:
        return self.paused_at is not None

    def pause(self, now: float) -> None:
        if self.paused_at is None:
            self.paused_at = now

    def resume(self, now: float) -> None:
        """End the pause: every job (and the queue's end) not finished when it began moves later by its length."""
        if self.paused_at is None:
            return
        began, self.paused_at = self.paused_at, None
        delay = max(0.0, now - began)
        self.paused_s += delay
        for ticket, finish in self._finish.items():
            if finish > began:
                self._finish[ticket] = finish + delay
        if self.busy_until > began:
            self.busy_until += delay


class EmulatedEngine:
    """Stands in for :class:`~async_rl.actor.engine.GenerationEngine` (the surface ``ActorLoop`` uses).

    ``response_len`` fixes the tokens per completion (default: each grant's ``max_tokens``); ``logprob`` is the
    behaviour log-prob recorded for every token. A failed weight update ends every running group with finish reason
    ``abort`` and leaves the server paused until an update succeeds, as ``GenerationEngine`` does with vLLM.
    """

    def __init__(
        self, tokens_per_s: float, *, response_len: int | None = None, logprob: float = -1.0, version: int = 0
    ) -> None:
        if response_len is not None and response_len < 1:
            raise ValueError(f"response_len must be >= 1, got {response_len}")
        if not np.isfinite(logprob) or logprob > 0:
            raise ValueError(f"logprob must be a finite log-probability (<= 0), got {logprob}")
        self.pacer = TokenRatePacer(tokens_per_s)
        self.response_len = response_len
        self.logprob = float(logprob)
        self.version = version
        self.stats = EngineStats()
        self.dead = False  # the emulated engine never dies on its own (tests' subclasses may set it)
        self.lora = False  # full weights only
        self.halted = False  # a failed update left it paused (until one succeeds)
        # One future per running group, resolved by one timer at its finish time (re-armed when a pause moves it):
        # a timer per group costs far less CPU than a polling or wait_for loop per group.
        self._waiters: dict[int, asyncio.Future[bool]] = {}  # ticket -> future(aborted?)
        self._timers: dict[int, asyncio.TimerHandle] = {}
        self._idle = asyncio.Event()
        self._idle.set()

    def _arm(self, ticket: int) -> None:
        """(Re)schedule the timer that ends group ``ticket`` at its finish time (none while paused)."""
        old = self._timers.pop(ticket, None)
        if old is not None:
            old.cancel()
        fut = self._waiters.get(ticket)
        if fut is None or fut.done():  # ended (aborted) already
            return
        if not self.pacer.paused:
            loop = asyncio.get_running_loop()  # loop.time() is time.monotonic(), the pacer's clock
            self._timers[ticket] = loop.call_at(self.pacer.finish_time(ticket), self._fire, ticket)

    def _fire(self, ticket: int) -> None:
        self._timers.pop(ticket, None)
        fut = self._waiters.get(ticket)
        if fut is None or fut.done():
            return
        if self.pacer.paused or time.monotonic() < self.pacer.finish_time(ticket):
            self._arm(ticket)  # fired early (clock granularity) or moved by a pause
        else:
            fut.set_result(False)

    def _end(self, ticket: int, *, aborted: bool) -> None:
        timer = self._timers.pop(ticket, None)
        if timer is not None:
            timer.cancel()
        fut = self._waiters.get(ticket)
        if fut is not None and not fut.done():
            fut.set_result(aborted)

    async def generate(self, prompt_token_ids: Sequence[int], sampling: GroupSampling) -> list[EngineOutput]:
        """Wait until the pacer says the group is done, then return ``sampling.n`` completions of ``L`` tokens."""
        length = self.response_len or sampling.max_tokens
        start_version = self.version
        ticket = self.pacer.submit(time.monotonic(), sampling.n * length)
        self._waiters[ticket] = asyncio.get_running_loop().create_future()
        self._idle.clear()
        try:
            self._arm(ticket)
            aborted = await self._waiters[ticket]
        finally:
            self._end(ticket, aborted=True)  # cancelled: drop the timer
            del self._waiters[ticket]
            self.pacer.forget(ticket)
            if not self._waiters:
                self._idle.set()
        end_version = self.version
        rng = np.random.default_rng([sampling.seed or 0, len(prompt_token_ids)])
        vocab = np.asarray(prompt_token_ids or [0], dtype=np.int32)
        completions = []
        for _ in range(sampling.n):
            tokens = np.zeros(0, dtype=np.int32) if aborted else rng.choice(vocab, size=length).astype(np.int32)
            completions.append(
                EngineOutput(
                    token_ids=tokens,
                    logprobs=np.full(len(tokens), self.logprob, dtype=np.float32),
                    finish_reason="abort" if aborted else "length",
                    min_version=start_version,
                    max_version=end_version,
                    text=tokens.tobytes().hex(),  # cheap and unique per token sequence: what the scorer hashes
                )
            )
        if not aborted:
            self.stats.requests += 1
            self.stats.completions += sampling.n
            self.stats.generated_tokens += sampling.n * length
        return completions

    async def set_cpu_threads(self, n: int) -> None:
        """Nothing to lend: the emulated engine computes no model (its timing comes from its speed settings)."""

    async def update_weights(self, new_version: int, load: Callable[[], Awaitable[None]], mode: UpdateMode) -> None:
        """Pause -> ``load()`` -> set version -> resume, like ``GenerationEngine.update_weights``.

        ``"inflight"`` pauses at once (unfinished groups finish later by the update's length); ``"drain"`` waits for
        every running group to finish first. If ``load`` raises, every running group is aborted, the server stays
        paused (until an update succeeds) and the error propagates.
        """
        if mode not in ("inflight", "drain"):
            raise ValueError(f"update mode must be 'inflight' or 'drain', got {mode!r}")
        if new_version < self.version:
            raise ValueError(f"new_version {new_version} is older than the loaded version {self.version}")
        if mode == "drain" and not self.pacer.paused:  # a paused server (a failed update) has nothing to drain
            await self._idle.wait()
        self._pause(abort=False)
        try:
            await load()
        except BaseException:
            self._pause(abort=True)
            self.halted = True
            raise
        self.halted = False
        self.version = new_version
        self._resume()
        self.stats.updates += 1

    async def probe(self, token_ids: list[int]) -> list[float]:
        raise RuntimeError("the emulated engine computes no log-probs")

    def adapter_dir(self, version: int) -> str:
        raise RuntimeError("the emulated engine serves no LoRA adapters")

    def _pause(self, *, abort: bool) -> None:
        """Stop the server; ``abort`` also ends every running group (finish reason ``abort``)."""
        self.pacer.pause(time.monotonic())
        for ticket in list(self._waiters):
            if abort:
                self._end(ticket, aborted=True)
            else:
                self._arm(ticket)  # paused: cancels its timer
        if abort:
            self.pacer.abandon_all()

    def _resume(self) -> None:
        self.pacer.resume(time.monotonic())
        for ticket in list(self._waiters):
            self._arm(ticket)  # at the finish time the pause moved

    def metrics(self) -> dict[str, float]:
        return {
            mc.ACTOR_EMULATED_TOKENS_PER_S: self.pacer.tokens_per_s,
            mc.ACTOR_EMULATED_PAUSED_S: self.pacer.paused_s,
            mc.ACTOR_EMULATED_UPDATES: float(self.stats.updates),
            mc.ACTOR_EMULATED_PROCESS_CPU_S: time.process_time(),  # the whole actor process: should stay near zero
        }


class EmulatedScorer:
    """A deterministic pseudo-random reward in [0, 1): a hash of the prompt and the completion text."""

    def score(self, prompt: str, completion: str, ground_truth: str, extra: dict[str, Any] | None = None) -> Any:
        del ground_truth, extra
        digest = hashlib.blake2b(f"{prompt}\x00{completion}".encode(), digest_size=8).digest()
        return RewardResult(score=int.from_bytes(digest, "little") / 2.0**64)


def _discard(batch: list[tuple[str, torch.Tensor]]) -> None:
    """The receiver has digested these bytes already; an emulated actor has no model to load them into."""
    del batch


class ReceiveOnlyWeightSync:
    """The actor side of the weight-sync group without a model: join at the plan's rank, receive, verify, discard.

    Same group and receiver as the vLLM worker extension (``vllm_ext.BroadcastWeightTransferEngine``): a fresh
    TCPStore client and :class:`WeightSyncGroup` per join (a new epoch replaces the old group), and
    :class:`WeightReceiver` per update, which raises on a digest mismatch, a protocol error or a timeout. The blocking
    collectives run in a worker thread so the actor's event loop (and the emulated generation) keeps running.
    """

    def __init__(self) -> None:
        self.group: WeightSyncGroup | None = None
        self.updates = 0
        self.last_report: dict[str, Any] | None = None
        self.held: int | None = None  # the version stage() received and load_staged() has not loaded yet

    async def join(self, info: JoinInfo) -> None:
        await asyncio.to_thread(self._join, info)

    def _join(self, info: JoinInfo) -> None:
        self.close()
        self.group = join_epoch(info)

    async def announce(self, host: str, port: int, *, member: str, token: str, timeout_s: float) -> None:
        await asyncio.to_thread(announce_at, host, port, member, token, timeout_s=timeout_s)

    async def update(self, version: int) -> dict[str, Any]:
        """Receive and verify one complete update of ``version`` (the engine pauses around it)."""
        group = self.group
        if group is None or group.broken:
            raise WeightSyncError("weight-sync group not joined (or broken): join under a new epoch first")
        report = await asyncio.to_thread(WeightReceiver(group).receive, _discard, expect_version=version)
        self.updates += 1
        self.last_report = report.as_dict()
        return self.last_report

    async def update_adapter(self, version: int, adapter_dir: str, adapter_config: dict[str, Any]) -> dict[str, Any]:
        """A LoRA update is received and verified the same way (and discarded)."""
        return await self.update(version)

    async def stage(self, version: int) -> dict[str, Any]:
        """Receive and verify ``version`` to load later: there is nothing to keep, so the same as :meth:`update`."""
        report = await self.update(version)
        self.held = version
        return report

    async def load_staged(self, version: int) -> dict[str, Any]:
        """Loading the held version: it must be the one received last by :meth:`stage`."""
        if self.held != version:
            raise WeightSyncError(f"no held update of version {version} (holding {self.held})")
        self.held = None
        assert self.last_report is not None
        return self.last_report

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None
