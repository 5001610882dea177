"""The ``algorithm`` section: advantage estimator, discounting, KL-in-reward control and rollout correction.

``rollout_correction`` is the off-policy correction needed by asynchronous training: completions were sampled by an
actor holding an older policy (behaviour log-probs travel with them), so the learner reweights the policy-gradient
term by a capped importance ratio pi_old / pi_behaviour. The other keys are verl's.
"""

from typing import Annotated, Any

import msgspec

from async_rl.config.fields import NonNegFloat, PosFloat, PosInt, Prob, doc, noop
from async_rl.config.names import AdvEstimator, ISLevel, ISMode, KLControlType, KLKind


class KLControlConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Coefficient controller for the KL penalty in the reward (used when use_kl_in_reward)."""

    type: Annotated[KLControlType, doc("'fixed' coefficient or 'adaptive' (proportional controller to target_kl).")] = (
        "fixed"
    )
    kl_coef: Annotated[NonNegFloat, doc("(Initial) KL coefficient beta.")] = 0.001
    horizon: Annotated[PosInt, doc("Adaptive controller horizon in samples.")] = 10000
    target_kl: Annotated[PosFloat, doc("Adaptive controller target KL.")] = 0.1


class RolloutCorrectionConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Importance weighting of the policy loss by pi_old / pi_behaviour (behaviour = the actor's sampling policy)."""

    enable: Annotated[
        bool, doc("Apply the behaviour-policy importance weight (needed for correct off-policy updates).")
    ] = True
    is_level: Annotated[
        ISLevel,
        doc("Ratio granularity: per 'token', per 'sequence' (product), or 'geometric' (per-sequence geometric mean)."),
    ] = "token"
    is_mode: Annotated[
        ISMode, doc("'truncate' = clamp weights to is_threshold (TIS); 'mask' = drop tokens/sequences outside bounds.")
    ] = "truncate"
    is_threshold: Annotated[float, doc("Upper bound (TIS cap) of the importance weight; must be >= 1.", ge=1.0)] = 2.0
    is_threshold_lower: Annotated[PosFloat | None, doc("Lower bound used by 'mask' mode; null = 1 / is_threshold.")] = (
        None
    )


class AlgorithmConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Advantage estimation and reward shaping."""

    adv_estimator: Annotated[
        AdvEstimator, doc("Advantage estimator; 'gae' needs the critic, the others are critic-free.")
    ] = "gae"
    gamma: Annotated[Prob, doc("Discount factor.")] = 1.0
    lam: Annotated[Prob, doc("GAE lambda.")] = 1.0
    norm_adv_by_std_in_grpo: Annotated[
        bool, doc("GRPO: divide by the group std (false = Dr. GRPO, mean-centred only).")
    ] = True
    use_kl_in_reward: Annotated[bool, doc("Subtract beta * KL(policy || reference) from the token rewards.")] = False
    kl_penalty: Annotated[KLKind, doc("KL estimator used in the reward penalty.")] = "kl"
    kl_ctrl: Annotated[KLControlConfig, doc("KL coefficient controller.")] = msgspec.field(
        default_factory=KLControlConfig
    )
    rollout_correction: Annotated[RolloutCorrectionConfig, doc("Off-policy correction for asynchronous rollouts.")] = (
        msgspec.field(default_factory=RolloutCorrectionConfig)
    )
    use_pf_ppo: Annotated[bool, noop("Preference-feedback PPO reweighting.")] = False
    pf_ppo: Annotated[dict[str, Any], noop("PF-PPO options.")] = msgspec.field(default_factory=dict)


__all__ = ["AlgorithmConfig", "KLControlConfig", "RolloutCorrectionConfig"]
