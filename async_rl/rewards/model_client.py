"""An actor's side of the learned reward model: scores from the reward server (or in-process), checked and combined.

:class:`RewardModelClient` sends one :class:`~async_rl.rewards.model_wire.ScoreRequest` per rollout group to the
reward server over a ZeroMQ DEALER (the rollout plane's socket options and CURVE keys) and waits at most
``timeout_s`` for the reply. A missed deadline closes the socket (a stopped server's queued request goes with it) and
the request is sent again on a fresh one, ``retries`` times; then :class:`RewardModelUnavailable` tells the actor to
try the group again later. One request is in flight per socket, so a reply for any other request id, a count of scores
that does not match, an error answer or a non-finite score raise :class:`UntrustedScore`: the actor refuses the group.

:class:`InlineRewardModel` calls a :class:`~async_rl.rewards.model_score.RewardModelScorer` in the actor's own process
(``reward.reward_model.placement: inline``), behind the same ``score`` call.

:func:`combine` makes the reward the actor sends: ``rule_weight x rule + weight x model``, with the rule's own
components kept and ``rule`` and ``reward_model`` added, so DAPO's filter and validation see each one.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from async_rl.rewards.base import RewardResult
from async_rl.rewards.model_score import UntrustedScore
from async_rl.rewards.model_wire import ScoreReply, ScoreRequest, decode, encode

if TYPE_CHECKING:
    import zmq

    from async_rl.config.async_training import TransportConfig
    from async_rl.rewards.model_score import RewardModelScorer
    from async_rl.transport.sockets import CurveClientKeys

logger = logging.getLogger(__name__)

RULE_COMPONENT = "rule"
MODEL_COMPONENT = "reward_model"


class RewardModelUnavailable(RuntimeError):
    """No answer from the reward server within its deadlines: score the group again later."""


@dataclass
class RewardModelStats:
    """Cumulative counters of one actor's reward-model scoring."""

    requests: int = 0  # requests answered with usable scores
    sequences: int = 0
    timeouts: int = 0  # deadlines missed (each followed by a fresh socket)
    unavailable: int = 0  # score calls that gave up after every retry (the group is tried again later)
    untrusted: int = 0  # answers refused: error, wrong request id, wrong count, non-finite score
    seconds: float = 0.0  # wall-clock time of answered requests


class GroupScorer(Protocol):
    stats: RewardModelStats

    def score(self, prompt_ids: Sequence[int], response_ids: Sequence[Sequence[int]]) -> list[float]: ...

    def close(self) -> None: ...


def check_scores(scores: Sequence[float], expected: int) -> list[float]:
    """``scores`` as floats when there are ``expected`` of them and all are finite, else :class:`UntrustedScore`."""
    if len(scores) != expected:
        raise UntrustedScore(f"reward server sent {len(scores)} scores for {expected} completions")
    out = [float(s) for s in scores]
    bad = [i for i, s in enumerate(out) if not math.isfinite(s)]
    if bad:
        raise UntrustedScore(f"reward server sent non-finite scores for completions {bad[:8]}")
    return out


