"""The step's real size: how far a step's optimizer updates moved the policy on the batch it trained on.

With one optimizer step per batch, PPO's ratio is exactly 1 when the loss is computed, so the clip and ``ppo_kl``
never see the move; the learning rate alone bounds it. After the updates, one no-grad forward over the sequences
this rank's updates computed (the first epoch's micro-batches: each row once) compares the new log-probs with those
of the policy before the step (``actor.step_kl_freq``; metrics ``learner/actor/step_kl`` and
``learner/actor/step_abs_log_ratio``, token means over every rank).
"""

from __future__ import annotations

import torch
from torch import nn

from async_rl import metric_catalog as mc
from async_rl.algorithms import policy_shift_sums
from async_rl.learner.batching import RolloutBatch
from async_rl.learner.metrics import MetricAccumulator
from async_rl.learner.partition import Layout, UpdatePlan
from async_rl.learner.policy import build_micro_inputs, response_log_probs

__all__ = ["measure_step_size"]


def measure_step_size(
    model: nn.Module,
    batch: RolloutBatch,
    plan: UpdatePlan,
    before: torch.Tensor,
    acc: MetricAccumulator,
    *,
    layout: Layout,
    device: torch.device,
    temperature: float,
) -> None:
    """Add the step-size metrics of this rank's computed rows to ``acc``; ``before`` ``[B, T]`` holds the log-probs
    of the policy before the step on (at least) those rows. Every rank runs the same number of forwards (the plan's
    micro-steps), as FSDP2's gathers need."""
    was_training = model.training
    model.eval()  # no-grad pass: HF checkpointing stays off
    kl_sum = abs_sum = count = torch.zeros((), dtype=torch.float64, device=device)
    with torch.no_grad():
        for rows in (micro for mini in plan.epochs[0] for micro in mini):
            mi = build_micro_inputs(batch, rows, layout=layout, device=device)
            after, _ = response_log_probs(model, mi, temperature=temperature)
            idx = torch.as_tensor(rows, dtype=torch.long)
            mask = batch.loss_mask.index_select(0, idx).to(device)
            kl, moved, n = policy_shift_sums(before.index_select(0, idx.to(before.device)).to(device), after, mask)
            kl_sum, abs_sum, count = kl_sum + kl, abs_sum + moved, count + n
    model.train(was_training)
    acc.ratio(mc.LEARNER_ACTOR_STEP_KL, kl_sum, count)
    acc.ratio(mc.LEARNER_ACTOR_STEP_ABS_LOG_RATIO, abs_sum, count)
