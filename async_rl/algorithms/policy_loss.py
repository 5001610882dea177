"""Clipped policy-gradient losses (PPO with dual clip, GMPO) with decoupled off-policy importance correction.

This is the objective the learner minimises. The PPO ratio is taken against ``old_log_prob``, the *proximal* policy the
learner recomputed under the weights version it trains from; when the actor's behaviour log-probs
(``rollout_log_prob``) are supplied with a ``tis_cap``, each token's clipped loss is additionally reweighted by the
detached importance weight ``pi_old / pi_rollout`` (see ``importance.py``), which corrects both weight staleness and
inference/training numeric mismatch. Loss modes live in the ``POLICY_LOSSES`` registry under verl's names.
Metrics are returned as detached 0-d tensors (no device synchronisation; call ``.item()`` when logging).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from async_rl.algorithms._checks import check_2d, check_choice, check_same_shape, float_mask
from async_rl.algorithms.importance import IS_LEVELS, IS_MODES, compute_is_weights
from async_rl.algorithms.losses import LOSS_AGG_MODES, Count, agg_loss
from async_rl.algorithms.masking import masked_mean, safe_count

__all__ = ["POLICY_LOSSES", "PolicyLossInputs", "policy_loss"]

_LOG_CLAMP = 20.0


@dataclass(frozen=True)
class PolicyLossInputs:
    """Validated inputs handed to a registered policy loss. Tensors are ``[B, T]``; ``is_weights`` is detached."""

    old_log_prob: torch.Tensor
    log_prob: torch.Tensor
    advantages: torch.Tensor
    response_mask: torch.Tensor
    is_weights: torch.Tensor | None
    clip_low: float
    clip_high: float
    clip_ratio_c: float
    loss_agg_mode: str
    global_num_tokens: Count | None
    global_num_seqs: Count | None


PolicyLossFn = Callable[[PolicyLossInputs], tuple[torch.Tensor, dict[str, torch.Tensor]]]


def _vanilla(p: PolicyLossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clip with dual clip (verl ``compute_policy_loss_vanilla``)."""
    adv, mask = p.advantages, p.response_mask
    log_ratio = torch.clamp(p.log_prob - p.old_log_prob, -_LOG_CLAMP, _LOG_CLAMP)
    ratio = torch.exp(log_ratio)
    ppo_kl = masked_mean(-log_ratio, mask)
    pg_losses1 = -adv * ratio
    pg_losses2 = -adv * torch.clamp(ratio, 1 - p.clip_low, 1 + p.clip_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses1).to(mask.dtype), mask)
    # Dual clip: for A < 0 the loss is also bounded above by -A * clip_ratio_c (= c * |A|).
    pg_losses3 = -adv * p.clip_ratio_c
    clip_pg_losses2 = torch.minimum(pg_losses3, clip_pg_losses1)
    negative = (adv < 0).to(mask.dtype)
    pg_clipfrac_lower = masked_mean(torch.gt(clip_pg_losses1, pg_losses3).to(mask.dtype) * negative, mask)
    pg_losses = torch.where(adv < 0, clip_pg_losses2, clip_pg_losses1)
    if p.is_weights is not None:
        pg_losses = pg_losses * p.is_weights
    loss = agg_loss(
        pg_losses,
        mask,
        p.loss_agg_mode,
        global_num_tokens=p.global_num_tokens,
        global_num_seqs=p.global_num_seqs,
    )
    metrics = {"pg_clipfrac": pg_clipfrac, "pg_clipfrac_lower": pg_clipfrac_lower, "ppo_kl": ppo_kl}
    return loss, {k: v.detach() for k, v in metrics.items()}


