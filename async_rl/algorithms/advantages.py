"""Advantage estimators (GAE, GRPO, GRPO pass@k, REINFORCE++(-baseline), RLOO, OPO) behind one dispatching entry point.

The learner turns per-token rewards into per-token advantages (and returns, the value-model target) before computing
the policy loss. Every estimator reproduces verl's ``core_algos`` numerics so a verl configuration ports unchanged;
group-based estimators are vectorised with ``index_add_`` instead of verl's Python dictionaries but keep its group-size
edge cases. Inputs are ``[B, T]`` (B responses, T response tokens); ``index`` holds each row's group (prompt) id.
Everything runs under ``torch.no_grad()``: advantages are constants for the loss.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from async_rl.algorithms._checks import check_2d, check_choice, check_same_shape, float_mask
from async_rl.algorithms.masking import masked_whiten, safe_count

__all__ = [
    "ADV_ESTIMATORS",
    "CRITIC_ESTIMATORS",
    "AdvantageEstimatorSpec",
    "AdvantageInputs",
    "GroupIndex",
    "compute_advantages",
    "compute_gae_advantage_return",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_opo_outcome_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "group_ids",
    "needs_critic",
]

GroupIndex = Sequence[Hashable] | np.ndarray | torch.Tensor
"""Per-row group (prompt) ids: a list, 1-D numpy array or 1-D tensor of hashables, length B."""


def group_ids(index: GroupIndex, batch_size: int, device: torch.device) -> tuple[torch.Tensor, int]:
    """Map arbitrary hashable group ids to dense ids ``0..G-1`` in order of first appearance.

    Returns ``(ids [B] int64, G)``. Raises ``ValueError`` naming ``index`` when it is not 1-D or its length is not B.
    """
    if isinstance(index, (str, bytes)):
        raise ValueError(f"index must be a sequence of group ids (one per row), got a {type(index).__name__}")
    if isinstance(index, (np.ndarray, torch.Tensor)):
        if index.ndim != 1:
            raise ValueError(f"index must be 1-D (one group id per row), got shape {tuple(index.shape)}")
        keys: list[Any] = index.tolist()
    else:
        keys = list(index)
    if len(keys) != batch_size:
        raise ValueError(f"index has length {len(keys)} but the batch has B={batch_size} rows")
    dense: dict[Hashable, int] = {}
    try:
        ids = [dense.setdefault(k, len(dense)) for k in keys]
    except TypeError as exc:
        raise ValueError(f"index entries must be hashable: {exc}") from exc
    return torch.tensor(ids, dtype=torch.long, device=device), len(dense)


def _group_sum(values: torch.Tensor, ids: torch.Tensor, num_groups: int) -> torch.Tensor:
    return torch.zeros(num_groups, dtype=values.dtype, device=values.device).index_add_(0, ids, values)


def _group_count(ids: torch.Tensor, num_groups: int, dtype: torch.dtype) -> torch.Tensor:
    return _group_sum(torch.ones(ids.shape[0], dtype=dtype, device=ids.device), ids, num_groups)


def _check_rewards_mask(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> None:
    check_2d("token_level_rewards", token_level_rewards)
    check_same_shape("response_mask", response_mask, "token_level_rewards", token_level_rewards)


@torch.no_grad()
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation with a mask-aware backward recursion (verl's form).

    For t = T-1 .. 0 with carries ``nextvalue`` and ``lastgaelam`` (both start at 0)::

        delta_t    = r_t + gamma * nextvalue - V_t
        gae_t      = delta_t + gamma * lam * lastgaelam
        nextvalue  = V_t * m_t + (1 - m_t) * nextvalue     # padding keeps the carry: it is skipped
        lastgaelam = gae_t * m_t + (1 - m_t) * lastgaelam
        A_t        = lastgaelam

    so a masked position neither contributes its value nor breaks the chain between the valid tokens around it (at
    the last valid token ``nextvalue`` is 0, i.e. the episode ends there). ``returns = A + V`` (unwhitened, the
    critic target) and the returned advantages are ``masked_whiten(A, response_mask)`` over the whole batch.
    Shapes: all ``[B, T]``; returns ``(advantages [B, T], returns [B, T])``.
    """
    _check_rewards_mask(token_level_rewards, response_mask)
    check_same_shape("values", values, "token_level_rewards", token_level_rewards)
    mask = float_mask(response_mask, token_level_rewards)
    batch, length = token_level_rewards.shape
    nextvalues = torch.zeros(batch, dtype=values.dtype, device=values.device)
    lastgaelam = torch.zeros(batch, dtype=values.dtype, device=values.device)
    reversed_adv: list[torch.Tensor] = []
    for t in reversed(range(length)):
        m_t = mask[:, t]
        delta = token_level_rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam_new = delta + gamma * lam * lastgaelam
        nextvalues = values[:, t] * m_t + (1 - m_t) * nextvalues
        lastgaelam = lastgaelam_new * m_t + (1 - m_t) * lastgaelam
        reversed_adv.append(lastgaelam)
    advantages = torch.stack(reversed_adv[::-1], dim=1)
    returns = advantages + values
    return masked_whiten(advantages, mask), returns


