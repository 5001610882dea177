"""Rollout correction with verl 0.9.1 semantics: IS weights (TIS / IcePop) and divergence-based rejection masks.

The actor samples with its inference engine (vLLM) and possibly stale weights; the learner recomputes log-probs of the
same tokens. ``d = old_log_prob - rollout_log_prob`` is the per-token log importance ratio ``log r``,
``r = pi_train / pi_rollout``. Two corrections are built from it, once per step, before the loss:

- ``rollout_is_weights``: multiplicative weights for the policy loss, per token or per sequence, truncated (TIS, a
  single upper bound) or zeroed outside ``[lower, upper]`` (IcePop, a ``"lower_upper"`` threshold), optionally
  normalised to mean 1 over the batch.
- ``rejection_mask``: a new response mask that drops tokens or whole sequences whose divergence estimate (k1, k2, k3
  of Schulman's KL estimators, per token or as a sequence sum / mean / max) is out of bounds.

Both follow verl's ``rollout_corr_helper`` (``compute_rollout_correction_weights``, ``compute_rollout_rejection_mask``)
in values and comparison directions; the metrics keep verl's names without the ``rollout_corr/`` prefix and are
detached 0-d tensors (no device synchronisation). Padding gets IS weight 0, as in verl (the loss mask excludes
padding anyway). ``rollout_is_weights`` is the only IS-weight implementation: ``policy_loss`` and ``reinforce_loss``
take its output as ``is_weights``. Everything runs without gradient tracking.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch

from async_rl.algorithms._checks import check_choice, check_same_shape, float_mask
from async_rl.algorithms.masking import masked_extreme, masked_sum, safe_count

__all__ = [
    "ROLLOUT_IS_LEVELS",
    "RSBounds",
    "normalize_is_weights",
    "rejection_mask",
    "rollout_is_weights",
]

ROLLOUT_IS_LEVELS: frozenset[str] = frozenset({"token", "sequence", "geometric"})
"""``token``: ``w_t = exp(d_t)``; ``sequence``: ``w_i = exp(sum_t d_t)`` on every token of the row; ``geometric``
(not in verl): ``w_i = exp(mean_t d_t)``, the per-token geometric mean, length-independent."""


_LOG_CLAMP = 20.0
_NORM_EPS = 1e-8

RSBounds = Mapping[str, tuple[float | None, float]]
"""Rejection-sampling options and their ``(lower, upper)`` bounds, in order (``config.correction.parse_rs_spec``
builds it from verl's ``rollout_rs`` / ``rollout_rs_threshold`` strings): an option is ``<family>_<kX>`` with family
``token``, ``seq_sum``, ``seq_mean`` or ``seq_max`` and ``kX`` one of ``k1``, ``k2``, ``k3``; ``lower`` is set for k1
and None for k2/k3."""

_RS_FAMILIES = ("token", "seq_sum", "seq_mean", "seq_max")
_RS_ESTIMATORS = ("k1", "k2", "k3")

AllReduce = Callable[[torch.Tensor], torch.Tensor]
"""Sums a small 1-D tensor over data-parallel ranks and returns it, e.g. ``lambda t: ctx.all_reduce(t, "sum")``."""


def _masked_mean_0d(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    return (values * weights).sum() / safe_count(weights.sum())


@torch.no_grad()
def rollout_is_weights(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    level: str,
    upper: float,
    lower: float | None,
    batch_normalize: bool = False,
    all_reduce: AllReduce | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Detached IS weights ``[B, T]`` for ``r = pi_train / pi_rollout`` and 0-d metrics (verl 0.9.1 semantics).

    With ``d = old_log_prob - rollout_log_prob`` on valid tokens (0 on padding): ``level="token"`` gives
    ``raw_t = exp(clamp(d_t, -20, 20))``; ``level="sequence"`` gives ``raw_i = exp(clamp(sum_t d_t, -20, 20))`` on
    every token of row i, ``level="geometric"`` the same with the mean over the row's valid tokens instead of the sum
    (not in verl). Padding gets weight 0. ``lower=None`` truncates at ``upper``, ``w = min(raw, upper)`` (TIS); a
    ``lower`` keeps ``raw`` where ``lower <= raw <= upper`` and zeroes it elsewhere (IcePop; kept weights are not set
    to 1). ``config.correction.parse_is_threshold`` reads both from verl's ``rollout_is_threshold`` (``2.0`` or
    ``"0.5_2.0"``).

    ``batch_normalize`` then divides every weight by their mean ``m`` (if ``m > 1e-8``; otherwise the weights are
    left as they are): at token level the mean over valid tokens, at the per-row levels (sequence, geometric) the
    mean of the row weights over rows with at least one valid token. ``all_reduce``, when given, receives the 1-D
    tensor ``[sum, count]`` behind ``m`` and must return it summed over ranks, making ``m`` global; without it the
    mean is over this batch (enough when every rank holds the whole batch).

    Metrics (before normalisation): ``rollout_is_mean`` (masked mean of ``w``); ``rollout_is_max/min`` (of ``w`` over
    valid tokens at token level, of the raw row weights over non-empty rows at the per-row levels; 1 with no valid
    token); ``rollout_is_ratio_fraction_high/low`` (fraction of valid tokens, or of non-empty rows at the per-row
    levels, with ``raw > upper`` / ``raw < lower``, ``lower`` defaulting to ``1 / upper``);
    ``rollout_is_eff_sample_size`` ``= mean(w)^2 / mean(w^2)`` over valid tokens (0 if every weight is 0, 1 with no
    valid token); with IcePop ``rollout_is_oob_ratio`` (fraction of valid tokens zeroed); with ``batch_normalize``
    ``rollout_is_batch_norm_factor`` (``m``, or 1 when not applied). verl's sequence-level fractions and extremes
    count every row, fully padded ones included; these count non-empty rows only.
    """
    check_same_shape("rollout_log_prob", rollout_log_prob, "old_log_prob", old_log_prob)
    check_same_shape("response_mask", response_mask, "old_log_prob", old_log_prob)
    check_choice("level", level, ROLLOUT_IS_LEVELS)
    if not upper > 0 or (lower is not None and not 0 < lower <= upper):
        raise ValueError(f"IS bounds need 0 < lower <= upper (or lower None), got lower={lower!r} upper={upper!r}")
    if not isinstance(batch_normalize, bool):
        raise ValueError(f"batch_normalize must be a bool, got {batch_normalize!r}")

    mask = float_mask(response_mask, old_log_prob)
    valid = mask != 0
    zero = torch.zeros((), dtype=mask.dtype, device=mask.device)
    log_ratio = torch.where(valid, old_log_prob - rollout_log_prob, zero)
    if level == "token":
        level_log_ratio = log_ratio
    else:
        row = masked_sum(log_ratio, mask, dim=-1)
        if level == "geometric":
            row = row / safe_count(mask.sum(dim=-1))
        level_log_ratio = row.unsqueeze(-1).expand_as(log_ratio)
    raw = torch.where(valid, torch.exp(torch.clamp(level_log_ratio, -_LOG_CLAMP, _LOG_CLAMP)), zero)
    if lower is None:
        weights = torch.clamp(raw, max=upper)
    else:
        weights = torch.where((raw >= lower) & (raw <= upper), raw, zero)

    lower_eff = 1.0 / upper if lower is None else lower
    nonempty = valid.any(dim=-1)
    metrics: dict[str, torch.Tensor] = {"rollout_is_mean": _masked_mean_0d(weights, mask)}
    if level == "token":
        unit, unit_weight = raw, mask
        metrics["rollout_is_max"] = masked_extreme(weights, valid, largest=True)
        metrics["rollout_is_min"] = masked_extreme(weights, valid, largest=False)
    else:
        unit, unit_weight = raw.amax(dim=-1), nonempty.to(mask.dtype)  # one raw weight per row (0 for empty rows)
        metrics["rollout_is_max"] = masked_extreme(unit, nonempty, largest=True)
        metrics["rollout_is_min"] = masked_extreme(unit, nonempty, largest=False)
    metrics["rollout_is_ratio_fraction_high"] = _masked_mean_0d((unit > upper).to(mask.dtype), unit_weight)
    metrics["rollout_is_ratio_fraction_low"] = _masked_mean_0d((unit < lower_eff).to(mask.dtype), unit_weight)
    mean_w = _masked_mean_0d(weights, mask)
    mean_w2 = _masked_mean_0d(weights.square(), mask)
    ess = torch.where(mean_w2 > 0, mean_w.square() / mean_w2.clamp_min(1e-30), zero).clamp(max=1.0)
    metrics["rollout_is_eff_sample_size"] = torch.where(valid.any(), ess, torch.ones_like(ess))
    if lower is not None:
        outside = ((raw < lower) | (raw > upper)).to(mask.dtype)
        metrics["rollout_is_oob_ratio"] = _masked_mean_0d(outside, mask)

    if batch_normalize:
        weights, metrics["rollout_is_batch_norm_factor"] = normalize_is_weights(
            weights, mask, level=level, all_reduce=all_reduce
        )
    return weights.detach(), {k: v.detach() for k, v in metrics.items()}


@torch.no_grad()
def normalize_is_weights(
    weights: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    level: str = "token",
    all_reduce: AllReduce | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Divide IS weights ``[B, T]`` by their batch mean ``m``; returns ``(weights / factor, factor)``, both detached.

    ``level="token"``: ``m`` = mean of the weights over valid tokens. ``level="sequence"`` (or ``"geometric"``, the
    other per-row level): ``m`` = mean over rows with at least one valid token of the row
    weight (the largest valid weight of the row, which is the row's single value at those levels). ``factor = m``
    when ``m > 1e-8``, otherwise 1 (verl 0.9.1 ``rollout_is_batch_normalize``). Every position, padding included, is
    divided, so padding weights 0 stay 0. ``all_reduce`` (see ``rollout_is_weights``) makes ``m`` a global mean:
    it receives ``[sum, count]`` and must return the sums over ranks.
    """
    check_same_shape("response_mask", response_mask, "weights", weights)
    check_choice("level", level, ROLLOUT_IS_LEVELS)
    mask = float_mask(response_mask, weights)
    valid = mask != 0
    if level == "token":
        total, count = (weights * mask).sum(), mask.sum()
    else:
        seq_mask = valid.any(dim=-1).to(mask.dtype)
        row_weight = torch.where(valid, weights, torch.zeros_like(weights)).amax(dim=-1)
        total, count = (row_weight * seq_mask).sum(), seq_mask.sum()
    if all_reduce is not None:
        reduced = all_reduce(torch.stack([total, count]))
        total, count = reduced[0], reduced[1]
    mean = total / safe_count(count)
    factor = torch.where(mean > _NORM_EPS, mean, torch.ones_like(mean))
    return (weights / factor).detach(), factor.detach()


@torch.no_grad()
def rejection_mask(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    bounds: RSBounds,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Response mask with out-of-bounds tokens / sequences set to 0, and 0-d metrics (verl 0.9.1 semantics).

    ``d = clamp(old_log_prob - rollout_log_prob, -20, 20)`` on valid tokens (0 on padding) is ``log r``. Per token:
    ``k1 = -d`` (= ``log(pi_rollout / pi_train)``), ``k2 = 0.5 * d^2``, ``k3 = exp(d) - 1 - d``. Each option of
    ``bounds`` (see :data:`RSBounds`) takes a statistic: ``token_kX`` the token's own ``kX``; ``seq_sum_kX`` /
    ``seq_mean_kX`` / ``seq_max_kX`` the sum / mean / max of ``kX`` over the row's valid tokens (0 for an empty row),
    shared by the whole row. With its ``(lower, upper)``, a statistic passes when
    ``log(lower) <= stat <= log(upper)`` for k1 and ``stat <= upper`` for k2/k3. So k1 bounds apply to
    ``pi_rollout / pi_train = 1 / r`` (``"0.5_4.0"`` keeps ``0.25 <= r <= 2``); with the default ``lower = 1 / upper``
    the interval is symmetric and the direction does not matter. A NaN statistic fails. A token is kept when it
    passes every option (logical AND); the result is ``response_mask`` with rejected positions set to 0 (same dtype).

    Metrics, per option ``o`` and overall: ``rollout_rs_<o>_masked_fraction`` / ``rollout_rs_masked_fraction``
    (fraction of valid tokens rejected) and ``rollout_rs_<o>_seq_masked_fraction`` /
    ``rollout_rs_seq_masked_fraction`` (fraction of non-empty rows with at least one rejected token; 0 when no row
    is non-empty). verl divides the overall sequence fraction by all B rows instead.
    """
    check_same_shape("rollout_log_prob", rollout_log_prob, "old_log_prob", old_log_prob)
    check_same_shape("response_mask", response_mask, "old_log_prob", old_log_prob)
    if not bounds:
        raise ValueError("rejection_mask needs at least one option")
    for option, (low, up) in bounds.items():
        family, _, estimator = option.rpartition("_")
        if family not in _RS_FAMILIES or estimator not in _RS_ESTIMATORS:
            raise ValueError(f"unknown rejection option {option!r}: <{'|'.join(_RS_FAMILIES)}>_<k1|k2|k3>")
        if not up > 0 or (estimator == "k1") != (low is not None) or (low is not None and not 0 < low <= up):
            raise ValueError(f"bad bounds for {option!r}: (lower, upper) = ({low!r}, {up!r})")

    mask = float_mask(response_mask, old_log_prob)
    valid = mask != 0
    zero = torch.zeros((), dtype=mask.dtype, device=mask.device)
    d = torch.clamp(torch.where(valid, old_log_prob - rollout_log_prob, zero), -_LOG_CLAMP, _LOG_CLAMP)
    per_token = {"k1": -d, "k2": 0.5 * d.square(), "k3": torch.exp(d) - 1.0 - d}
    lengths = mask.sum(dim=-1)
    nonempty = valid.any(dim=-1)
    n_tokens = safe_count(mask.sum())
    n_rows = safe_count(nonempty.sum().to(mask.dtype))

    def fractions(keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rejected = valid & ~keep
        token_frac = (rejected.to(mask.dtype) * mask).sum() / n_tokens
        seq_frac = (rejected.any(dim=-1) & nonempty).sum().to(mask.dtype) / n_rows
        return token_frac, seq_frac

    keep_all = torch.ones_like(valid)
    metrics: dict[str, torch.Tensor] = {}
    for option in bounds:
        family, estimator = option.rsplit("_", 1)
        values = per_token[estimator]
        if family == "token":
            stat = values
        elif family == "seq_sum":
            stat = masked_sum(values, mask, dim=-1)
        elif family == "seq_mean":
            stat = masked_sum(values, mask, dim=-1) / safe_count(lengths)
        else:
            assert family == "seq_max", option
            neg_inf = torch.full((), float("-inf"), dtype=values.dtype, device=values.device)
            stat = torch.where(nonempty, torch.where(valid, values, neg_inf).amax(dim=-1), zero)
        lower, upper = bounds[option]
        if estimator == "k1":
            assert lower is not None
            keep = (stat >= math.log(lower)) & (stat <= math.log(upper))
        else:
            keep = stat <= upper
        if family != "token":
            keep = keep.unsqueeze(-1).expand_as(valid)
        metrics[f"rollout_rs_{option}_masked_fraction"], metrics[f"rollout_rs_{option}_seq_masked_fraction"] = (
            fractions(keep)
        )
        keep_all = keep_all & keep
    metrics["rollout_rs_masked_fraction"], metrics["rollout_rs_seq_masked_fraction"] = fractions(keep_all)
    new_mask = torch.where(keep_all, response_mask, torch.zeros_like(response_mask))
    return new_mask, {k: v.detach() for k, v in metrics.items()}
