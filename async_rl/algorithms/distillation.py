"""On-policy distillation's term of the actor's loss: pure tensor math on the sampled tokens' log-probs.

The student sampled ``y``; a frozen teacher scored the same tokens. Per token, a single-sample estimate of
KL(student || teacher) on ``y_t`` (:func:`~async_rl.algorithms.kl.kl_penalty`'s estimators; k1 is
``log pi_student(y_t) - log pi_teacher(y_t)``), with both log-probs floored at ``log_prob_min_clamp`` and the estimate
clamped to ``[-loss_max_clamp, loss_max_clamp]``. Then, as verl's ``distillation_loss`` does:

- ``use_policy_gradient``: the negated estimate, computed from the current log-probs and detached, is each token's
  advantage ``A_t = log pi_teacher(y_t) - log pi_student(y_t)`` (for k1) in a clipped PPO term (``policy_loss_mode``
  vanilla, against the same old log-probs and importance weights as the task's term): the reverse KL to the teacher
  is minimised by the policy gradient, as in Thinking Machines' on-policy distillation and prime-rl's ``opd``. Where
  the student already matches the teacher the advantage, and so the term and its gradient, is exactly 0.
- otherwise: the estimate itself, aggregated with ``loss_agg_mode``, is the loss (its gradient flows through the
  student's log-probs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from async_rl.algorithms._checks import check_same_shape
from async_rl.algorithms.kl import kl_penalty
from async_rl.algorithms.losses import agg_loss
from async_rl.algorithms.masking import masked_mean
from async_rl.algorithms.policy_loss import policy_loss

__all__ = ["DistillSpec", "distillation_estimate", "distillation_loss"]

_DUAL_CLIP = 3.0  # verl's vanilla policy loss reads its clip_ratio_c default; the distillation config has none


@dataclass(frozen=True)
class DistillSpec:
    """``distillation.distillation_loss`` as numbers (see :mod:`async_rl.config.distillation`)."""

    loss_mode: str
    use_policy_gradient: bool
    policy_loss_mode: str  # the PPO-family loss of the policy-gradient form (verl accepts vanilla only)
    use_task_rewards: bool
    distillation_loss_coef: float
    task_loss_coef: float
    loss_max_clamp: float | None
    log_prob_min_clamp: float | None
    clip_ratio: float
    clip_ratio_low: float | None
    clip_ratio_high: float | None


def distillation_estimate(log_prob: torch.Tensor, teacher_log_prob: torch.Tensor, spec: DistillSpec) -> torch.Tensor:
    """Per-token estimate ``[B, T]`` of KL(student || teacher) on the sampled tokens, floored and clamped as the spec
    says (differentiable through ``log_prob``)."""
    check_same_shape("teacher_log_prob", teacher_log_prob, "log_prob", log_prob)
    student, teacher = log_prob, teacher_log_prob.to(log_prob.dtype)
    if spec.log_prob_min_clamp is not None:
        student = student.clamp(min=spec.log_prob_min_clamp)
        teacher = teacher.clamp(min=spec.log_prob_min_clamp)
    estimate = kl_penalty(student, teacher, spec.loss_mode)
    if spec.loss_max_clamp is not None:
        estimate = estimate.clamp(min=-spec.loss_max_clamp, max=spec.loss_max_clamp)
    return estimate


def distillation_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    teacher_log_prob: torch.Tensor,
    mask: torch.Tensor,
    spec: DistillSpec,
    *,
    loss_agg_mode: str,
    loss_scale_factor: float | None,
    is_weights: torch.Tensor | None,
    global_num_tokens: float | torch.Tensor | None,
    global_num_seqs: float | torch.Tensor | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The distillation term (0-d, with its graph) and detached metrics (``loss``, ``abs_estimate``,
    ``estimate_min``/``_max`` over the mask; with the policy gradient also the PPO term's ``pg_clipfrac`` and
    ``ppo_kl``). Inputs ``[B, T]``; see the module docstring."""
    valid = mask.bool()
    metrics: dict[str, torch.Tensor] = {}
    if spec.use_policy_gradient:
        estimate = distillation_estimate(log_prob.detach(), teacher_log_prob, spec)
        loss, pg_metrics = policy_loss(
            old_log_prob,
            log_prob,
            -estimate,
            mask,
            clip_ratio=spec.clip_ratio,
            clip_ratio_low=spec.clip_ratio_low,
            clip_ratio_high=spec.clip_ratio_high,
            clip_ratio_c=_DUAL_CLIP,
            loss_agg_mode=loss_agg_mode,
            loss_mode=spec.policy_loss_mode,
            is_weights=is_weights,
            loss_scale_factor=loss_scale_factor,
            global_num_tokens=global_num_tokens,
            global_num_seqs=global_num_seqs,
        )
        metrics.update({k: v for k, v in pg_metrics.items() if k in ("pg_clipfrac", "ppo_kl")})
    else:
        estimate = distillation_estimate(log_prob, teacher_log_prob, spec)
        loss = agg_loss(
            estimate,
            mask,
            loss_agg_mode,
            loss_scale_factor=loss_scale_factor,
            global_num_tokens=global_num_tokens,
            global_num_seqs=global_num_seqs,
        )
    detached = estimate.detach()
    metrics["loss"] = loss.detach()
    metrics["abs_estimate"] = masked_mean(detached.abs(), valid.to(detached.dtype))
    if bool(valid.any()):
        metrics["estimate_max"] = detached[valid].max()
        metrics["estimate_min"] = detached[valid].min()
    return loss, metrics
