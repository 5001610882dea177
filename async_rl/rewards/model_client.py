"""An actor's side of the learned reward model: scores from the reward server (or in-process), checked and combined.

:class:`RewardModelClient` sends one :class:`~async_rl.rewards.model_wire.ScoreRequest` per rollout group to the
reward server over a ZeroMQ DEALER (the rollout plane's socket options and CURVE keys) and waits at most
``timeout_s`` for the reply. :meth:`RewardModelClient.score_groups` sends the requests of several groups at once (an
actor batches the groups that finish together, so the server scores them in one turn) and waits for all their replies
under one deadline. A missed deadline closes the socket (a stopped server's queued requests go with it) and the
unanswered requests are sent again on a fresh one, ``retries`` times; then :class:`RewardModelUnavailable` tells the
actor to try those groups again later. A count of scores that does not match, an error answer or a non-finite score
refuse that group (:class:`UntrustedScore`); a reply for a request that is not in flight, or a frame that is not a
reply, refuses every group still waiting (the socket is closed: nothing more from that peer is believed).

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


Group = tuple[Sequence[int], Sequence[Sequence[int]]]
"""One group to score: its prompt's token ids and each completion's."""

GroupResult = list[float] | UntrustedScore | RewardModelUnavailable
"""A group's scores, or why it has none: refused (:class:`UntrustedScore`) or not answered in time."""


class GroupScorer(Protocol):
    stats: RewardModelStats
    max_batch_sequences: int  # the most completions an actor sends in one score_groups call

    def score_groups(self, items: Sequence[Group]) -> list[GroupResult]: ...

    def close(self) -> None: ...


