"""Where each training step's batch comes from: one :class:`RolloutSource`, the same object on every learner rank.

Rank 0 owns the coordinator (its thread runs the rollout plane); the other ranks only follow. :meth:`RolloutSource.next`
is collective:

1. rank 0 waits for ``data.train_batch_size`` groups within the staleness bound (:func:`wait_for_groups`); every
   rank follows its decisions (wait, re-publish the weights to a new actor, give up, stop on a signal);
2. rank 0 collates the transport's groups straight from their wire arrays (numpy views of the received bytes, no
   Python lists) into the learner's padded tensors (:func:`async_rl.learner.batching.collate_groups`);
3. the tensors are broadcast to every rank (:func:`async_rl.learner.dist.share_batch`).

The result, :class:`StepRollouts`, holds the batch (every rank) and the transport groups (rank 0, for the ledger,
the rollout metrics and the audit log). ``None`` means the data ran out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from async_rl.learner.batching import RolloutBatch, collate_groups
from async_rl.learner.dist import share_batch
from async_rl.runtime.graceful_stop import GracefulStop, StopRequested
from async_rl.transport.protocol import RolloutGroup

__all__ = ["RolloutSource", "StepRollouts", "wait_for_groups"]

logger = logging.getLogger(__name__)

_WAIT, _GROUPS, _REPUBLISH, _GIVE_UP = b"W", b"G", b"R", b"X"


@dataclass
class StepRollouts:
    """One step's input: the batch and its group ids on every rank; the transport groups on rank 0 (else [])."""

    batch: RolloutBatch
    group_ids: list[int]
    groups: list[RolloutGroup]
    wait_s: float


def wait_for_groups(
    ctx: Any,
    coordinator: Any,
    publisher: Any,
    num_groups: int,
    timeout_s: float,
    *,
    republish: Callable[[], object],
    poll_s: float = 2.0,
    stop: GracefulStop | None = None,
) -> list[RolloutGroup]:
    """Rank 0 waits for ``num_groups`` groups; every rank follows its decisions, broadcast every ``poll_s``.

    While waiting, when ``publisher.needs_refresh()`` (an actor joined, or the last transfer broke) every rank calls
    ``republish()``: the trainer's one publish path (the same validation wait and, in a LoRA run, the same
    served-weights probe as a step's publish), so a new or restarted actor gets the current weights and can start the
    work the staleness bound allows. Returns the groups on rank 0 and ``[]`` elsewhere; raises TimeoutError on every
    rank. Every poll also checks ``stop`` (a collective): once any rank got SIGTERM, every rank raises StopRequested.

    When the data runs out the coordinator hands over what is left, fewer than ``num_groups``: like verl's
    ``drop_last=True`` that final incomplete batch is not trained (it would not split into the configured mini-batches)
    but dropped with a warning, and rank 0 returns ``[]``, which ends the run.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if stop is not None and stop.agreed(ctx):
            raise StopRequested("stop requested while waiting for rollouts")
        raw: list[RolloutGroup] = []
        decision = None
        if ctx.rank == 0:
            try:
                raw = coordinator.get_groups(num_groups, timeout_s=max(0.0, min(poll_s, deadline - time.monotonic())))
                decision = _GROUPS
                if 0 < len(raw) < num_groups:
                    logger.warning(
                        "data exhausted: dropping the final %d prompt groups, fewer than data.train_batch_size=%d",
                        len(raw),
                        num_groups,
                    )
                    raw = []
            except TimeoutError:
                if time.monotonic() >= deadline:
                    decision = _GIVE_UP
                elif publisher.needs_refresh():
                    decision = _REPUBLISH
                else:
                    decision = _WAIT
        decision = ctx.broadcast_bytes(decision)
        if decision == _GROUPS:
            return raw
        if decision == _GIVE_UP:
            raise TimeoutError(f"no {num_groups} rollout groups within {timeout_s:.0f} s: are the actors running?")
        if decision == _REPUBLISH:
            republish()


class RolloutSource:
    """Each step's batch, the same call on every rank (see the module docstring). ``coordinator`` is rank 0's."""

    def __init__(
        self,
        ctx: Any,
        coordinator: Any,
        publisher: Any,
        learner: Any,
        *,
        batch_size: int,
        republish: Callable[[], object],
        stop: GracefulStop | None = None,
        poll_s: float = 2.0,
    ) -> None:
        """``republish``: publish the learner's current version to the actors (see :func:`wait_for_groups`)."""
        self.ctx, self.coordinator, self.publisher, self.learner = ctx, coordinator, publisher, learner
        self.batch_size, self.republish, self.stop, self.poll_s = batch_size, republish, stop, poll_s

    def next(self, timeout_s: float) -> StepRollouts | None:
        """Wait (at most ``timeout_s``) for the next batch; ``None`` on every rank once the data ran out."""
        started = time.monotonic()
        groups = wait_for_groups(
            self.ctx,
            self.coordinator,
            self.publisher,
            self.batch_size,
            timeout_s,
            republish=self.republish,
            poll_s=self.poll_s,
            stop=self.stop,
        )
        wait_s = time.monotonic() - started
        status, batch = b"0", None  # b"0": the data ran out; b"1": a batch follows; b"E...": collation failed
        if self.ctx.rank == 0 and groups:
            data = self.learner.data_cfg
            try:
                source = self.coordinator.source
                batch = collate_groups(
                    groups,
                    {g.prompt_id: source.record(g.prompt_id).token_ids for g in groups},
                    pad_token_id=self.learner.start.pad_token_id,
                    max_prompt_length=data.max_prompt_length,
                    max_response_length=data.max_response_length,
                )
                status = b"1"
            except ValueError as exc:  # every rank raises it, instead of the others waiting for a batch
                status = b"E" + str(exc).encode()
        status = self.ctx.broadcast_bytes(status if self.ctx.rank == 0 else None)
        if status == b"0":
            return None
        if status.startswith(b"E"):
            raise ValueError(status[1:].decode())
        shared, ids = share_batch(self.ctx, batch, [g.prompt_id for g in groups] if self.ctx.rank == 0 else None)
        return StepRollouts(shared, ids, groups, wait_s)
