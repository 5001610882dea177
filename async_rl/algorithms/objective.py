"""The actor's objective on one micro-batch: a pure function from tensors and a spec to the loss and its metrics.

``actor_objective(batch, spec)`` is every term the actor's loss has, in the order verl composes them:

* the policy-gradient term. Decoupled (the default): the PPO-family loss (``spec.loss_mode``) of ``log_prob``
  against the proximal ``old_log_prob``, weighted by the importance weights pi_old / pi_rollout when
  ``spec.rollout_is`` is set (the batch's precomputed ``is_weights``, or computed here from this micro-batch when the
  caller has none, as when the proximal pass was skipped). verl 0.9.1's bypass mode (``spec.bypass_loss_type`` set):
  the rollout's log-probs are the old policy; rejection sampling (``spec.rs_bounds``) runs here against the current
  log-probs, and ``ppo_clip`` (PPO clip against the rollout, no weight) or ``reinforce`` (``-w * A * log pi``, the
  weights from the current log-probs) picks the loss;
* minus ``entropy_coeff`` x the aggregated entropy (when non-zero);
* plus ``kl_loss_coef`` x the aggregated KL penalty to the reference (``spec.kl_loss_coef`` set);
* with on-policy distillation (``spec.distill`` set), the distillation term
  (:func:`~async_rl.algorithms.distillation.distillation_loss`, against the same old log-probs, importance weights and
  mask as the policy-gradient term): ``task_loss_coef`` x policy-gradient term + ``distillation_loss_coef`` x
  distillation term with ``use_task_rewards``, the distillation term alone without (it replaces the policy-gradient
  term; the entropy and KL terms stay).

Every aggregation uses ``spec.loss_agg_mode`` with the step's global token and sequence counts, so micro-batches
sum to the mini-batch's loss. No module, no process group, no config: the learner builds the spec once from its
settings and calls this per micro-batch (``learner/step.py``); the tests build tensors by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from async_rl.algorithms.distillation import DistillSpec, distillation_loss
from async_rl.algorithms.kl import kl_penalty
from async_rl.algorithms.losses import agg_loss
from async_rl.algorithms.policy_loss import policy_loss, reinforce_loss
from async_rl.algorithms.rollout_correction import RSBounds, rejection_mask, rollout_is_weights

__all__ = ["ActorMicroBatch", "ObjectiveOutput", "ObjectiveSpec", "actor_objective", "correction_weights"]


@dataclass(frozen=True)
class ObjectiveSpec:
    """The actor's loss as configured (verl's names): the policy loss, its aggregation, the entropy and KL terms,
    and the rollout correction. ``kl_loss_coef`` None: no KL loss. ``rollout_is`` None: no importance weights.
    ``bypass_loss_type`` None: decoupled (a proximal policy); ``"ppo_clip"`` or ``"reinforce"``: bypass mode."""

    loss_mode: str
    clip_ratio: float
    clip_ratio_low: float | None
    clip_ratio_high: float | None
    clip_ratio_c: float
    loss_agg_mode: str
    loss_scale_factor: float | None
    entropy_coeff: float
    kl_loss_coef: float | None
    kl_loss_type: str
    rollout_is: str | None
    is_upper: float
    is_lower: float | None
    is_batch_normalize: bool
    rs_bounds: RSBounds | None
    bypass_loss_type: str | None
    distill: DistillSpec | None = None


@dataclass(frozen=True)
class ActorMicroBatch:
    """One micro-batch's tensors, ``[B, T]`` over response positions. ``log_prob`` and ``entropy`` carry the graph;
    the rest are constants. ``is_weights``: the step's precomputed weights for these rows (None: computed here when
    the spec asks for them). ``ref_log_prob``: needed with a KL loss. The global counts are the mini-batch's."""

    log_prob: torch.Tensor
    entropy: torch.Tensor
    old_log_prob: torch.Tensor
    rollout_log_prob: torch.Tensor
    advantages: torch.Tensor
    loss_mask: torch.Tensor
    is_weights: torch.Tensor | None
    ref_log_prob: torch.Tensor | None
    global_num_tokens: float
    global_num_seqs: float
    teacher_log_prob: torch.Tensor | None = None  # on-policy distillation: the teacher's log-prob of each token


@dataclass(frozen=True)
class ObjectiveOutput:
    """``loss`` (with its graph); the detached ``pg_loss`` and ``kl_loss`` (None without a KL loss) terms; the
    ``mask`` the loss used (the loss mask after bypass-mode rejection sampling); the policy loss's metrics and the
    rollout correction's and the distillation term's (0-d tensors, verl's names without a prefix)."""

    loss: torch.Tensor
    pg_loss: torch.Tensor
    kl_loss: torch.Tensor | None
    mask: torch.Tensor
    policy_metrics: dict[str, torch.Tensor]
    correction_metrics: dict[str, torch.Tensor]
    distill_metrics: dict[str, torch.Tensor]


