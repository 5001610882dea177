"""Policy-gradient losses (PPO with dual clip, GMPO, GSPO, CISPO, REINFORCE) with off-policy importance correction.

This is the objective the learner minimises. The PPO ratio is taken against ``old_log_prob``, the *proximal* policy the
learner recomputed under the weights version it trains from. Each token's clipped loss is additionally reweighted by
precomputed, detached importance weights ``is_weights`` = ``pi_old / pi_rollout`` (the learner gets them from
``rollout_correction.rollout_is_weights``, the one IS implementation), which correct both weight staleness and
inference/training numeric mismatch. Loss modes live in the ``POLICY_LOSSES`` registry under verl's names;
``reinforce_loss`` (verl's bypass-mode REINFORCE) is a separate function.
Metrics are returned as detached 0-d tensors (no device synchronisation; call ``.item()`` when logging).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from async_rl.algorithms._checks import check_2d, check_choice, check_positive_count, check_same_shape, float_mask
from async_rl.algorithms.losses import LOSS_AGG_MODES, Count, agg_loss
from async_rl.algorithms.masking import masked_mean, masked_sum, safe_count

__all__ = ["POLICY_LOSSES", "PolicyLossInputs", "policy_loss", "reinforce_loss"]

_LOG_CLAMP = 20.0
_GSPO_LOG_MAX = 10.0  # verl clamps GSPO's combined log-ratio from above only
_GEO_W_EPS = 1e-10  # verl's epsilon inside log(w) when GMPO turns token IS weights into a sequence weight


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
    loss_scale_factor: float | None = None


PolicyLossFn = Callable[[PolicyLossInputs], tuple[torch.Tensor, dict[str, torch.Tensor]]]


def _agg(p: PolicyLossInputs, loss_mat: torch.Tensor) -> torch.Tensor:
    """``agg_loss`` of a per-token loss with the mode, global counts and scale factor of ``p``."""
    return agg_loss(
        loss_mat,
        p.response_mask,
        p.loss_agg_mode,
        global_num_tokens=p.global_num_tokens,
        global_num_seqs=p.global_num_seqs,
        loss_scale_factor=p.loss_scale_factor,
    )


def _detached(metrics: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in metrics.items()}


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
    loss = _agg(p, pg_losses)
    return loss, _detached({"pg_clipfrac": pg_clipfrac, "pg_clipfrac_lower": pg_clipfrac_lower, "ppo_kl": ppo_kl})


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
    seq_adv = masked_sum(adv, mask, dim=-1) / lengths
    pg_losses = -seq_adv * seq_ratio
    if p.is_weights is not None:
        # One weight per sequence: the geometric mean of its valid tokens' weights, exp(mean log(w + 1e-10)) as in
        # verl 0.9.1 (= the sequence weight itself at sequence levels, up to the 1e-10). A zero (masked) token weight
        # contributes log(1e-10) = -23 to the mean, so it nearly zeroes its whole sequence.
        log_w = masked_sum(torch.log(p.is_weights + _GEO_W_EPS), mask, dim=-1)
        pg_losses = pg_losses * torch.exp(log_w / lengths)
    loss = pg_losses.mean() if p.global_num_seqs is None else pg_losses.sum() / p.global_num_seqs
    clipped = torch.ne(log_ratio, log_ratio_clamped)
    metrics = {
        "pg_clipfrac": masked_mean((clipped & (adv > 0)).to(mask.dtype), mask),
        "pg_clipfrac_lower": masked_mean((clipped & (adv < 0)).to(mask.dtype), mask),
        "ppo_kl": ppo_kl,
    }
    return loss, _detached(metrics)


def _gspo(p: PolicyLossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO: one length-normalised ratio per sequence, PPO-clipped, with a per-token straight-through gradient."""
    adv, mask = p.advantages, p.response_mask
    zero = torch.zeros((), dtype=p.log_prob.dtype, device=p.log_prob.device)
    log_ratio = torch.where(mask != 0, p.log_prob - p.old_log_prob, zero)
    seq_log_ratio = masked_sum(log_ratio, mask, dim=-1) / mask.sum(dim=-1).clamp_min(1.0)
    # Value log s_i on every token; gradient d/d log_prob_t = 1 (so d ratio_t / d log_prob_t = s_i).
    token_log_ratio = p.log_prob - p.log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(torch.clamp(token_log_ratio, max=_GSPO_LOG_MAX))
    pg_losses1 = -adv * ratio
    pg_losses2 = -adv * torch.clamp(ratio, 1 - p.clip_low, 1 + p.clip_high)
    pg_losses = torch.maximum(pg_losses1, pg_losses2)
    if p.is_weights is not None:
        pg_losses = pg_losses * p.is_weights
    loss = _agg(p, pg_losses)
    metrics = {
        "pg_clipfrac": masked_mean(torch.gt(pg_losses2, pg_losses1).to(mask.dtype), mask),
        "pg_clipfrac_lower": torch.zeros((), dtype=mask.dtype, device=mask.device),
        "ppo_kl": masked_mean(-log_ratio, mask),
    }
    return loss, _detached(metrics)


