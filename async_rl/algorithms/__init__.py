"""Pure algorithm core of async_rl: advantages, KL penalties/controllers, policy/value losses, rollout correction,
the reward model's pairwise loss.

Everything here is a pure function (or a tiny controller object) on ``[B, T]`` torch tensors -- no model, no
``torch.distributed``, no config -- so the learner, the tests and users porting a verl configuration all share one
numerically verl-compatible implementation. Per-token log-probs and entropy over large vocabularies are computed in
row chunks (``token_logprobs``). Import from this package rather than from its submodules.
"""

from async_rl.algorithms.advantages import (
    ADV_ESTIMATORS,
    CRITIC_ESTIMATORS,
    AdvantageEstimatorSpec,
    AdvantageInputs,
    compute_advantages,
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
    needs_critic,
)
from async_rl.algorithms.kl import (
    KL_KINDS,
    AdaptiveKLController,
    FixedKLController,
    KLController,
    apply_kl_in_reward,
    kl_penalty,
    policy_shift_sums,
)
from async_rl.algorithms.losses import (
    LOSS_AGG_MODES,
    agg_loss,
    entropy_from_logits,
    label_smoothed_nll,
    sft_loss,
    value_loss,
)
from async_rl.algorithms.masking import masked_mean, masked_sum, masked_var, masked_whiten
from async_rl.algorithms.pairwise import bradley_terry_loss, pair_stats
from async_rl.algorithms.policy_loss import POLICY_LOSSES, PolicyLossInputs, policy_loss, reinforce_loss
from async_rl.algorithms.rollout_correction import (
    ROLLOUT_IS_LEVELS,
    RSBounds,
    normalize_is_weights,
    rejection_mask,
    rollout_is_weights,
)
from async_rl.algorithms.token_logprobs import (
    ENTROPY_MODES,
    LOGPROB_CHUNK_BYTES,
    default_chunk_rows,
    linear_token_log_probs_and_entropy,
    masked_logit_mean,
    token_log_probs_and_entropy,
    token_log_probs_and_entropy_reference,
)

__all__ = [
    "ADV_ESTIMATORS",
    "CRITIC_ESTIMATORS",
    "ENTROPY_MODES",
    "KL_KINDS",
    "LOGPROB_CHUNK_BYTES",
    "LOSS_AGG_MODES",
    "POLICY_LOSSES",
    "ROLLOUT_IS_LEVELS",
    "RSBounds",
    "AdaptiveKLController",
    "AdvantageEstimatorSpec",
    "AdvantageInputs",
    "FixedKLController",
    "KLController",
    "PolicyLossInputs",
    "agg_loss",
    "apply_kl_in_reward",
    "bradley_terry_loss",
    "compute_advantages",
    "compute_gae_advantage_return",
    "default_chunk_rows",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_opo_outcome_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "entropy_from_logits",
    "kl_penalty",
    "policy_shift_sums",
    "linear_token_log_probs_and_entropy",
    "label_smoothed_nll",
    "masked_logit_mean",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "needs_critic",
    "normalize_is_weights",
    "pair_stats",
    "policy_loss",
    "reinforce_loss",
    "rejection_mask",
    "rollout_is_weights",
    "sft_loss",
    "token_log_probs_and_entropy",
    "token_log_probs_and_entropy_reference",
    "value_loss",
]
