"""Off-policy importance-sampling (IS) weights between the behaviour (actor) and proximal (learner) policies.

In the asynchronous design an actor may generate with weights several versions older than the learner's, and its
inference engine (vLLM) computes log-probs with different kernels than the training engine. The learner therefore
recomputes ``old_log_prob`` (proximal policy, the version it trains from) and keeps the actor's ``rollout_log_prob``
(behaviour policy). The PPO ratio is taken against the proximal policy (decoupled PPO) and each token's loss is
reweighted by ``w = pi_old / pi_rollout``, truncated (TIS) or masked to bound variance. This module computes those
weights and their diagnostics; it never takes gradients.
"""

from __future__ import annotations

import torch

from async_rl.algorithms._checks import check_choice, check_same_shape, float_mask
from async_rl.algorithms.masking import masked_extreme, safe_count

__all__ = ["IS_LEVELS", "IS_MODES", "compute_is_weights"]

IS_LEVELS: frozenset[str] = frozenset({"token", "sequence", "geometric"})
"""``token``: per-token ratio; ``sequence``: product over the sequence; ``geometric``: geometric mean per sequence."""
IS_MODES: frozenset[str] = frozenset({"truncate", "mask"})
"""``truncate``: ``min(w, cap)`` (TIS); ``mask``: keep ``w`` inside ``[lower, cap]`` and zero it outside (MIS)."""

_LOG_CLAMP = 20.0


@torch.no_grad()
def compute_is_weights(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    tis_cap: float,
    is_level: str = "token",
    is_mode: str = "truncate",
    is_threshold_lower: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Detached IS weights ``[B, T]`` for ``pi_old / pi_rollout`` plus 0-d tensor diagnostics.

    Log-ratio ``d = old_log_prob - rollout_log_prob`` on valid tokens (padding uses 0, so garbage there is harmless),
    aggregated by ``is_level``: ``token`` -> ``d``; ``sequence`` -> sum of ``d`` over the row's valid tokens;
    ``geometric`` -> mean of ``d`` over them (sequence levels broadcast one value over the row). The aggregate is
    clamped to ``[-20, 20]`` and exponentiated to ``w``. Then ``is_mode``:

    - ``truncate``: ``w = min(w, tis_cap)``.
    - ``mask``: positions (whole rows at sequence levels) with ``w > tis_cap`` or ``w < is_threshold_lower`` (default
      ``1 / tis_cap``) get weight 0; kept positions keep their weight ``w`` (not 1). Rejected tokens still count in the
      loss denominator (the aggregation mask is unchanged), so global token counts stay valid.

    ``tis_cap`` must be >= 1 and ``is_threshold_lower`` in ``(0, 1]`` (ignored in truncate mode); so identical
    log-probs give ``w == 1`` exactly. Padding positions get weight 1.
    Metrics over valid tokens: ``is_weight_mean/max/min`` (of the applied weights; 1 when no token is valid),
    ``is_frac_truncated`` or ``is_frac_masked``, and ``is_ess`` = ``(sum w)^2 / (N * sum w^2)`` in ``(0, 1]`` (1 with
    no valid token, 0 if every weight was masked to 0).
    """
    check_same_shape("rollout_log_prob", rollout_log_prob, "old_log_prob", old_log_prob)
    check_same_shape("response_mask", response_mask, "old_log_prob", old_log_prob)
    check_choice("is_level", is_level, IS_LEVELS)
    check_choice("is_mode", is_mode, IS_MODES)
    if isinstance(tis_cap, bool) or not isinstance(tis_cap, (int, float)) or not tis_cap >= 1.0:
        raise ValueError(f"tis_cap must be a number >= 1, got {tis_cap!r}")
    lower = 1.0 / tis_cap if is_threshold_lower is None else is_threshold_lower
    if is_mode == "mask" and not 0.0 < lower <= 1.0:
        raise ValueError(f"is_threshold_lower must be in (0, 1], got {is_threshold_lower!r}")

    mask = float_mask(response_mask, old_log_prob)
    valid = mask != 0
    zero = torch.zeros((), dtype=old_log_prob.dtype, device=old_log_prob.device)
    log_ratio = torch.where(valid, old_log_prob - rollout_log_prob, zero)
    if is_level == "token":
        level_log_ratio = log_ratio
    else:
        row_sum = (log_ratio * mask).sum(dim=-1, keepdim=True)
        if is_level == "geometric":
            row_sum = row_sum / mask.sum(dim=-1, keepdim=True).clamp_min(1.0)
        level_log_ratio = row_sum.expand_as(log_ratio)
    raw = torch.exp(torch.clamp(level_log_ratio, -_LOG_CLAMP, _LOG_CLAMP))
    # Padding positions get weight exactly 1 so they never influence anything.
    raw = torch.where(valid, raw, torch.ones_like(raw))

    count = mask.sum()
    denom = safe_count(count)
    metrics: dict[str, torch.Tensor] = {}
    if is_mode == "truncate":
        weights = torch.clamp(raw, max=tis_cap)
        metrics["is_frac_truncated"] = ((raw > tis_cap).to(mask.dtype) * mask).sum() / denom
    else:
        keep = (raw <= tis_cap) & (raw >= lower)
        weights = torch.where(keep, raw, torch.zeros_like(raw))
        metrics["is_frac_masked"] = ((~keep).to(mask.dtype) * mask).sum() / denom
    weights = torch.where(valid, weights, torch.ones_like(weights))

    sum_w = (weights * mask).sum()
    sum_w2 = (weights.square() * mask).sum()
    # Cauchy-Schwarz bounds the ratio by 1; the clamp only absorbs rounding.
    ess = torch.where(sum_w2 > 0, sum_w.square() / (count * sum_w2).clamp_min(1e-30), zero).clamp(max=1.0)
    metrics["is_ess"] = torch.where(count > 0, ess, torch.ones_like(ess))
    metrics["is_weight_mean"] = torch.where(count > 0, sum_w / denom, torch.ones_like(sum_w))
    metrics["is_weight_max"] = masked_extreme(weights, valid, largest=True)
    metrics["is_weight_min"] = masked_extreme(weights, valid, largest=False)
    return weights.detach(), {k: v.detach() for k, v in metrics.items()}
