"""Tests for the KL-coefficient controllers and the in-reward KL penalty."""

import pytest
import torch

from async_rl.algorithms import AdaptiveKLController, FixedKLController, apply_kl_in_reward


def test_fixed_controller_never_changes() -> None:
    ctrl = FixedKLController(0.1)
    ctrl.update(current_kl=5.0, n_steps=100)
    assert ctrl.value == 0.1


def test_adaptive_controller_steps() -> None:
    ctrl = AdaptiveKLController(init_kl_coef=0.2, target_kl=0.1, horizon=1000)
    # error = clip(.15/.1 - 1 = .5, -.2, .2) = .2; mult = 1 + .2 * 100 / 1000 = 1.02
    ctrl.update(current_kl=0.15, n_steps=100)
    assert ctrl.value == pytest.approx(0.204)
    # error = .09/.1 - 1 = -.1; mult = 1 - .1 * 100 / 1000 = .99
    ctrl.update(current_kl=0.09, n_steps=100)
    assert ctrl.value == pytest.approx(0.204 * 0.99)


def test_apply_kl_in_reward_values_and_controller_update() -> None:
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    ref = torch.zeros(2, 3)
    logprob = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.6, 9.0]])  # 9.0 is padding
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    ctrl = AdaptiveKLController(init_kl_coef=0.5, target_kl=0.25, horizon=10)
    rewards, metrics = apply_kl_in_reward(scores, logprob, ref, mask, ctrl, "k1")
    # beta = .5: row 0 = [0 - .05, 0 - .1, 1 - .15]; row 1 = [0 - .2, 2 - .3, 0 (padding untouched)]
    torch.testing.assert_close(rewards, torch.tensor([[-0.05, -0.1, 0.85], [-0.2, 1.7, 0.0]]))
    # row means .2 and .5 -> current_kl .35
    assert metrics["reward_kl_penalty"] == pytest.approx(0.35)
    assert metrics["reward_kl_penalty_coeff"] == 0.5  # coefficient used, before the update
    # error = clip(.35/.25 - 1 = .4) = .2; n_steps = B = 2; mult = 1 + .2 * 2 / 10 = 1.04
    assert ctrl.value == pytest.approx(0.52)


def test_controller_and_reward_argument_errors() -> None:
    with pytest.raises(ValueError, match="target_kl"):
        AdaptiveKLController(init_kl_coef=0.1, target_kl=0.0, horizon=10)
    with pytest.raises(ValueError, match="horizon"):
        AdaptiveKLController(init_kl_coef=0.1, target_kl=0.1, horizon=0)
    with pytest.raises(ValueError, match="kl_coef"):
        FixedKLController(-1.0)
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="response_mask"):
        apply_kl_in_reward(x, x, x, x[:, :2], FixedKLController(0.1), "k1")
    with pytest.raises(ValueError, match="kind"):
        apply_kl_in_reward(x, x, x, x, FixedKLController(0.1), "k9")
