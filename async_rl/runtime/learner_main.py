"""The learner process: every torchrun rank runs :func:`run_learner`; rank 0 also runs the coordinator.

Each rank builds a :class:`~async_rl.runtime.trainer.Trainer` and runs it. One training step, in order (rank 0
drives, the other ranks follow through collectives):

1. rank 0 takes ``data.train_batch_size`` prompt groups from the coordinator (blocking; only groups within the
   staleness bound are handed out), collates them into padded tensors and broadcasts those to every rank
   (:mod:`async_rl.runtime.rollout_source`);
2. every rank runs :meth:`Learner.train_batch` (proximal log-probs, advantages over the whole batch, the update);
3. rank 0 marks the groups trained in the ledger; the policy version is now ``step + 1``;
4. every ``sync_every_n_steps`` the :class:`WeightPublisher` announces the version and streams the new weights to the
   live actors (all ranks take part in the gather); otherwise the coordinator only learns the new version. A version
   due for validation is always published, then a validation round on it starts on the actors while training goes
   on, and the next publish of another version waits for that round (:mod:`async_rl.runtime.validation`);
5. every ``save_every_n_steps`` a checkpoint holds the model, optimizer, scheduler, RNG states and the coordinator's
   ledger, so a resumed run neither repeats nor skips prompt groups;
6. rank 0 logs the step's metrics (learner, transport, sync, rewards) to the configured sinks.

SIGTERM (from the launcher through torchrun, or on torchrun's death, see :mod:`async_rl.runtime.parent_watch`) is
checked before each step and while waiting for rollouts: every rank stops at the same step, writes a checkpoint if
checkpointing is configured, tells the actors to shut down and returns ``{"stopped": True}``; a rank that cannot get
there within ``async_training.timeouts.stop_s`` exits without one (:mod:`async_rl.runtime.graceful_stop`).
"""

from __future__ import annotations

from typing import Any

from async_rl.config import Config
from async_rl.runtime.rank_run import run_rank


def run_learner(cfg: Config) -> dict[str, Any]:
    """Train for the run length (``trainer.total_training_steps``, else derived from ``trainer.total_epochs``, see
    :mod:`async_rl.runtime.run_length`) or until the data runs out; returns a summary on rank 0 (empty dict elsewhere).
    """
    from async_rl.runtime.rejection_sampling import RejectionSampler
    from async_rl.runtime.trainer import Trainer

    timeouts = cfg.async_training.timeouts
    if cfg.rejection_sampling.enable:  # a generation job in the learner's place: nothing is trained
        _, result = run_rank(
            "rejection-sampling",
            stop_s=timeouts.stop_s,
            collective_s=timeouts.collective_s,
            body=lambda ctx, stop: RejectionSampler(cfg, ctx, stop).run(),
        )
        return result
    _, result = run_rank(
        "learner",
        stop_s=timeouts.stop_s,
        collective_s=timeouts.collective_s,
        body=lambda ctx, stop: Trainer(cfg, ctx, stop).train(),
    )
    return result