def _geo_mean(p: PolicyLossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GMPO: geometric mean of token ratios per sequence, token-level clipping in log space (verl ``geo_mean``)."""
    adv, mask = p.advantages, p.response_mask
    valid = mask != 0
    zero = torch.zeros((), dtype=p.log_prob.dtype, device=p.log_prob.device)
    log_ratio = torch.where(valid, p.log_prob - p.old_log_prob, zero)
    ppo_kl = masked_mean(-log_ratio, mask)
    sgn = torch.sign(adv)
    log_ratio_clamped = torch.clamp(log_ratio, -p.clip_low, p.clip_high)
    # Pessimistic choice per token: the smaller of sgn*lr and sgn*clamp(lr), mapped back by sgn.
    log_ratio_min = sgn * torch.minimum(sgn * log_ratio, sgn * log_ratio_clamped)
    lengths = safe_count(mask.sum(dim=-1))  # verl adds 1e-8 instead: identical in float32, 0 for empty rows either way
    seq_ratio = torch.exp((log_ratio_min * mask).sum(dim=-1) / lengths)
    seq_adv = (adv * mask).sum(dim=-1) / lengths
    pg_losses = -seq_adv * seq_ratio
    if p.is_weights is not None:
        # One weight per sequence: the mean of its valid tokens' weights (= the sequence weight at sequence levels).
        seq_w = (p.is_weights * mask).sum(dim=-1) / lengths
        pg_losses = pg_losses * seq_w
    loss = pg_losses.mean() if p.global_num_seqs is None else pg_losses.sum() / p.global_num_seqs
    clipped = torch.ne(log_ratio, log_ratio_clamped)
    metrics = {
        "pg_clipfrac": masked_mean((clipped & (adv > 0)).to(mask.dtype), mask),
        "pg_clipfrac_lower": masked_mean((clipped & (adv < 0)).to(mask.dtype), mask),
        "ppo_kl": ppo_kl,
    }
    return loss, {k: v.detach() for k, v in metrics.items()}


POLICY_LOSSES: dict[str, PolicyLossFn] = {"vanilla": _vanilla, "geo_mean": _geo_mean}
"""Policy losses by ``loss_mode`` name: ``vanilla`` (PPO, dual clip) and ``geo_mean`` (GMPO)."""


def _check_clip(name: str, value: float | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"{name} must be a number >= 0, got {value!r}")


def policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    rollout_log_prob: torch.Tensor | None = None,
    tis_cap: float | None = None,
    loss_mode: str = "vanilla",
    is_level: str = "token",
    is_mode: str = "truncate",
    is_threshold_lower: float | None = None,
    global_num_tokens: Count | None = None,
    global_num_seqs: Count | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Policy-gradient loss (0-d, differentiable w.r.t. ``log_prob``) and detached 0-d metrics; inputs ``[B, T]``.

    ``vanilla`` (PPO): ``lr = clamp(log_prob - old_log_prob, -20, 20)``, ``ratio = exp(lr)``;
    ``l = max(-A*ratio, -A*clamp(ratio, 1-low, 1+high))`` and, where ``A < 0``, ``l = min(l, -A*clip_ratio_c)``
    (dual clip); then ``agg_loss(l * w, ...)``. ``low``/``high`` default to ``clip_ratio``; ``clip_ratio_c > 1``.

    ``geo_mean`` (GMPO): token log-ratios clipped in *log space* to ``[-low, +high]`` (pessimistically per the sign of
    A), sequence ratio = ``exp(mean of clipped log-ratios)``, sequence advantage = mean of A over the row,
    loss = mean over rows of ``-adv * ratio * w_seq`` (``sum / global_num_seqs`` when given; ``loss_agg_mode`` and
    ``global_num_tokens`` are not used). ``w_seq`` is the mean of the row's token IS weights. Note GMPO's clip values
    are log-space bounds (verl's GMPO recipe uses 0.4).

    Off-policy correction: when both ``rollout_log_prob`` and ``tis_cap`` are given, ``w`` = detached IS weights
    ``pi_old / pi_rollout`` at ``is_level`` with ``is_mode`` (see ``compute_is_weights``); otherwise ``w = 1`` and no
    IS metrics are reported. With ``rollout_log_prob == old_log_prob`` every weight is exactly 1, so the loss is
    bitwise equal to plain PPO.

    Metrics: ``pg_clipfrac``, ``pg_clipfrac_lower``, ``ppo_kl`` and, with IS active, ``is_weight_mean/max/min``,
    ``is_frac_truncated`` or ``is_frac_masked``, ``is_ess``. Bad names, shapes or ranges raise ``ValueError``.
    """
    check_2d("old_log_prob", old_log_prob)
    check_same_shape("log_prob", log_prob, "old_log_prob", old_log_prob)
    check_same_shape("advantages", advantages, "old_log_prob", old_log_prob)
    check_same_shape("response_mask", response_mask, "old_log_prob", old_log_prob)
    if rollout_log_prob is not None:
        check_same_shape("rollout_log_prob", rollout_log_prob, "old_log_prob", old_log_prob)
    check_choice("loss_mode", loss_mode, POLICY_LOSSES)
    check_choice("loss_agg_mode", loss_agg_mode, LOSS_AGG_MODES)
    check_choice("is_level", is_level, IS_LEVELS)
    check_choice("is_mode", is_mode, IS_MODES)
    _check_clip("clip_ratio", clip_ratio)
    _check_clip("clip_ratio_low", clip_ratio_low)
    _check_clip("clip_ratio_high", clip_ratio_high)
    if isinstance(clip_ratio_c, bool) or not isinstance(clip_ratio_c, (int, float)) or not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c must be a number > 1 (dual-clip lower bound), got {clip_ratio_c!r}")

    mask = float_mask(response_mask, log_prob)
    is_weights: torch.Tensor | None = None
    is_metrics: dict[str, torch.Tensor] = {}
    if rollout_log_prob is not None and tis_cap is not None:
        is_weights, is_metrics = compute_is_weights(
            old_log_prob,
            rollout_log_prob,
            mask,
            tis_cap=tis_cap,
            is_level=is_level,
            is_mode=is_mode,
            is_threshold_lower=is_threshold_lower,
        )
    inputs = PolicyLossInputs(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=mask,
        is_weights=is_weights,
        clip_low=clip_ratio if clip_ratio_low is None else clip_ratio_low,
        clip_high=clip_ratio if clip_ratio_high is None else clip_ratio_high,
        clip_ratio_c=float(clip_ratio_c),
        loss_agg_mode=loss_agg_mode,
        global_num_tokens=global_num_tokens,
        global_num_seqs=global_num_seqs,
    )
    loss, metrics = POLICY_LOSSES[loss_mode](inputs)
    metrics.update(is_metrics)
    return loss, metrics