def _one_group(scorer: GroupScorer, prompt_ids: Sequence[int], response_ids: Sequence[Sequence[int]]) -> list[float]:
    """One group through ``scorer.score_groups``: its scores, or its exception raised."""
    (result,) = scorer.score_groups([(prompt_ids, response_ids)])
    if isinstance(result, Exception):
        raise result
    return result


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
        max_batch_sequences: int,
        keys: CurveClientKeys | None = None,
    ) -> None:
        import zmq

        if timeout_s <= 0 or retries < 0 or max_batch_sequences < 1:
            raise ValueError(
                f"need timeout_s > 0, retries >= 0 and max_batch_sequences >= 1, got {timeout_s}, {retries} and"
                f" {max_batch_sequences}"
            )
        self.max_batch_sequences = max_batch_sequences
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

    def _attempt(
        self, requests: dict[str, ScoreRequest]
    ) -> tuple[dict[str, list[float] | UntrustedScore], UntrustedScore | None]:
        """Send ``requests`` (by request id) and collect replies until all are answered or the deadline passes: the
        answers by request id (an unanswered one is absent), and the protocol violation that ended the wait, if
        one did (the answers before it still count)."""
        import zmq

        sock = self._socket()
        deadline = time.monotonic() + self.timeout_s
        answers: dict[str, list[float] | UntrustedScore] = {}
        for outgoing in requests.values():
            try:
                sock.send(encode(outgoing), flags=zmq.NOBLOCK)
            except zmq.Again:
                break  # nothing to queue on: the rest wait out a dead server's deadline like any other
        while len(answers) < len(requests) and (left := deadline - time.monotonic()) > 0:
            if not sock.poll(max(1, int(left * 1000))):
                continue
            try:
                msg = decode(sock.recv(), self.transport.max_message_bytes)
            except ValueError as exc:
                return answers, UntrustedScore(f"reward server {self.address}: {exc}")
            if not isinstance(msg, ScoreReply):
                return answers, UntrustedScore(f"reward server {self.address} sent a request, not a reply")
            asked = requests.get(msg.request_id)
            if asked is None or msg.request_id in answers:
                return answers, UntrustedScore(
                    f"reward server {self.address} answered request {msg.request_id!r}, which is not in flight"
                )
            if msg.error is not None:
                answers[msg.request_id] = UntrustedScore(
                    f"reward server {self.address} could not score the group: {msg.error}"
                )
                continue
            try:
                answers[msg.request_id] = check_scores(msg.scores, len(asked.response_ids))
            except UntrustedScore as exc:
                answers[msg.request_id] = exc
        return answers, None

    def score_groups(self, items: Sequence[Group]) -> list[GroupResult]:
        """Each group's scores, or its :class:`UntrustedScore`, or :class:`RewardModelUnavailable` when no reply
        came within ``retries + 1`` deadlines (see the module doc)."""
        started = time.monotonic()
        results: list[GroupResult | None] = [None] * len(items)
        pending = list(range(len(items)))
        for attempt in range(self.retries + 1):
            # a fresh id per attempt: a late reply to an earlier attempt is never taken for this one
            requests = {uuid.uuid4().hex: i for i in pending}
            wire = {
                rid: ScoreRequest(
                    request_id=rid,
                    prompt_ids=[int(t) for t in items[i][0]],
                    response_ids=[[int(t) for t in r] for r in items[i][1]],
                )
                for rid, i in requests.items()
            }
            answers, violation = self._attempt(wire)
            for rid, answer in answers.items():
                results[requests[rid]] = answer
                if isinstance(answer, UntrustedScore):
                    self.stats.untrusted += 1
                else:
                    self.stats.requests += 1
                    self.stats.sequences += len(answer)
            pending = [i for rid, i in requests.items() if rid not in answers]
            if violation is not None:
                self._drop_socket()  # whatever else that peer queued for us goes too
                self.stats.untrusted += len(pending)
                for i in pending:
                    results[i] = violation
                pending = []
            if not pending:
                break
            self.stats.timeouts += 1
            self._drop_socket()
            logger.warning(
                "reward server %s: %d of %d requests not answered within %.1f s (attempt %d of %d)",
                self.address,
                len(pending),
                len(requests),
                self.timeout_s,
                attempt + 1,
                self.retries + 1,
            )
        if pending:
            self.stats.unavailable += 1
            gone = RewardModelUnavailable(
                f"reward server {self.address}: no reply in {self.retries + 1} attempts of {self.timeout_s:.1f} s"
            )
            for i in pending:
                results[i] = gone
        if self.stats.requests:
            self.stats.seconds += time.monotonic() - started
        return [r for r in results if r is not None]

    def score(self, prompt_ids: Sequence[int], response_ids: Sequence[Sequence[int]]) -> list[float]:
        """One group's scores; raises its :class:`UntrustedScore` or :class:`RewardModelUnavailable`."""
        return _one_group(self, prompt_ids, response_ids)

    def close(self) -> None:
        self._drop_socket()
        self._ctx.term()


class InlineRewardModel:
    """The reward model in this process: the same ``score`` call as :class:`RewardModelClient`."""

    def __init__(self, scorer: RewardModelScorer) -> None:
        self.scorer = scorer
        self.stats = RewardModelStats()
        self.max_batch_sequences = scorer.max_batch

    def score_groups(self, items: Sequence[Group]) -> list[GroupResult]:
        started = time.monotonic()
        results: list[GroupResult] = []
        for (_, response_ids), result in zip(items, self.scorer.score_groups(items), strict=True):
            if not isinstance(result, UntrustedScore):
                try:
                    result = check_scores(result, len(response_ids))
                except UntrustedScore as exc:
                    result = exc
            if isinstance(result, UntrustedScore):
                self.stats.untrusted += 1
            else:
                self.stats.requests += 1
                self.stats.sequences += len(result)
            results.append(result)
        self.stats.seconds += time.monotonic() - started
        return results

    def score(self, prompt_ids: Sequence[int], response_ids: Sequence[Sequence[int]]) -> list[float]:
        """One group's scores; raises its :class:`UntrustedScore`."""
        return _one_group(self, prompt_ids, response_ids)

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
    "Group",
    "GroupResult",
    "GroupScorer",
    "InlineRewardModel",
    "RewardModelClient",
    "RewardModelStats",
    "RewardModelUnavailable",
    "RewardWeights",
    "check_scores",
    "combine",
]
