"""Tests for the advantage estimators and the ``compute_advantages`` dispatcher, with hand-derived values.

The expected values reproduce verl 0.9.1's ``core_algos`` estimators (``compute_gae_advantage_return``,
``compute_grpo_outcome_advantage``, ``compute_rloo_outcome_advantage``, ...), derived by hand from their definitions;
the registry now also holds ``grpo_passk`` and ``opo`` (tested in ``test_advantage_passk_opo.py``). REINFORCE++
follows verl 0.9.1's recursion, which skips masked positions (return 0 there, carry unchanged) rather than resetting
the carry as earlier verl versions did; the two agree on right-padded responses with zero padding rewards.
``tools/verl_crosscheck.py`` runs every estimator shared with verl on random inputs against verl itself.
"""

import math
from functools import partial

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from async_rl.algorithms import (
    ADV_ESTIMATORS,
    CRITIC_ESTIMATORS,
    compute_advantages,
    compute_gae_advantage_return,
    needs_critic,
)

advantages = partial(compute_advantages, gamma=1.0, lam=1.0, norm_adv_by_std_in_grpo=True)


def _outcome(scores: list[float], lengths: list[int], t: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards with each row's score on its last valid token, and the matching mask."""
    rewards = torch.zeros(len(scores), t)
    mask = torch.zeros(len(scores), t)
    for i, (s, n) in enumerate(zip(scores, lengths, strict=True)):
        mask[i, :n] = 1.0
        rewards[i, n - 1] = s
    return rewards, mask


def test_grpo_group_of_four_and_singleton() -> None:
    rewards, mask = _outcome([1.0, 0.0, 0.0, 1.0, 2.0], [3, 2, 1, 3, 2])
    adv, ret = advantages("grpo", token_level_rewards=rewards, response_mask=mask, index=[7, 7, 7, 7, 8])
    # group 7 scores [1,0,0,1]: mean .5, deviations +-.5, unbiased var = (4 * .25) / 3 = 1/3, std = sqrt(1/3)
    expect = 0.5 / (math.sqrt(1 / 3) + 1e-6)  # = 0.866024...
    assert adv[0, 0].item() == pytest.approx(expect, rel=1e-6)
    assert adv[1, 1].item() == pytest.approx(-expect, rel=1e-6)
    assert adv[1, 2].item() == 0.0  # padding
    # singleton group: mean 0, std 1 -> 2 / (1 + 1e-6)
    assert adv[4, 0].item() == pytest.approx(2 / (1 + 1e-6), rel=1e-7)
    assert adv[4, 2].item() == 0.0
    torch.testing.assert_close(ret, adv)


def test_grpo_without_std_normalisation_is_centred_score() -> None:
    rewards, mask = _outcome([1.0, 0.0, 0.0, 1.0], [3, 3, 3, 3])
    adv, _ = advantages(
        "grpo", token_level_rewards=rewards, response_mask=mask, index=["a"] * 4, norm_adv_by_std_in_grpo=False
    )
    # score - mean: 1 - .5 = .5 and 0 - .5 = -.5, broadcast over all three tokens
    torch.testing.assert_close(adv, torch.tensor([[0.5] * 3, [-0.5] * 3, [-0.5] * 3, [0.5] * 3]))


def test_grpo_accepts_numpy_tensor_and_list_index_and_bool_mask() -> None:
    rewards, mask = _outcome([1.0, 3.0, 2.0, 2.0], [3, 2, 3, 1])
    by_list, _ = advantages("grpo", token_level_rewards=rewards, response_mask=mask, index=["p", "p", "q", "q"])
    by_np, _ = advantages(
        "grpo",
        token_level_rewards=rewards,
        response_mask=mask.bool(),
        index=np.array(["p", "p", "q", "q"], dtype=object),
    )
    by_tensor, _ = advantages("grpo", token_level_rewards=rewards, response_mask=mask, index=torch.tensor([0, 0, 1, 1]))
    torch.testing.assert_close(by_list, by_np)
    torch.testing.assert_close(by_list, by_tensor)
    # group q has equal scores -> std 0 -> advantage 0/(0+eps) = 0
    assert by_list[2:].abs().max().item() == 0.0


@settings(max_examples=30, deadline=None)
@given(
    scores=st.lists(st.floats(-5, 5, allow_nan=False), min_size=2, max_size=12),
    data=st.data(),
    norm=st.booleans(),
)
def test_grpo_advantages_sum_to_zero_within_groups(scores: list[float], data: st.DataObject, norm: bool) -> None:
    groups = data.draw(st.lists(st.integers(0, 2), min_size=len(scores), max_size=len(scores)))
    rewards = torch.tensor(scores, dtype=torch.float64).unsqueeze(-1)
    mask = torch.ones_like(rewards)
    adv, _ = advantages(
        "grpo", token_level_rewards=rewards, response_mask=mask, index=groups, norm_adv_by_std_in_grpo=norm
    )
    for g in set(groups):
        rows = [i for i, x in enumerate(groups) if x == g]
        if len(rows) > 1:  # a group of one is not centred (mean 0 by definition)
            assert abs(adv[rows, 0].sum().item()) < 1e-6 * max(1.0, adv[rows, 0].abs().max().item())


def test_rloo_loop_and_vectorized_differ_only_on_singletons() -> None:
    rewards, mask = _outcome([1.0, 2.0, 3.0, 6.0, 5.0], [1, 2, 3, 3, 2])
    index = [0, 0, 0, 0, 1]
    loop, ret = advantages("rloo", token_level_rewards=rewards, response_mask=mask, index=index)
    vec, _ = advantages("rloo_vectorized", token_level_rewards=rewards, response_mask=mask, index=index)
    # group 0: n=4, leave-one-out baseline: 1 - (2+3+6)/3 = -8/3, 2 - 10/3 = -4/3, 3 - 9/3 = 0, 6 - 6/3 = 4
    expected = [-8 / 3, -4 / 3, 0.0, 4.0]
    for i, e in enumerate(expected):
        assert loop[i, 0].item() == pytest.approx(e, rel=1e-6, abs=1e-6)
        assert vec[i, 0].item() == pytest.approx(e, rel=1e-6, abs=1e-6)
    assert loop[0, 1].item() == 0.0  # padding of a length-1 row
    # singleton group: loop keeps the raw score 5, vectorized gives 0
    assert loop[4, 0].item() == 5.0
    assert vec[4, 0].item() == 0.0
    torch.testing.assert_close(ret, loop)


def test_reinforce_plus_plus_discounting_skips_padding() -> None:
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 7.0]])  # 7.0 sits on padding and must not leak back
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = advantages("reinforce_plus_plus", token_level_rewards=rewards, response_mask=mask, gamma=0.5)
    # row 0: G2 = 1, G1 = .5 * 1, G0 = .25; row 1: padding G2 = 0 (its reward is dropped), G1 = 2, G0 = .5 * 2 = 1
    torch.testing.assert_close(ret, torch.tensor([[0.25, 0.5, 1.0], [1.0, 2.0, 0.0]]))
    # valid returns .25,.5,1,1,2: mean .95, squared deviations sum 1.8, unbiased var .45
    assert adv[1, 1].item() == pytest.approx(1.05 / math.sqrt(0.45), rel=1e-5)
    assert adv[1, 2].item() == 0.0


