"""The actor objective's spec from the config sections: the threshold strings are parsed here, once per run, so the
objective (:mod:`async_rl.algorithms.objective`) takes numbers."""

from __future__ import annotations

from async_rl.algorithms.distillation import DistillSpec
from async_rl.algorithms.objective import ObjectiveSpec
from async_rl.config.actor_rollout_ref import ActorConfig
from async_rl.config.algorithm import RolloutCorrectionConfig
from async_rl.config.correction import parse_is_threshold, parse_rs_spec
from async_rl.config.distillation import DistillationConfig

__all__ = ["distill_spec", "objective_spec"]


def distill_spec(distillation: DistillationConfig) -> DistillSpec | None:
    """``distillation`` (validated) as the objective's :class:`DistillSpec`; None when it is off."""
    if not distillation.enabled:
        return None
    d = distillation.distillation_loss
    return DistillSpec(
        loss_mode=d.loss_mode,
        use_policy_gradient=d.use_policy_gradient,
        policy_loss_mode=d.policy_loss_mode,
        use_task_rewards=d.use_task_rewards,
        distillation_loss_coef=d.distillation_loss_coef,
        task_loss_coef=d.task_loss_coef,
        loss_max_clamp=d.loss_max_clamp,
        log_prob_min_clamp=d.log_prob_min_clamp,
        clip_ratio=d.clip_ratio,
        clip_ratio_low=d.clip_ratio_low,
        clip_ratio_high=d.clip_ratio_high,
    )


def objective_spec(
    actor: ActorConfig, correction: RolloutCorrectionConfig, distillation: DistillationConfig
) -> ObjectiveSpec:
    """``actor_rollout_ref.actor``, ``algorithm.rollout_correction`` and ``distillation`` (validated) as an
    :class:`ObjectiveSpec`."""
    upper, lower = parse_is_threshold(correction.rollout_is_threshold)
    rs = correction.rollout_rs
    return ObjectiveSpec(
        loss_mode=actor.policy_loss.loss_mode,
        clip_ratio=actor.clip_ratio,
        clip_ratio_low=actor.clip_ratio_low,
        clip_ratio_high=actor.clip_ratio_high,
        clip_ratio_c=actor.clip_ratio_c,
        loss_agg_mode=actor.loss_agg_mode,
        loss_scale_factor=actor.loss_scale_factor,
        entropy_coeff=actor.entropy_coeff,
        kl_loss_coef=actor.kl_loss_coef if actor.use_kl_loss else None,
        kl_loss_type=actor.kl_loss_type,
        rollout_is=correction.rollout_is,
        is_upper=upper,
        is_lower=lower,
        is_batch_normalize=correction.rollout_is_batch_normalize,
        rs_bounds=None if rs is None else parse_rs_spec(rs, correction.rollout_rs_threshold),
        bypass_loss_type=correction.loss_type if correction.bypass_mode else None,
        distill=distill_spec(distillation),
    )
