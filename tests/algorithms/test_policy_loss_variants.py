"""GSPO, CISPO and REINFORCE losses, with hand-derived values and gradients.

What was compared against verl 0.9.1 (``verl/trainer/ppo/core_algos.py``) and how:

- ``gspo`` <-> ``compute_policy_loss_gspo``: sequence ratio ``exp(masked mean of log_prob - old)`` (length clamped to
  >= 1), combined token log-ratio ``log_prob - sg(log_prob) + sg(log s_i)`` clamped at max 10, PPO clip without dual
  clip, ``pg_clipfrac_lower = 0``. The values and the straight-through gradient ``-A_t * s_i / N`` below were derived
  by hand from that definition.
- ``cispo`` <-> ``compute_policy_loss_cispo``: ``-sg(clamp(exp(clamp(lr, -20, 20)), 1-low, 1+high)) * A * log_prob``;
  ``pg_clipfrac`` counts ``ratio != clipped ratio``.
- ``reinforce_loss`` <-> ``compute_policy_loss_reinforce`` (bypass mode, ``loss_type=reinforce``):
  ``agg(-A * log_prob * w)``, ``ppo_kl = masked mean(rollout_log_prob - log_prob)``.
- GMPO with IS weights: see ``test_policy_loss.py``, next to the other GMPO tests.

``tools/verl_crosscheck.py`` runs the same functions of both libraries on random inputs (max abs difference ~1e-7).
"""

import math

import pytest
import torch
from _loss_testlib import ppo_loss

from async_rl.algorithms import reinforce_loss