def correction_weights(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, mask: torch.Tensor, spec: ObjectiveSpec
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Importance weights pi_old / pi_rollout under the spec's ``rollout_is`` level and bounds (batch-normalised with
    ``is_batch_normalize`` over these rows), and their metrics."""
    assert spec.rollout_is is not None, "the spec has no importance weights"
    return rollout_is_weights(
        old_log_prob,
        rollout_log_prob,
        mask,
        level=spec.rollout_is,
        upper=spec.is_upper,
        lower=spec.is_lower,
        batch_normalize=spec.is_batch_normalize,
    )


def actor_objective(batch: ActorMicroBatch, spec: ObjectiveSpec) -> ObjectiveOutput:
    """The actor's loss on one micro-batch and its metrics (see the module docstring)."""
    b, s = batch, spec
    counts = {
        "global_num_tokens": b.global_num_tokens,
        "global_num_seqs": b.global_num_seqs,
        "loss_scale_factor": s.loss_scale_factor,
    }

    def ppo(old: torch.Tensor, loss_mode: str, weights: torch.Tensor | None, keep: torch.Tensor) -> tuple:
        return policy_loss(
            old,
            b.log_prob,
            b.advantages,
            keep,
            clip_ratio=s.clip_ratio,
            clip_ratio_low=s.clip_ratio_low,
            clip_ratio_high=s.clip_ratio_high,
            clip_ratio_c=s.clip_ratio_c,
            loss_agg_mode=s.loss_agg_mode,
            loss_mode=loss_mode,
            is_weights=weights,
            **counts,
        )

    mask = b.loss_mask
    corr: dict[str, torch.Tensor] = {}
    weights: torch.Tensor | None = None
    old = b.old_log_prob  # what the policy-gradient term (and the distillation term) measures the ratio against
    if s.bypass_loss_type is None:
        if s.rollout_is is not None:
            weights = b.is_weights
            if weights is None:
                weights, corr = correction_weights(b.old_log_prob, b.rollout_log_prob, mask, s)
        pg_loss, metrics = ppo(b.old_log_prob, s.loss_mode, weights, mask)
    else:
        old = b.rollout_log_prob
        current = b.log_prob.detach()
        if s.rs_bounds is not None:
            mask, corr = rejection_mask(current, b.rollout_log_prob, mask, bounds=s.rs_bounds)
            mask = mask.bool()
        if s.bypass_loss_type == "ppo_clip":
            pg_loss, metrics = ppo(b.rollout_log_prob, "vanilla", None, mask)
        else:
            if s.rollout_is is not None:
                weights, is_metrics = correction_weights(current, b.rollout_log_prob, mask, s)
                corr.update(is_metrics)
            pg_loss, metrics = reinforce_loss(
                b.log_prob,
                b.advantages,
                mask,
                is_weights=weights,
                loss_agg_mode=s.loss_agg_mode,
                rollout_log_prob=b.rollout_log_prob,
                **counts,
            )
    loss = pg_loss
    distill_metrics: dict[str, torch.Tensor] = {}
    if s.distill is not None:
        if b.teacher_log_prob is None:
            raise ValueError("on-policy distillation needs the teacher's log-probs (teacher_log_prob)")
        d = s.distill
        distill, distill_metrics = distillation_loss(
            b.log_prob,
            old,
            b.teacher_log_prob,
            mask,
            d,
            loss_agg_mode=s.loss_agg_mode,
            loss_scale_factor=s.loss_scale_factor,
            is_weights=weights,
            global_num_tokens=b.global_num_tokens,
            global_num_seqs=b.global_num_seqs,
        )
        if d.use_task_rewards:
            loss = d.task_loss_coef * pg_loss + d.distillation_loss_coef * distill
        else:
            loss = distill
    if s.entropy_coeff != 0:
        loss = loss - s.entropy_coeff * agg_loss(b.entropy, mask, s.loss_agg_mode, **counts)
    kl_loss = None
    if s.kl_loss_coef is not None:
        if b.ref_log_prob is None:
            raise ValueError("a KL loss needs the reference log-probs (ref_log_prob)")
        kl_loss = agg_loss(kl_penalty(b.log_prob, b.ref_log_prob, s.kl_loss_type), mask, s.loss_agg_mode, **counts)
        loss = loss + s.kl_loss_coef * kl_loss
        kl_loss = kl_loss.detach()
    return ObjectiveOutput(loss, pg_loss.detach(), kl_loss, mask, metrics, corr, distill_metrics)
