"""The reward server: one process beside the actors that scores every actor's groups with the reward model.

It binds a ZeroMQ ROUTER on ``async_training.transport.host`` at ``reward.reward_model.port`` with the rollout plane's
options and CURVE keys (loopback unless configured otherwise). Each turn it takes every request waiting, up to
``max_batch`` sequences, and scores them together: groups of one completion (a validation round's greedy samples)
in shared padded batches, larger groups each with its prompt computed once (the prompt's keys and values shared by
the group's completions), answering each request with its own scores. A request it cannot score (ids
outside the vocabulary, no completions, a non-finite score) gets an error answer naming why; the others waiting with
it are still answered. An undecodable frame is dropped and counted (there is no request id to answer).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from async_rl.rewards.model_score import UntrustedScore
from async_rl.rewards.model_wire import ScoreReply, ScoreRequest, decode, encode

if TYPE_CHECKING:
    import zmq

logger = logging.getLogger(__name__)


class GroupScorer(Protocol):
    def score_groups(
        self, items: Sequence[tuple[Sequence[int], Sequence[Sequence[int]]]]
    ) -> list[list[float] | UntrustedScore]: ...


@dataclass
class ServerStats:
    requests: int = 0
    sequences: int = 0
    turns: int = 0  # receive-and-score rounds (each scores every waiting request, one group at a time)
    refused: int = 0  # requests answered with an error
    malformed: int = 0  # frames dropped undecoded
    unreachable: int = 0  # answers whose requester had gone (its socket closed after a deadline)
    scoring_s: float = 0.0

    def line(self) -> str:
        per_turn = self.requests / self.turns if self.turns else 0.0
        return (
            f"{self.requests} requests, {self.sequences} sequences in {self.turns} turns ({per_turn:.1f} requests per"
            f" turn), {self.scoring_s:.1f} s scoring; {self.refused} refused, {self.malformed} malformed,"
            f" {self.unreachable} unreachable"
        )


class RewardServer:
    """Serves ``scorer`` on the bound ROUTER ``sock`` until ``serve``'s ``stop`` says so."""

    def __init__(self, scorer: GroupScorer, sock: zmq.Socket, *, max_batch: int, max_message_bytes: int) -> None:
        self.scorer = scorer
        self.sock = sock
        self.max_batch = max_batch
        self.max_message_bytes = max_message_bytes
        self.stats = ServerStats()

    def _receive(self) -> list[tuple[bytes, ScoreRequest]]:
        """Every request waiting now, up to ``max_batch`` sequences (at least one request)."""
        import zmq

        batch: list[tuple[bytes, ScoreRequest]] = []
        sequences = 0
        while sequences < self.max_batch:
            try:
                frames = self.sock.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                break
            if len(frames) != 2:
                self.stats.malformed += 1
                continue
            identity, payload = frames
            try:
                msg = decode(payload, self.max_message_bytes)
            except ValueError as exc:
                self.stats.malformed += 1
                logger.warning("reward server: dropped a frame from %r: %s", identity, exc)
                continue
            if not isinstance(msg, ScoreRequest):
                self.stats.malformed += 1
                continue
            batch.append((identity, msg))
            sequences += len(msg.response_ids)
        return batch

    def _reply(self, identity: bytes, reply: ScoreReply) -> None:
        import zmq

        try:
            self.sock.send_multipart([identity, encode(reply)], flags=zmq.NOBLOCK)
        except zmq.ZMQError:  # EHOSTUNREACH (ROUTER_MANDATORY): that requester gave up and closed its socket
            self.stats.unreachable += 1

    def _refuse(self, identity: bytes, request: ScoreRequest, why: str) -> None:
        self.stats.refused += 1
        logger.warning("reward server: refused request %s: %s", request.request_id, why)
        self._reply(identity, ScoreReply(request_id=request.request_id, error=why))

    def handle(self, batch: list[tuple[bytes, ScoreRequest]]) -> None:
        """Score every request of ``batch`` together (groups of one response in shared batches, larger groups each
        with its prompt computed once) and answer each; a request that cannot be scored is refused alone."""
        started = time.monotonic()
        valid = []
        for identity, request in batch:
            if request.response_ids:
                valid.append((identity, request))
            else:
                self._refuse(identity, request, "a request needs at least one completion")
        results = self.scorer.score_groups([(r.prompt_ids, r.response_ids) for _, r in valid]) if valid else []
        for (identity, request), result in zip(valid, results, strict=True):
            if isinstance(result, UntrustedScore):
                self._refuse(identity, request, str(result))
            else:
                self._answer(identity, request, result)
        self.stats.scoring_s += time.monotonic() - started
        self.stats.turns += 1

    def _answer(self, identity: bytes, request: ScoreRequest, scores: list[float]) -> None:
        self.stats.requests += 1
        self.stats.sequences += len(scores)
        self._reply(identity, ScoreReply(request_id=request.request_id, scores=scores))

    def serve(self, stop: Callable[[], bool], *, poll_ms: int = 50, log_every_s: float = 60.0) -> ServerStats:
        last_log = time.monotonic()
        while not stop():
            if self.sock.poll(poll_ms):
                batch = self._receive()
                if batch:
                    self.handle(batch)
            if time.monotonic() - last_log >= log_every_s:
                last_log = time.monotonic()
                logger.info("reward server: %s", self.stats.line())
        return self.stats


__all__ = ["GroupScorer", "RewardServer", "ServerStats"]