@torch.no_grad()
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex,
    *,
    norm_adv_by_std_in_grpo: bool,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage: each response's total reward normalised within its group.

    ``score_i = sum_t r_{i,t}`` (over all T; padding rewards must be 0). Per group: mean and the *unbiased* sample std
    (``torch.std``); a group of one gets mean 0 and std 1 (so its advantage is ``score / (1 + epsilon)``).
    ``adv = (score - mean) / (std + epsilon)`` or, with ``norm_adv_by_std_in_grpo=False`` (Dr. GRPO), ``score - mean``.
    Returns ``(adv[:, None] * mask, same)``, both ``[B, T]``.
    """
    _check_rewards_mask(token_level_rewards, response_mask)
    scores = token_level_rewards.sum(dim=-1)
    ids, num_groups = group_ids(index, scores.shape[0], scores.device)
    counts = _group_count(ids, num_groups, scores.dtype)
    singleton = counts == 1
    mean = torch.where(singleton, 0.0, _group_sum(scores, ids, num_groups) / counts)
    centred = scores - mean[ids]
    sq = _group_sum(centred * centred, ids, num_groups)
    std = torch.where(singleton, 1.0, torch.sqrt(sq / (counts - 1).clamp_min(1)))
    adv = (scores - mean[ids]) / (std[ids] + epsilon) if norm_adv_by_std_in_grpo else scores - mean[ids]
    adv = adv.unsqueeze(-1) * float_mask(response_mask, scores)
    return adv, adv


@torch.no_grad()
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted return-to-go per token, whitened over the batch's valid tokens.

    Backward recursion (verl 0.9.1): ``new = r_t + gamma * running``; ``G_t = new * m_t``;
    ``running = new * m_t + running * (1 - m_t)``. A masked position is skipped: it gets ``G_t = 0``, its reward is
    dropped and the carry passes through it unchanged, so trailing padding contributes nothing and a masked span
    inside a response (e.g. observation tokens) does not break the return of the tokens before it.
    ``advantages = masked_whiten(G, mask) * mask``; ``returns = G`` (unwhitened). Shapes: all ``[B, T]``.
    """
    _check_rewards_mask(token_level_rewards, response_mask)
    mask = float_mask(response_mask, token_level_rewards)
    returns = torch.zeros_like(token_level_rewards)
    running = torch.zeros(token_level_rewards.shape[0], dtype=returns.dtype, device=returns.device)
    for t in reversed(range(token_level_rewards.shape[1])):
        m_t = mask[:, t]
        new = token_level_rewards[:, t] + gamma * running
        returns[:, t] = new * m_t
        running = new * m_t + running * (1 - m_t)
    advantages = masked_whiten(returns, mask) * mask
    return advantages, returns


