"""The ``algorithm`` section: advantage estimator, discounting, KL-in-reward control, rollout correction and group
filtering.

``rollout_correction`` is the off-policy correction needed by asynchronous training: completions were sampled by an
actor holding an older policy (behaviour log-probs travel with them), so the learner reweights the policy-gradient
term by a capped importance ratio pi_old / pi_behaviour. ``filter_groups`` is DAPO's dynamic sampling with verl's
keys, done on the rollout plane (async_rl.transport.filtering). The other keys are verl's.
"""

from typing import Annotated, Any

import msgspec

from async_rl.config.fields import NonNegFloat, PosFloat, PosInt, Prob, doc, noop
from async_rl.config.names import AdvEstimator, BypassLossType, ISLevel, ISMode, KLControlType, KLKind


class KLControlConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Coefficient controller for the KL penalty in the reward (used when use_kl_in_reward)."""

    type: Annotated[KLControlType, doc("'fixed' coefficient or 'adaptive' (proportional controller to target_kl).")] = (
        "fixed"
    )
    kl_coef: Annotated[NonNegFloat, doc("(Initial) KL coefficient beta.")] = 0.001
    horizon: Annotated[PosInt, doc("Adaptive controller horizon in samples.")] = 10000
    target_kl: Annotated[PosFloat, doc("Adaptive controller target KL.")] = 0.1


class RolloutCorrectionConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Off-policy correction between the behaviour policy (the actor's) and the learner's; verl 0.9.1's keys.

    The aliases at the end are this project's earlier names; they are folded into verl's keys at start-up
    (see async_rl.config.correction) and an alias that contradicts a verl key is an error.
    """

    rollout_is: Annotated[
        ISLevel | None,
        doc(
            "Importance weight pi_old / pi_rollout per 'token', per 'sequence' (product over the response) or"
            " 'geometric' (per-sequence geometric mean, not in verl); null = no weights. Default 'token' (verl: null)."
        ),
    ] = "token"
    rollout_is_threshold: Annotated[
        float | str,
        doc("A number = truncate the weights at it (TIS); 'lower_upper' (e.g. '0.5_2.0') = zero weights outside."),
    ] = 2.0
    rollout_is_batch_normalize: Annotated[
        bool, doc("Divide the weights by their mean over the step's batch (token or sequence level).")
    ] = False
    rollout_rs: Annotated[
        str | None,
        doc(
            "Rejection sampling: comma list of token_k1|k2|k3, seq_sum_k1|k2|k3, seq_mean_k1|k2|k3, seq_max_k2|k3;"
            " rejected tokens (or sequences) leave the loss. null = off."
        ),
    ] = None
    rollout_rs_threshold: Annotated[
        float | str | None,
        doc("Bounds for rollout_rs, one for all or comma-separated per option; k1: 'lower_upper', k2/k3: upper."),
    ] = None
    bypass_mode: Annotated[
        bool,
        doc("Skip the proximal pass: the actor's log-probs are the old policy (two policies instead of three)."),
    ] = False
    loss_type: Annotated[
        BypassLossType,
        doc("With bypass_mode: 'ppo_clip' (clip pi/pi_rollout, no extra weight) or 'reinforce' (-w * A * log pi)."),
    ] = "ppo_clip"
    enable: Annotated[
        bool | None, doc("Alias: false = rollout_is null; true = rollout_is (token if null). null = not set.")
    ] = None
    is_level: Annotated[ISLevel | None, doc("Alias of rollout_is.")] = None
    is_mode: Annotated[
        ISMode | None,
        doc("Alias: 'truncate' (TIS) or 'mask' (is_threshold_lower_is_threshold as rollout_is_threshold)."),
    ] = None
    is_threshold: Annotated[PosFloat | None, doc("Alias: upper bound of rollout_is_threshold (>= 1).")] = None
    is_threshold_lower: Annotated[
        PosFloat | None, doc("Alias: lower bound used by is_mode='mask'; null = 1 / is_threshold.")
    ] = None


class FilterGroupsConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """DAPO dynamic sampling: training groups whose metric is equal across all rollout.n completions are dropped at
    the rollout plane and other prompts granted in their place (async_rl.transport.filtering)."""

    enable: Annotated[
        bool,
        doc(
            "Drop training groups with a constant metric (no GRPO signal) and fill each step with informative ones;"
            " eval groups are never filtered. Needs rollout.n >= 2."
        ),
    ] = False
    metric: Annotated[
        str | None,
        doc(
            "'reward' (each completion's scalar reward) or the name of a reward component the reward function returns"
            " (e.g. 'acc'); a group lacking that component is refused as invalid. Required when enable."
        ),
    ] = None
    max_num_gen_batches: Annotated[
        int,
        doc(
            "Stop with an error when one step has used this many x data.train_batch_size prompts without filling;"
            " <= 0 = no limit."
        ),
    ] = 0
    max_inflight_gen_batches: Annotated[
        int,
        noop("verl's cap on generation batches in flight; the rollout plane's admission control bounds this here."),
    ] = 1


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
    filter_groups: Annotated[FilterGroupsConfig, doc("DAPO dynamic sampling (filter groups) on the rollout plane.")] = (
        msgspec.field(default_factory=FilterGroupsConfig)
    )
    use_pf_ppo: Annotated[bool, noop("Preference-feedback PPO reweighting.")] = False
    pf_ppo: Annotated[dict[str, Any], noop("PF-PPO options.")] = msgspec.field(default_factory=dict)


__all__ = ["AlgorithmConfig", "FilterGroupsConfig", "KLControlConfig", "RolloutCorrectionConfig"]