class RewardModelClient:
    """Blocking requests to the reward server at ``address`` (tcp://host:port); one thread uses it at a time."""

    def __init__(
        self,
        address: str,
        transport: TransportConfig,
        *,
        timeout_s: float,
        retries: int,
        keys: CurveClientKeys | None = None,
    ) -> None:
        import zmq

        if timeout_s <= 0 or retries < 0:
            raise ValueError(f"need timeout_s > 0 and retries >= 0, got {timeout_s} and {retries}")
        self.address = address
        self.transport = transport
        self.timeout_s = timeout_s
        self.retries = retries
        self.keys = keys
        self.stats = RewardModelStats()
        self._ctx = zmq.Context()
        self._sock: zmq.Socket | None = None

    def _socket(self) -> zmq.Socket:
        from async_rl.transport.sockets import connect_dealer

        if self._sock is None:  # a fresh identity each time: a late reply meant for a closed socket never reaches it
            self._sock = connect_dealer(
                self._ctx, self.address, f"rm-{uuid.uuid4().hex[:16]}", self.transport, self.keys
            )
        return self._sock

    def _drop_socket(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None

    def _attempt(self, request: ScoreRequest) -> list[float] | None:
        """The scores, or None when the deadline passed."""
        import zmq

        sock = self._socket()
        deadline = time.monotonic() + self.timeout_s
        try:
            sock.send(encode(request), flags=zmq.NOBLOCK)
        except zmq.Again:
            return None  # nothing to queue on: wait out a dead server's deadline below like any other
        while (left := deadline - time.monotonic()) > 0:
            if not sock.poll(max(1, int(left * 1000))):
                continue
            try:
                msg = decode(sock.recv(), self.transport.max_message_bytes)
            except ValueError as exc:
                raise UntrustedScore(f"reward server {self.address}: {exc}") from None
            if not isinstance(msg, ScoreReply):
                raise UntrustedScore(f"reward server {self.address} sent a request, not a reply")
            if msg.request_id != request.request_id:
                raise UntrustedScore(
                    f"reward server {self.address} answered request {msg.request_id!r}, expected {request.request_id!r}"
                )
            if msg.error is not None:
                raise UntrustedScore(f"reward server {self.address} could not score the group: {msg.error}")
            return check_scores(msg.scores, len(request.response_ids))
        return None

    def score(self, prompt_ids: Sequence[int], response_ids: Sequence[Sequence[int]]) -> list[float]:
        started = time.monotonic()
        for attempt in range(self.retries + 1):
            request = ScoreRequest(
                request_id=uuid.uuid4().hex,
                prompt_ids=[int(t) for t in prompt_ids],
                response_ids=[[int(t) for t in r] for r in response_ids],
            )
            try:
                scores = self._attempt(request)
            except UntrustedScore:
                self.stats.untrusted += 1
                self._drop_socket()  # whatever else that peer queued for us goes too
                raise
            if scores is not None:
                self.stats.requests += 1
                self.stats.sequences += len(scores)
                self.stats.seconds += time.monotonic() - started
                return scores
            self.stats.timeouts += 1
            self._drop_socket()
            logger.warning(
                "reward server %s: no reply within %.1f s (attempt %d of %d)",
                self.address,
                self.timeout_s,
                attempt + 1,
                self.retries + 1,
            )
        self.stats.unavailable += 1
        raise RewardModelUnavailable(
            f"reward server {self.address}: no reply in {self.retries + 1} attempts of {self.timeout_s:.1f} s"
        )

    def close(self) -> None:
        self._drop_socket()
        self._ctx.term()


class InlineRewardModel:
    """The reward model in this process: the same ``score`` call as :class:`RewardModelClient`."""

    def __init__(self, scorer: RewardModelScorer) -> None:
        self.scorer = scorer
        self.stats = RewardModelStats()

    def score(self, prompt_ids: Sequence[int], response_ids: Sequence[Sequence[int]]) -> list[float]:
        started = time.monotonic()
        try:
            scores = self.scorer.group_scores(prompt_ids, response_ids)
        except UntrustedScore:
            self.stats.untrusted += 1
            raise
        self.stats.requests += 1
        self.stats.sequences += len(scores)
        self.stats.seconds += time.monotonic() - started
        return check_scores(scores, len(response_ids))

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class RewardWeights:
    """``reward.reward_model.weight`` and ``rule_weight``."""

    model: float
    rule: float


def combine(rule: RewardResult, model_score: float, weights: RewardWeights) -> RewardResult:
    """The reward of one completion from its rule result and its reward-model score (both kept as components)."""
    components = dict(rule.components)
    components[RULE_COMPONENT] = rule.score
    components[MODEL_COMPONENT] = model_score
    return RewardResult(
        score=weights.rule * rule.score + weights.model * model_score, components=components, error=rule.error
    )


__all__ = [
    "MODEL_COMPONENT",
    "RULE_COMPONENT",
    "GroupScorer",
    "InlineRewardModel",
    "RewardModelClient",
    "RewardModelStats",
    "RewardModelUnavailable",
    "RewardWeights",
    "check_scores",
    "combine",
]