@torch.no_grad()
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: GroupIndex
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group-mean baseline: ``(score - group mean)`` tiled over tokens, whitened over the batch.

    A group of one has baseline 0. ``adv = masked_whiten(tile(score - mean) * mask, mask) * mask``; returns = adv.
    """
    _check_rewards_mask(token_level_rewards, response_mask)
    mask = float_mask(response_mask, token_level_rewards)
    scores = token_level_rewards.sum(dim=-1)
    ids, num_groups = group_ids(index, scores.shape[0], scores.device)
    counts = _group_count(ids, num_groups, scores.dtype)
    mean = torch.where(counts == 1, 0.0, _group_sum(scores, ids, num_groups) / counts)
    tiled = (scores - mean[ids]).unsqueeze(-1).expand_as(mask) * mask
    adv = masked_whiten(tiled, mask) * mask
    return adv, adv


@torch.no_grad()
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: GroupIndex
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO (verl's loop version): leave-one-out baseline within each group.

    For a group of size n > 1: ``adv_i = score_i * n/(n-1) - mean * n/(n-1)`` = score_i minus the mean of the *other*
    n-1 scores. A group of one keeps its raw score as the advantage (unlike ``rloo_vectorized``, which gives it 0).
    Returns ``(adv[:, None] * mask, same)``.
    """
    _check_rewards_mask(token_level_rewards, response_mask)
    scores = token_level_rewards.sum(dim=-1)
    ids, num_groups = group_ids(index, scores.shape[0], scores.device)
    n = _group_count(ids, num_groups, scores.dtype)[ids]
    mean = _group_sum(scores, ids, num_groups)[ids] / n
    denom = (n - 1).clamp_min(1)
    # Same operation order as verl (``score * n / (n - 1) - mean * n / (n - 1)``) for bit-level parity.
    adv = torch.where(n > 1, scores * n / denom - mean * n / denom, scores)
    adv = adv.unsqueeze(-1) * float_mask(response_mask, scores)
    return adv, adv


@torch.no_grad()
def compute_rloo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: GroupIndex
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO, verl's vectorised variant: ``adv = (c * s - group_sum) / max(c - 1, 1) * (c > 1)``.

    Same leave-one-out value as ``rloo`` for groups of size c > 1, but a group of one gets advantage **0** (``rloo``
    keeps the raw score there). Returns ``(adv[:, None] * mask, same)``.
    """
    _check_rewards_mask(token_level_rewards, response_mask)
    scores = token_level_rewards.sum(dim=-1)
    ids, num_groups = group_ids(index, scores.shape[0], scores.device)
    c = _group_count(ids, num_groups, scores.dtype)[ids]
    group_total = _group_sum(scores, ids, num_groups)[ids]
    adv = (c * scores - group_total) / (c - 1).clamp_min(1) * (c > 1).to(scores.dtype)
    adv = adv.unsqueeze(-1) * float_mask(response_mask, scores)
    return adv, adv


@torch.no_grad()
def compute_grpo_passk_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex,
    *,
    norm_adv_by_std_in_grpo: bool,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO pass@k (arXiv 2503.19595): only the best response of each group is reinforced.

    ``score_i = sum_t r_{i,t}``. In each group (size >= 2, else ``ValueError`` naming ``index``) the best row gets
    ``adv = max - second_max`` of the group's scores, divided by ``std + epsilon`` (unbiased sample std of the
    group's scores) when ``norm_adv_by_std_in_grpo``; every other row gets 0. On a tie for the maximum the
    difference is 0, so which tied row is "best" does not matter. Returns ``(adv[:, None] * mask, same)``.
    verl 0.9.1 reads ``norm_adv_by_std_in_grpo`` from its ``config`` argument instead of the keyword.
    """
    _check_rewards_mask(token_level_rewards, response_mask)
    scores = token_level_rewards.sum(dim=-1)
    ids, num_groups = group_ids(index, scores.shape[0], scores.device)
    counts = _group_count(ids, num_groups, scores.dtype)
    if bool((counts < 2).any()):
        raise ValueError("index: grpo_passk needs at least 2 responses per group (rollout.n >= 2)")
    batch = scores.shape[0]
    neg_inf = torch.full((num_groups,), float("-inf"), dtype=scores.dtype, device=scores.device)
    group_max = neg_inf.scatter_reduce(0, ids, scores, reduce="amax")
    # The best row of each group: the first row (lowest index) that attains the group maximum.
    rows = torch.arange(batch, device=scores.device)
    at_max = scores == group_max[ids]
    sentinel = torch.full((num_groups,), batch, dtype=torch.long, device=scores.device)
    best_row = sentinel.scatter_reduce(0, ids, torch.where(at_max, rows, batch), reduce="amin")
    is_best = rows == best_row[ids]
    second_max = neg_inf.scatter_reduce(0, ids, torch.where(is_best, float("-inf"), scores), reduce="amax")
    gap = group_max - second_max
    if norm_adv_by_std_in_grpo:
        centred = scores - (_group_sum(scores, ids, num_groups) / counts)[ids]
        std = torch.sqrt(_group_sum(centred * centred, ids, num_groups) / (counts - 1))
        gap = gap / (std + epsilon)
    adv = torch.where(is_best, gap[ids], torch.zeros_like(scores))
    adv = adv.unsqueeze(-1) * float_mask(response_mask, scores)
    return adv, adv


