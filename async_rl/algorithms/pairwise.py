"""The Bradley-Terry pairwise loss of a reward model, and the pair statistics reported with it.

A reward model scores a prompt + response with one scalar ``r``. For a preference pair (chosen over rejected, with an
optional margin ``m``) the model of Bradley and Terry gives ``P(chosen > rejected) = sigmoid(r_c - r_r - m)``; the
loss is its negative log-likelihood. ``r`` is only defined up to a shift, so an optional centring term
``c * (r_c + r_r)^2`` (TRL's ``center_rewards_coefficient``) keeps rewards near zero.

Pure tensor math: scores ``[P]`` in, a scalar loss out. The loss is a SUM over the pairs given divided by
``global_num_pairs`` (all pairs of the optimizer step, over every micro-batch and rank), so summing the micro-batch
losses gives the mean over the step's pairs whatever the micro-batch size and the world size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["bradley_terry_loss", "pair_stats"]


def bradley_terry_loss(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    margin: torch.Tensor | None,
    *,
    center_rewards_coefficient: float,
    global_num_pairs: float,
) -> torch.Tensor:
    """``sum_i [-log sigmoid(r_c,i - r_r,i - m_i) + c * (r_c,i + r_r,i)^2] / global_num_pairs`` (a 0-d tensor).

    ``chosen``, ``rejected``, ``margin``: ``[P]`` (margin None = 0). ``center_rewards_coefficient`` ``c >= 0``;
    ``global_num_pairs`` > 0 is the number of pairs the step's loss averages over."""
    if chosen.shape != rejected.shape or chosen.dim() != 1:
        raise ValueError(f"chosen and rejected must both be [P], got {tuple(chosen.shape)} and {tuple(rejected.shape)}")
    if margin is not None and margin.shape != chosen.shape:
        raise ValueError(f"margin must be [P] like the scores, got {tuple(margin.shape)}")
    if global_num_pairs <= 0:
        raise ValueError(f"global_num_pairs must be > 0, got {global_num_pairs}")
    if center_rewards_coefficient < 0:
        raise ValueError(f"center_rewards_coefficient must be >= 0, got {center_rewards_coefficient}")
    diff = chosen - rejected
    if margin is not None:
        diff = diff - margin.to(diff.dtype)
    loss = -F.logsigmoid(diff).sum()
    if center_rewards_coefficient:
        loss = loss + center_rewards_coefficient * (chosen + rejected).pow(2).sum()
    return loss / global_num_pairs


def pair_stats(chosen: torch.Tensor, rejected: torch.Tensor) -> dict[str, torch.Tensor]:
    """Sums over ``[P]`` pairs, for metrics reduced over micro-batches and ranks: ``correct`` (pairs with
    ``r_c > r_r``; a tie counts half), ``margin`` (sum of ``r_c - r_r``), ``reward`` and ``reward_sq`` (sums of
    every score and its square, both responses), ``pairs``."""
    c, r = chosen.detach().double(), rejected.detach().double()
    both = torch.cat([c, r])
    return {
        "correct": (c > r).double().sum() + 0.5 * (c == r).double().sum(),
        "margin": (c - r).sum(),
        "reward": both.sum(),
        "reward_sq": both.pow(2).sum(),
        "pairs": torch.tensor(float(c.numel()), dtype=torch.float64),
    }