def _cispo(p: PolicyLossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO: REINFORCE on log_prob weighted by the detached, clipped token ratio (verl ``cispo``)."""
    adv, mask = p.advantages, p.response_mask
    log_ratio = torch.clamp(p.log_prob - p.old_log_prob, -_LOG_CLAMP, _LOG_CLAMP)
    ratio = torch.exp(log_ratio)
    clipped_ratio = torch.clamp(ratio, 1 - p.clip_low, 1 + p.clip_high)
    pg_losses = -clipped_ratio.detach() * adv * p.log_prob
    if p.is_weights is not None:
        pg_losses = pg_losses * p.is_weights
    loss = _agg(p, pg_losses)
    metrics = {
        "pg_clipfrac": masked_mean(torch.ne(ratio, clipped_ratio).to(mask.dtype), mask),
        "pg_clipfrac_lower": torch.zeros((), dtype=mask.dtype, device=mask.device),
        "ppo_kl": masked_mean(-log_ratio, mask),
    }
    return loss, _detached(metrics)


POLICY_LOSSES: dict[str, PolicyLossFn] = {
    "vanilla": _vanilla,
    "geo_mean": _geo_mean,
    "gspo": _gspo,
    "cispo": _cispo,
}
"""Policy losses by ``loss_mode`` name: ``vanilla`` (PPO, dual clip), ``geo_mean`` (GMPO), ``gspo``, ``cispo``."""


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
    clip_ratio: float,
    clip_ratio_low: float | None,
    clip_ratio_high: float | None,
    clip_ratio_c: float,
    loss_agg_mode: str,
    loss_mode: str,
    loss_scale_factor: float | None,
    is_weights: torch.Tensor | None = None,
    global_num_tokens: Count | None = None,
    global_num_seqs: Count | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Policy-gradient loss (0-d, differentiable w.r.t. ``log_prob``) and detached 0-d metrics; inputs ``[B, T]``.

    ``low``/``high`` below default to ``clip_ratio``; ``w`` is the detached per-token IS weight (1 without
    correction); ``agg`` is ``agg_loss`` with ``loss_agg_mode``, the global counts and ``loss_scale_factor``.

    ``vanilla`` (PPO): ``lr = clamp(log_prob - old_log_prob, -20, 20)``, ``ratio = exp(lr)``;
    ``l = max(-A*ratio, -A*clamp(ratio, 1-low, 1+high))`` and, where ``A < 0``, ``l = min(l, -A*clip_ratio_c)``
    (dual clip, ``clip_ratio_c > 1``); loss ``agg(l * w)``.

    ``geo_mean`` (GMPO): token log-ratios clipped in *log space* to ``[-low, +high]`` (pessimistically per the sign of
    A), sequence ratio = ``exp(mean of clipped log-ratios)``, sequence advantage = mean of A over the row,
    loss = mean over all B rows of ``-adv * ratio * w_seq`` (``sum / global_num_seqs`` when given;
    ``loss_agg_mode``, ``global_num_tokens`` and ``loss_scale_factor`` are not used). ``w_seq`` is the geometric mean
    of the row's token weights, ``exp(mean_t log(w_t + 1e-10))``. GMPO's clip values are log-space bounds (verl's
    GMPO recipe uses 0.4).

    ``gspo`` (GSPO): ``s_i = exp(mean_t (log_prob - old_log_prob))`` over the row's valid tokens; per token the
    log-ratio ``log_prob - sg(log_prob) + sg(log s_i)``, clamped above at 10, is exponentiated to ``r`` (value
    ``s_i``, gradient ``d r / d log_prob_t = s_i``); ``l = max(-A*r, -A*clamp(r, 1-low, 1+high))``; loss
    ``agg(l * w)``. No dual clip; ``pg_clipfrac_lower`` is 0. verl recommends ``seq-mean-token-mean`` with it.

    ``cispo`` (CISPO): ``ratio = exp(clamp(log_prob - old_log_prob, -20, 20))``;
    ``l = -sg(clamp(ratio, 1-low, 1+high)) * A * log_prob``; loss ``agg(l * w)``. The gradient flows through
    ``log_prob`` on every token (the clipped ratio is only a weight); ``pg_clipfrac`` = fraction of valid tokens
    whose ratio was clipped, ``pg_clipfrac_lower`` is 0.

    Off-policy correction: ``w`` = ``is_weights`` (``[B, T]``, detached here), as computed by
    ``rollout_correction.rollout_is_weights`` (which also returns the IS metrics); ``w = 1`` when ``None``. The
    weights never change the mask, so zero-weight (e.g. IcePop-rejected) tokens still count in the denominators.
    When the behaviour and proximal log-probs are equal every valid token's weight is exactly 1, so the loss is
    bitwise equal to the uncorrected one.

    Metrics: ``pg_clipfrac``, ``pg_clipfrac_lower``, ``ppo_kl`` (masked mean of ``old_log_prob - log_prob``).
    Bad names, shapes or ranges raise ``ValueError``.
    """
    check_2d("old_log_prob", old_log_prob)
    check_same_shape("log_prob", log_prob, "old_log_prob", old_log_prob)
    check_same_shape("advantages", advantages, "old_log_prob", old_log_prob)
    check_same_shape("response_mask", response_mask, "old_log_prob", old_log_prob)
    if is_weights is not None:
        check_same_shape("is_weights", is_weights, "old_log_prob", old_log_prob)
    check_choice("loss_mode", loss_mode, POLICY_LOSSES)
    check_choice("loss_agg_mode", loss_agg_mode, LOSS_AGG_MODES)
    _check_clip("clip_ratio", clip_ratio)
    _check_clip("clip_ratio_low", clip_ratio_low)
    _check_clip("clip_ratio_high", clip_ratio_high)
    if isinstance(clip_ratio_c, bool) or not isinstance(clip_ratio_c, (int, float)) or not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c must be a number > 1 (dual-clip lower bound), got {clip_ratio_c!r}")
    check_positive_count("loss_scale_factor", loss_scale_factor)

    mask = float_mask(response_mask, log_prob)
    weights = None if is_weights is None else is_weights.detach().to(dtype=log_prob.dtype, device=log_prob.device)
    inputs = PolicyLossInputs(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=mask,
        is_weights=weights,
        clip_low=clip_ratio if clip_ratio_low is None else clip_ratio_low,
        clip_high=clip_ratio if clip_ratio_high is None else clip_ratio_high,
        clip_ratio_c=float(clip_ratio_c),
        loss_agg_mode=loss_agg_mode,
        global_num_tokens=global_num_tokens,
        global_num_seqs=global_num_seqs,
        loss_scale_factor=loss_scale_factor,
    )
    return POLICY_LOSSES[loss_mode](inputs)


def reinforce_loss(
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    loss_agg_mode: str,
    loss_scale_factor: float | None,
    is_weights: torch.Tensor | None = None,
    rollout_log_prob: torch.Tensor | None = None,
    global_num_tokens: Count | None = None,
    global_num_seqs: Count | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Plain (unclipped) REINFORCE loss ``agg_loss(-A * log_prob * w)`` and detached 0-d metrics; inputs ``[B, T]``.

    ``w`` is ``is_weights`` detached (1 when ``None``), typically ``pi_current / pi_rollout`` truncated or masked by
    ``rollout_correction.rollout_is_weights``; the gradient is ``-w * A * d log_prob``, aggregated like the loss.
    This is verl 0.9.1's ``compute_policy_loss_reinforce`` (used by ``loss_mode=bypass_mode`` with
    ``loss_type=reinforce``, where the rejection-sampled mask is passed as ``response_mask``). It is not a
    ``POLICY_LOSSES`` entry because it takes no proximal ``old_log_prob``. ``loss_agg_mode`` is the configured
    mode, as verl's actor passes it (verl's function default, ``seq-mean-token-sum``, is never used). Metrics:
    ``ppo_kl`` = masked mean of ``rollout_log_prob - log_prob``, only when ``rollout_log_prob`` is given.
    """
    check_2d("log_prob", log_prob)
    check_same_shape("advantages", advantages, "log_prob", log_prob)
    check_same_shape("response_mask", response_mask, "log_prob", log_prob)
    if is_weights is not None:
        check_same_shape("is_weights", is_weights, "log_prob", log_prob)
    if rollout_log_prob is not None:
        check_same_shape("rollout_log_prob", rollout_log_prob, "log_prob", log_prob)
    check_choice("loss_agg_mode", loss_agg_mode, LOSS_AGG_MODES)
    mask = float_mask(response_mask, log_prob)
    pg_losses = -advantages * log_prob
    if is_weights is not None:
        pg_losses = pg_losses * is_weights.detach().to(dtype=log_prob.dtype, device=log_prob.device)
    loss = agg_loss(
        pg_losses,
        mask,
        loss_agg_mode,
        global_num_tokens=global_num_tokens,
        global_num_seqs=global_num_seqs,
        loss_scale_factor=loss_scale_factor,
    )
    metrics: dict[str, torch.Tensor] = {}
    if rollout_log_prob is not None:
        metrics["ppo_kl"] = masked_mean(rollout_log_prob - log_prob, mask).detach()
    return loss, metrics