def test_reinforce_plus_plus_carries_the_return_across_a_masked_span() -> None:
    # verl 0.9.1: a masked token inside a response (e.g. a tool observation) passes the carry through unchanged
    rewards = torch.tensor([[0.0, 5.0, 1.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    _, ret = advantages("reinforce_plus_plus", token_level_rewards=rewards, response_mask=mask, gamma=0.5)
    # G2 = 1; masked t1: G1 = 0, carry stays 1 (its reward 5 is dropped); G0 = 0 + .5 * 1
    torch.testing.assert_close(ret, torch.tensor([[0.5, 0.0, 1.0]]))


def test_reinforce_plus_plus_baseline() -> None:
    rewards, mask = _outcome([1.0, 3.0, 5.0], [2, 1, 2], t=2)
    adv, ret = advantages(
        "reinforce_plus_plus_baseline", token_level_rewards=rewards, response_mask=mask, index=["a", "a", "b"]
    )
    # group a mean 2 -> -1, +1; singleton b baseline 0 -> 5. Tiled valid values: -1,-1, 1, 5,5
    # mean 9/5 = 1.8; squared deviations 7.84*2 + .64 + 10.24*2 = 36.8; unbiased var 9.2
    assert adv[0, 0].item() == pytest.approx(-2.8 / math.sqrt(9.2), rel=1e-5)
    assert adv[2, 1].item() == pytest.approx(3.2 / math.sqrt(9.2), rel=1e-5)
    assert adv[1, 1].item() == 0.0
    torch.testing.assert_close(ret, adv)


def test_gae_single_row_values() -> None:
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 0.7]])
    mask = torch.ones(1, 3)
    adv, ret = advantages("gae", token_level_rewards=rewards, response_mask=mask, values=values)
    # gamma=lam=1: delta2 = 1 - .7 = .3; delta1 = .7 - .6 = .1; delta0 = .6 - .5 = .1 -> A = [.5, .4, .3]
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 1.0]]))  # A + V
    # whitened: mean .4, unbiased var (.01 + 0 + .01) / 2 = .01 -> [1, 0, -1]
    torch.testing.assert_close(adv, torch.tensor([[1.0, 0.0, -1.0]]), atol=1e-5, rtol=1e-5)