def _gspo_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    # row 0: log-ratios [.2, 0] -> mean .1 -> s0 = e^.1, inside [.8, 1.2] for both tokens (A = +1, +1)
    # row 1: log-ratios [.6, .4] -> mean .5 -> s1 = e^.5 = 1.6487; A = +1 (clipped to 1.2), A = -1 (unclipped)
    old = torch.zeros(2, 3)
    log_prob = torch.tensor([[0.2, 0.0, 40.0], [0.6, 0.4, -40.0]])  # column 2 is padding
    adv = torch.tensor([[1.0, 1.0, 9.0], [1.0, -1.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    return old, log_prob, adv, mask


def test_gspo_values_and_metrics() -> None:
    old, log_prob, adv, mask = _gspo_case()
    loss, metrics = ppo_loss(old, log_prob, adv, mask, loss_mode="gspo")
    s0, s1 = math.exp(0.1), math.exp(0.5)
    # tokens: -s0, -s0, max(-s1, -1.2) = -1.2, max(s1, 1.2) = s1; token-mean over 4
    assert loss.item() == pytest.approx((-2 * s0 - 1.2 + s1) / 4, rel=1e-6)  # -0.440405
    assert metrics["pg_clipfrac"].item() == pytest.approx(0.25)  # only row 1, token 0
    assert metrics["pg_clipfrac_lower"].item() == 0.0
    assert metrics["ppo_kl"].item() == pytest.approx(-0.3)  # -(.2 + 0 + .6 + .4) / 4
    # a per-token ratio would have clipped row 0 token 0 (e^.2 = 1.2214 > 1.2); the sequence ratio does not
    seq_mean, _ = ppo_loss(old, log_prob, adv, mask, loss_mode="gspo", loss_agg_mode="seq-mean-token-mean")
    assert seq_mean.item() == pytest.approx((-s0 + (-1.2 + s1) / 2) / 2, rel=1e-6)


def test_gspo_straight_through_gradient() -> None:
    old, log_prob, adv, mask = _gspo_case()
    log_prob.requires_grad_(True)
    loss, _ = ppo_loss(old, log_prob, adv, mask, loss_mode="gspo")
    loss.backward()
    assert log_prob.grad is not None
    s0, s1 = math.exp(0.1), math.exp(0.5)
    # r_t = exp(lp_t - sg(lp_t) + sg(log s_i)): value s_i, d r_t / d lp_t = s_i, so an unclipped token gets
    # d(-A_t r_t)/d lp_t / N = -A_t s_i / 4; the clipped token (row 1, token 0) and padding get 0.
    expected = torch.tensor([[-s0 / 4, -s0 / 4, 0.0], [0.0, s1 / 4, 0.0]])
    torch.testing.assert_close(log_prob.grad, expected)


def test_gspo_log_ratio_clamped_at_ten() -> None:
    lp = torch.tensor([[15.0]], requires_grad=True)
    loss, _ = ppo_loss(torch.zeros(1, 1), lp, torch.tensor([[-1.0]]), torch.ones(1, 1), loss_mode="gspo")
    # max(-A * e^10, -A * 1.2) = e^10 = 22026.47; the clamp blocks the gradient
    assert loss.item() == pytest.approx(math.exp(10.0), rel=1e-6)
    loss.backward()
    assert lp.grad is not None and lp.grad.item() == 0.0


def test_cispo_values_gradient_and_clipfrac() -> None:
    old = torch.full((1, 4), -1.0)
    log_prob = torch.tensor([[-0.5, -1.1, -1.0, 7.0]], requires_grad=True)  # last token is padding
    adv = torch.tensor([[1.0, -2.0, 0.5, 3.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    loss, metrics = ppo_loss(old, log_prob, adv, mask, loss_mode="cispo", clip_ratio_low=0.2, clip_ratio_high=0.28)
    # ratios e^.5 = 1.6487 -> clipped to 1.28; e^-.1 = .904837 (inside); e^0 = 1
    c = [1.28, math.exp(-0.1), 1.0]
    # l = -c * A * lp: .64, -.904837 * 2 * 1.1 = -1.990642, .5
    expected = (c[0] * 0.5 - c[1] * 2.0 * 1.1 + c[2] * 0.5) / 3
    assert loss.item() == pytest.approx(expected, rel=1e-6)  # -0.283547
    assert metrics["pg_clipfrac"].item() == pytest.approx(1 / 3)
    assert metrics["pg_clipfrac_lower"].item() == 0.0
    assert metrics["ppo_kl"].item() == pytest.approx(-(0.5 - 0.1 + 0.0) / 3)
    loss.backward()
    assert log_prob.grad is not None
    # the clipped ratio is a constant weight: every valid token (the clipped one too) gets -c_t * A_t / 3
    grad = torch.tensor([[-c[0] * 1.0 / 3, c[1] * 2.0 / 3, -c[2] * 0.5 / 3, 0.0]])
    torch.testing.assert_close(log_prob.grad, grad)


def test_reinforce_loss_values_gradient_and_kl() -> None:
    log_prob = torch.tensor([[-1.0, -2.0, 5.0]], requires_grad=True)  # last token is padding
    adv = torch.tensor([[2.0, -1.0, 4.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    w = torch.tensor([[0.5, 2.0, 0.0]])
    rollout = torch.tensor([[-1.5, -2.5, 0.0]])
    # -A * lp * w: -2 * -1 * .5 = 1; -(-1) * -2 * 2 = -4
    loss, metrics = reinforce_loss(
        log_prob, adv, mask, is_weights=w, rollout_log_prob=rollout, loss_agg_mode="token-mean", loss_scale_factor=None
    )
    assert loss.item() == pytest.approx(-1.5)  # token-mean
    assert metrics["ppo_kl"].item() == pytest.approx(-0.5)  # mean(rollout - lp) = mean(-.5, -.5)
    loss.backward()
    assert log_prob.grad is not None
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-0.5, 1.0, 0.0]]))  # -A * w / 2
    total, _ = reinforce_loss(log_prob, adv, mask, is_weights=w, loss_agg_mode="token-sum", loss_scale_factor=None)
    assert total.item() == pytest.approx(-3.0)
    plain, no_metrics = reinforce_loss(log_prob, adv, mask, loss_agg_mode="seq-mean-token-sum", loss_scale_factor=None)
    assert plain.item() == pytest.approx(2.0 - 2.0)  # -A * lp = 2, -2 -> sum 0 over 1 sequence
    assert no_metrics == {}
    with pytest.raises(ValueError, match="is_weights"):
        reinforce_loss(log_prob, adv, mask, is_weights=w[:, :2], loss_agg_mode="token-mean", loss_scale_factor=None)
    with pytest.raises(ValueError, match="loss_agg_mode"):
        reinforce_loss(log_prob, adv, mask, loss_agg_mode="mean", loss_scale_factor=None)


def test_is_weights_shape_and_loss_scale_factor() -> None:
    old = torch.zeros(2, 3)
    log_prob = torch.tensor([[0.1, -0.1, 0.0], [0.05, 0.0, 0.0]])
    adv = torch.tensor([[1.0, -1.0, 0.0], [2.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    with pytest.raises(ValueError, match="is_weights"):
        ppo_loss(old, log_prob, adv, mask, is_weights=torch.ones(1, 3))
    # loss_scale_factor reaches agg_loss: with ratio 1 every token loss is -A, row sums [0, -3] over 2 rows / 10
    same = old.clone()
    out, _ = ppo_loss(same, same, adv, mask, loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=10.0)
    assert out.item() == pytest.approx(-3.0 / 2 / 10)
    for mode in ("gspo", "cispo"):
        out, _ = ppo_loss(
            same, same, adv, mask, loss_mode=mode, loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=10.0
        )
        # gspo: ratio 1 -> -A; cispo: -1 * A * log_prob = 0 with log_prob = 0
        assert out.item() == pytest.approx(-0.15 if mode == "gspo" else 0.0)
    with pytest.raises(ValueError, match="loss_scale_factor"):
        ppo_loss(old, log_prob, adv, mask, loss_scale_factor=-1.0)
