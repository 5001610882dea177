"""One torchrun rank's run, as the RL learner and the reward-model trainer both do it: install the SIGTERM stop, join
the process group, run, and tear the group down (as failed when the run raised, after logging it)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from async_rl.runtime.graceful_stop import GracefulStop

if TYPE_CHECKING:
    from async_rl.learner.dist import DistContext

logger = logging.getLogger(__name__)


def run_rank(
    role: str,
    *,
    stop_s: float,
    collective_s: float,
    body: Callable[[DistContext, GracefulStop], dict[str, Any]],
) -> tuple[DistContext, dict[str, Any]]:
    """Run ``body(ctx, stop)`` on this rank and return the context with its result. ``stop_s``: the SIGTERM-to-exit
    deadline (:class:`GracefulStop`); ``collective_s``: the process group's timeout; ``role`` names the rank in the
    log line of a failure."""
    from async_rl.learner.dist import init_distributed, teardown

    stop = GracefulStop(stop_s).install()  # SIGTERM: see runtime/graceful_stop.py
    try:
        ctx = init_distributed(backend="auto", timeout_s=collective_s)
        try:
            result = body(ctx, stop)
        except BaseException:
            logger.exception("%s rank %d failed", role, ctx.rank)
            teardown(ctx, failed=True)
            raise
        teardown(ctx)
        return ctx, result
    finally:
        stop.close()
