"""The mini-batch / micro-batch gradient-accumulation loop shared by the actor and the critic.

Gradient scaling, the part that is easy to get wrong: for each mini-batch the valid-token count and the non-empty
sequence count are all-reduced first, and every micro-batch loss is normalised by those *global* counts
(``agg_loss(global_num_tokens=..., global_num_seqs=...)``), so summing micro-batch losses over micro-steps and ranks
gives exactly the loss of the whole mini-batch taken as one batch. FSDP2 *averages* gradients over ranks, so each
micro-batch loss is multiplied by ``world_size`` before ``backward``; the reduced gradient is then the gradient of
the whole mini-batch loss, whatever the micro-batch size and the world size (tests check both).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from async_rl import metric_catalog as mc
from async_rl.learner.batching import RolloutBatch
from async_rl.learner.dist import DistContext
from async_rl.learner.metrics import MetricAccumulator
from async_rl.learner.optim import NonFiniteGuard, guarded_step
from async_rl.learner.partition import UpdatePlan

__all__ = ["MicroLossFn", "TrainedModel", "run_updates"]

MicroLossFn = Callable[[list[int], float, float], torch.Tensor]
"""``(rows, global_num_tokens, global_num_seqs) -> loss``: a micro-batch's share of the mini-batch loss."""

# The metrics run_updates records for a trained model, by its name: (loss, grad_norm, lr).
UPDATE_KEYS = {
    "actor": (mc.LEARNER_ACTOR_LOSS, mc.LEARNER_ACTOR_GRAD_NORM, mc.LEARNER_ACTOR_LR),
    "critic": (mc.LEARNER_CRITIC_LOSS, mc.LEARNER_CRITIC_GRAD_NORM, mc.LEARNER_CRITIC_LR),
}


@dataclass
class TrainedModel:
    """A model with its optimizer, schedule and non-finite guard (the actor or the critic)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: LambdaLR
    guard: NonFiniteGuard
    max_norm: float
    name: str
    # Called with the model after a mini-batch's gradients are accumulated, before clipping (tests, monitoring).
    # Under FSDP2 the gradients are DTensor shards; calling ``full_tensor()`` in the hook is a collective.
    grad_hook: Callable[[nn.Module], None] | None = None

    @property
    def lr(self) -> float:
        return float(self.scheduler.get_last_lr()[0])


def mini_batch_counts(ctx: DistContext, batch: RolloutBatch, rows: list[int]) -> tuple[float, float]:
    """``(loss tokens, sequences with >= 1 loss token)`` of a mini-batch (from ``loss_mask``), summed over ranks."""
    mask = batch.loss_mask.index_select(0, torch.as_tensor(rows, dtype=torch.long))
    per_row = mask.sum(dim=-1)
    local = torch.tensor([float(per_row.sum()), float((per_row > 0).sum())], dtype=torch.float64)
    tokens, seqs = ctx.all_reduce(local, "sum").tolist()
    return tokens, seqs


def run_updates(
    ctx: DistContext,
    trained: TrainedModel,
    plan: UpdatePlan,
    batch: RolloutBatch,
    micro_loss: MicroLossFn,
    acc: MetricAccumulator,
) -> int:
    """Run every optimizer step of ``plan``; returns the number of skipped (non-finite) steps.

    Records ``learner/<name>/loss`` (the whole mini-batch loss) and ``learner/<name>/grad_norm``, both averaged over
    the steps taken, and ``learner/<name>/lr`` (`UPDATE_KEYS`).
    """
    loss_key, grad_norm_key, lr_key = UPDATE_KEYS[trained.name]
    skipped = 0
    for epoch, shares in zip(plan.epochs, plan.counted, strict=True):
        for mini, share in zip(epoch, shares, strict=True):
            tokens, seqs = mini_batch_counts(ctx, batch, share)  # rows left out of the computation count too
            loss_sum = torch.zeros((), dtype=torch.float64, device=ctx.device)  # stays on the device: no host sync
            for micro in mini:
                loss = micro_loss(micro, max(tokens, 1.0), max(seqs, 1.0))
                (loss * ctx.world_size).backward()
                loss_sum += loss.detach().double()
            total = ctx.all_reduce(loss_sum, "sum")
            if trained.grad_hook is not None:
                trained.grad_hook(trained.model)
            stepped, norm = guarded_step(
                trained.model,
                trained.optimizer,
                trained.scheduler,
                max_norm=trained.max_norm,
                loss=total,
                guard=trained.guard,
                what=trained.name,
            )
            if stepped:
                # identical on every rank (the total is all-reduced), so the mean over ranks is the value itself
                acc.mean(grad_norm_key, norm)
                acc.mean(loss_key, total)
            else:
                skipped += 1
    acc.mean(lr_key, trained.lr)
    return skipped
