"""GRPO pass@k and OPO advantage estimators, with hand-derived values.

Compared against verl 0.9.1 ``compute_grpo_passk_outcome_advantage`` and ``compute_opo_outcome_advantage``
(``verl/trainer/ppo/core_algos.py``), read for semantics and reproduced by hand here:

- pass@k: per group, ``torch.topk(scores, 2)``; only the best row gets ``max - second_max``, divided by
  ``torch.std(scores) + epsilon`` when ``norm_adv_by_std_in_grpo`` (which verl reads from ``config``, not from its
  keyword argument); groups of one raise. A tie for the maximum gives 0 whichever tied row is picked.
- OPO: baseline ``sum(len * score) / sum(len)`` with ``len = response_mask.sum(-1)``; 0 for a group of one.

``tools/verl_crosscheck.py`` compares both (and every other shared estimator) against verl on random inputs.
"""

import math

import pytest
import torch

from async_rl.algorithms import (
    ADV_ESTIMATORS,
    compute_advantages,
    compute_grpo_passk_outcome_advantage,
    compute_opo_outcome_advantage,
)
from async_rl.config import GROUP_ESTIMATORS


def _outcome(scores: list[float], lengths: list[int], t: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards with each row's score on its last valid token (or the first token of an empty row), and the mask."""
    rewards = torch.zeros(len(scores), t)
    mask = torch.zeros(len(scores), t)
    for i, (s, n) in enumerate(zip(scores, lengths, strict=True)):
        mask[i, :n] = 1.0
        rewards[i, max(n - 1, 0)] = s
    return rewards, mask


def test_grpo_passk_only_the_best_row_of_each_group() -> None:
    # group a = rows 0, 2, 4 with scores 1, 4, 2; group b = rows 1, 3 with a tie 5, 5
    rewards, mask = _outcome([1.0, 5.0, 4.0, 5.0, 2.0], [2, 3, 4, 1, 3])
    index = ["a", "b", "a", "b", "a"]
    adv, ret = compute_grpo_passk_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=True)
    # group a: max - second max = 4 - 2 = 2; unbiased std of (1, 4, 2) = sqrt(7/3) = 1.527525
    best = 2.0 / (math.sqrt(7 / 3) + 1e-6)  # 1.309306
    expected = torch.tensor([0.0, 0.0, best, 0.0, 0.0]).unsqueeze(-1) * mask
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected)
    raw, _ = compute_grpo_passk_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)
    torch.testing.assert_close(raw, torch.tensor([0.0, 0.0, 2.0, 0.0, 0.0]).unsqueeze(-1) * mask)
    via, _ = compute_advantages(
        "grpo_passk",
        token_level_rewards=rewards,
        response_mask=mask,
        index=index,
        gamma=1.0,
        lam=1.0,
        norm_adv_by_std_in_grpo=True,
    )
    torch.testing.assert_close(via, expected)


def test_grpo_passk_rejects_groups_of_one() -> None:
    rewards, mask = _outcome([1.0, 2.0, 3.0], [1, 1, 1])
    with pytest.raises(ValueError, match="index.*at least 2"):
        compute_grpo_passk_outcome_advantage(rewards, mask, [0, 0, 1], norm_adv_by_std_in_grpo=True)


def test_opo_length_weighted_baseline() -> None:
    # group 0 = rows 0, 1, 2: scores 1, 0, 1 with lengths 2, 4, 1 -> baseline (2*1 + 4*0 + 1*1) / 7 = 3/7
    # group 1 = row 3 alone: baseline 0, advantage = its score 2
    rewards, mask = _outcome([1.0, 0.0, 1.0, 2.0], [2, 4, 1, 3])
    index = [0, 0, 0, 1]
    adv, ret = compute_opo_outcome_advantage(rewards, mask, index)
    expected = torch.tensor([4 / 7, -3 / 7, 4 / 7, 2.0]).unsqueeze(-1) * mask
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected)
    via, _ = compute_advantages(
        "opo",
        token_level_rewards=rewards,
        response_mask=mask,
        index=index,
        gamma=1.0,
        lam=1.0,
        norm_adv_by_std_in_grpo=True,
    )
    torch.testing.assert_close(via, expected)
    # a plain group mean would be 2/3: the length weighting matters
    assert abs(adv[1, 0].item() - (0.0 - 2 / 3)) > 0.2


def test_opo_all_empty_group_is_zero_not_nan() -> None:
    rewards, mask = _outcome([0.0, 0.0], [0, 0])
    adv, _ = compute_opo_outcome_advantage(rewards, mask, [0, 0])
    assert torch.equal(adv, torch.zeros_like(adv))


def test_registered_as_group_estimators() -> None:
    for name in ("grpo_passk", "opo"):
        assert ADV_ESTIMATORS[name].needs_index and not ADV_ESTIMATORS[name].needs_values
        assert name in GROUP_ESTIMATORS
        with pytest.raises(ValueError, match="index"):
            compute_advantages(
                name,
                token_level_rewards=torch.zeros(2, 2),
                response_mask=torch.ones(2, 2),
                gamma=1.0,
                lam=1.0,
                norm_adv_by_std_in_grpo=True,
            )