@torch.no_grad()
def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: GroupIndex
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO (arXiv 2505.23585): score minus the group's *length-weighted* mean score.

    With ``score_i = sum_t r_{i,t}`` and ``len_i = sum_t m_{i,t}``, a group of size > 1 has baseline
    ``b = sum_j len_j * score_j / sum_j len_j``; a group of one has ``b = 0`` (its raw score is the advantage).
    ``adv_i = score_i - b`` tiled over the valid tokens: returns ``(adv[:, None] * mask, same)``. A group whose rows
    are all empty gets ``b = 0`` and advantages 0 (verl 0.9.1 divides 0 by 0 there, and its NaN survives the
    multiplication by the mask).
    """
    _check_rewards_mask(token_level_rewards, response_mask)
    mask = float_mask(response_mask, token_level_rewards)
    scores = token_level_rewards.sum(dim=-1)
    lengths = mask.sum(dim=-1)
    ids, num_groups = group_ids(index, scores.shape[0], scores.device)
    counts = _group_count(ids, num_groups, scores.dtype)
    total_len = _group_sum(lengths, ids, num_groups)
    weighted = _group_sum(lengths * scores, ids, num_groups)
    baseline = torch.where(counts > 1, weighted / safe_count(total_len), torch.zeros_like(weighted))
    adv = (scores - baseline[ids]).unsqueeze(-1) * mask
    return adv, adv


@dataclass(frozen=True)
class AdvantageInputs:
    """Everything ``compute_advantages`` received, handed to a registered estimator."""

    token_level_rewards: torch.Tensor
    response_mask: torch.Tensor
    index: GroupIndex | None
    values: torch.Tensor | None
    gamma: float
    lam: float
    norm_adv_by_std_in_grpo: bool
    epsilon: float


@dataclass(frozen=True)
class AdvantageEstimatorSpec:
    """A registry entry: the estimator and which optional inputs it requires."""

    fn: Callable[[AdvantageInputs], tuple[torch.Tensor, torch.Tensor]]
    needs_index: bool = False
    needs_values: bool = False


def _gae(a: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    assert a.values is not None
    return compute_gae_advantage_return(a.token_level_rewards, a.values, a.response_mask, a.gamma, a.lam)


def _grpo(a: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    assert a.index is not None
    return compute_grpo_outcome_advantage(
        a.token_level_rewards,
        a.response_mask,
        a.index,
        norm_adv_by_std_in_grpo=a.norm_adv_by_std_in_grpo,
        epsilon=a.epsilon,
    )


def _grpo_passk(a: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    assert a.index is not None
    return compute_grpo_passk_outcome_advantage(
        a.token_level_rewards,
        a.response_mask,
        a.index,
        norm_adv_by_std_in_grpo=a.norm_adv_by_std_in_grpo,
        epsilon=a.epsilon,
    )


def _opo(a: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    assert a.index is not None
    return compute_opo_outcome_advantage(a.token_level_rewards, a.response_mask, a.index)


def _rpp(a: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    return compute_reinforce_plus_plus_outcome_advantage(a.token_level_rewards, a.response_mask, a.gamma)


def _rpp_baseline(a: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    assert a.index is not None
    return compute_reinforce_plus_plus_baseline_outcome_advantage(a.token_level_rewards, a.response_mask, a.index)


def _rloo(a: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    assert a.index is not None
    return compute_rloo_outcome_advantage(a.token_level_rewards, a.response_mask, a.index)


def _rloo_vectorized(a: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    assert a.index is not None
    return compute_rloo_vectorized_outcome_advantage(a.token_level_rewards, a.response_mask, a.index)


ADV_ESTIMATORS: dict[str, AdvantageEstimatorSpec] = {
    "gae": AdvantageEstimatorSpec(_gae, needs_values=True),
    "grpo": AdvantageEstimatorSpec(_grpo, needs_index=True),
    "grpo_passk": AdvantageEstimatorSpec(_grpo_passk, needs_index=True),
    "opo": AdvantageEstimatorSpec(_opo, needs_index=True),
    "reinforce_plus_plus": AdvantageEstimatorSpec(_rpp),
    "reinforce_plus_plus_baseline": AdvantageEstimatorSpec(_rpp_baseline, needs_index=True),
    "rloo": AdvantageEstimatorSpec(_rloo, needs_index=True),
    "rloo_vectorized": AdvantageEstimatorSpec(_rloo_vectorized, needs_index=True),
}
"""Advantage estimators by name (verl's names)."""

CRITIC_ESTIMATORS: frozenset[str] = frozenset(name for name, spec in ADV_ESTIMATORS.items() if spec.needs_values)
"""Estimators that need a value model (critic): currently ``{"gae"}``."""


def needs_critic(estimator: str) -> bool:
    """Whether ``estimator`` needs value-model predictions; raises ``ValueError`` for an unknown name."""
    check_choice("estimator", estimator, ADV_ESTIMATORS)
    return ADV_ESTIMATORS[estimator].needs_values


def compute_advantages(
    estimator: str,
    *,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex | None = None,
    values: torch.Tensor | None = None,
    gamma: float,
    lam: float,
    norm_adv_by_std_in_grpo: bool,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Compute ``(advantages [B, T], returns [B, T])`` with the estimator named ``estimator`` (see ``ADV_ESTIMATORS``).

    ``index`` (group ids, length B) is required by the group estimators and ``values`` ([B, T] critic predictions)
    by ``gae``; a missing one raises ``ValueError`` naming it, as does an unknown estimator name (listing the allowed
    ones). Arguments an estimator does not use are ignored.
    """
    check_choice("estimator", estimator, ADV_ESTIMATORS)
    spec = ADV_ESTIMATORS[estimator]
    if spec.needs_index and index is None:
        raise ValueError(f"index (group id per row) is required by the {estimator!r} advantage estimator")
    if spec.needs_values and values is None:
        raise ValueError(f"values (critic predictions [B, T]) are required by the {estimator!r} advantage estimator")
    inputs = AdvantageInputs(
        token_level_rewards=token_level_rewards,
        response_mask=response_mask,
        index=index,
        values=values,
        gamma=gamma,
        lam=lam,
        norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
        epsilon=epsilon,
    )
    return spec.fn(inputs)