def test_gae_skips_masked_positions() -> None:
    # [valid, pad, valid] must behave like the 2-token sequence [valid, valid]; the pad holds garbage
    rewards = torch.tensor([[0.0, 9.0, 1.0], [0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 99.0, 0.7], [0.5, 0.7, 0.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    _, ret = advantages("gae", token_level_rewards=rewards, response_mask=mask, values=values, gamma=0.9, lam=0.8)
    # last token: delta = 1 - .7 = .3 -> A = .3, return 1.0
    # first token: delta = 0 + .9 * .7 - .5 = .13; A = .13 + .9 * .8 * .3 = .346; return .346 + .5 = .846
    torch.testing.assert_close(ret[0, [0, 2]], torch.tensor([0.846, 1.0]))
    torch.testing.assert_close(ret[1, [0, 1]], torch.tensor([0.846, 1.0]))


def test_gae_over_a_multi_turn_episode_is_gae_over_its_sampled_tokens_alone() -> None:
    # Observation tokens (0 in the mask) sit between the model's turns; the critic still predicts a value there.
    # Masked, the episode must give exactly the advantages of the compressed sequence of sampled tokens: each sampled
    # token bootstraps from the next SAMPLED token's value, and the whitening sees the same set of advantages.
    mask = torch.tensor([[1, 1, 0, 0, 0, 1, 1, 0], [1, 0, 1, 1, 0, 0, 1, 1], [0, 1, 1, 1, 1, 1, 1, 1]]).double()
    gen = torch.Generator().manual_seed(5)
    values = torch.randn(3, 8, generator=gen, dtype=torch.float64) * 3  # garbage at observation and padding
    rewards = torch.randn(3, 8, generator=gen, dtype=torch.float64) * mask  # e.g. a KL penalty: 0 off the mask
    rewards[torch.arange(3), torch.tensor([6, 7, 7])] += torch.tensor([1.0, 0.0, 2.0])  # the score, last token
    width = int(mask.sum(-1).max())
    c_mask, c_values, c_rewards = (torch.zeros(3, width, dtype=torch.float64) for _ in range(3))
    for i in range(3):
        keep = mask[i].bool()
        n = int(keep.sum())
        c_mask[i, :n], c_values[i, :n], c_rewards[i, :n] = 1.0, values[i, keep], rewards[i, keep]
    adv, ret = compute_gae_advantage_return(rewards, values, mask, gamma=0.9, lam=0.8)
    c_adv, c_ret = compute_gae_advantage_return(c_rewards, c_values, c_mask, gamma=0.9, lam=0.8)
    for i in range(3):
        keep, c_keep = mask[i].bool(), c_mask[i].bool()
        assert torch.equal(ret[i, keep], c_ret[i, c_keep])  # the recursion: bit for bit
        torch.testing.assert_close(adv[i, keep], c_adv[i, c_keep], rtol=0, atol=1e-12)  # whitened: summation order
    # the last token of turn 1 (row 0, position 1) bootstraps from position 5 (turn 2), not from the tool output
    expected = rewards[0, 1] + 0.9 * values[0, 5] - values[0, 1] + 0.9 * 0.8 * (ret[0, 5] - values[0, 5])
    torch.testing.assert_close(ret[0, 1] - values[0, 1], expected, rtol=0, atol=1e-12)


def test_registry_and_critic_helpers() -> None:
    assert set(ADV_ESTIMATORS) == {
        "gae",
        "grpo",
        "grpo_passk",
        "opo",
        "reinforce_plus_plus",
        "reinforce_plus_plus_baseline",
        "rloo",
        "rloo_vectorized",
    }
    assert CRITIC_ESTIMATORS == {"gae"}
    assert needs_critic("gae") and not needs_critic("grpo")
    with pytest.raises(ValueError, match="estimator"):
        needs_critic("ppo")


def test_missing_inputs_and_bad_arguments_raise_value_error() -> None:
    rewards, mask = _outcome([1.0, 0.0], [3, 2])
    with pytest.raises(ValueError, match="index"):
        advantages("grpo", token_level_rewards=rewards, response_mask=mask)
    with pytest.raises(ValueError, match="values"):
        advantages("gae", token_level_rewards=rewards, response_mask=mask)
    with pytest.raises(ValueError, match="grpo.*rloo"):
        advantages("gpro", token_level_rewards=rewards, response_mask=mask, index=[0, 0])
    with pytest.raises(ValueError, match="index"):
        advantages("rloo", token_level_rewards=rewards, response_mask=mask, index=[0, 0, 0])
    with pytest.raises(ValueError, match="index"):
        advantages("rloo", token_level_rewards=rewards, response_mask=mask, index=np.zeros((2, 1)))
    with pytest.raises(ValueError, match="response_mask"):
        advantages("reinforce_plus_plus", token_level_rewards=rewards, response_mask=mask[:, :2])
    with pytest.raises(ValueError, match="token_level_rewards"):
        advantages("reinforce_plus_plus", token_level_rewards=rewards[0], response_mask=mask[0])
    with pytest.raises(ValueError, match="values"):
        advantages("gae", token_level_rewards=rewards, response_mask=mask, values=rewards[:, :1])
