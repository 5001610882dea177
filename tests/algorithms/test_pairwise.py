"""The Bradley-Terry loss and its gradient, derived by hand."""

from __future__ import annotations

import math

import pytest
import torch

from async_rl.algorithms import bradley_terry_loss, pair_stats


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def test_loss_and_gradient_without_margin_or_centring() -> None:
    # pairs: diffs 2 - 0 = 2 and 0 - 1 = -1; loss = (-log s(2) - log s(-1)) / 2
    c = torch.tensor([2.0, 0.0], dtype=torch.float64, requires_grad=True)
    r = torch.tensor([0.0, 1.0], dtype=torch.float64, requires_grad=True)
    loss = bradley_terry_loss(c, r, None, center_rewards_coefficient=0.0, global_num_pairs=2)
    expected = (-math.log(_sigmoid(2.0)) - math.log(_sigmoid(-1.0))) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    loss.backward()
    # d/dr_c [-log s(d)] = -(1 - s(d)) = -s(-d); d/dr_r = +s(-d); each over the 2 pairs
    assert c.grad.tolist() == pytest.approx([-_sigmoid(-2.0) / 2, -_sigmoid(1.0) / 2], abs=1e-12)
    assert r.grad.tolist() == pytest.approx([_sigmoid(-2.0) / 2, _sigmoid(1.0) / 2], abs=1e-12)


def test_margin_shifts_the_difference() -> None:
    # diff 1 - 0 - margin 1 = 0: loss log 2, gradient -1/2 on chosen, +1/2 on rejected (one pair)
    c = torch.tensor([1.0], dtype=torch.float64, requires_grad=True)
    r = torch.tensor([0.0], dtype=torch.float64, requires_grad=True)
    loss = bradley_terry_loss(c, r, torch.tensor([1.0]), center_rewards_coefficient=0.0, global_num_pairs=1)
    assert loss.item() == pytest.approx(math.log(2.0), abs=1e-12)
    loss.backward()
    assert (c.grad.item(), r.grad.item()) == pytest.approx((-0.5, 0.5), abs=1e-12)


def test_centring_term_and_its_gradient() -> None:
    # one pair r_c = 1, r_r = 1 (diff 0: log 2), c = 0.5: + 0.5 * (1 + 1)^2 = 2; loss = log 2 + 2
    # gradient: chosen -1/2 + 0.5 * 2 * 2 = 1.5, rejected +1/2 + 2 = 2.5
    c = torch.tensor([1.0], dtype=torch.float64, requires_grad=True)
    r = torch.tensor([1.0], dtype=torch.float64, requires_grad=True)
    loss = bradley_terry_loss(c, r, None, center_rewards_coefficient=0.5, global_num_pairs=1)
    assert loss.item() == pytest.approx(math.log(2.0) + 2.0, abs=1e-12)
    loss.backward()
    assert (c.grad.item(), r.grad.item()) == pytest.approx((1.5, 2.5), abs=1e-12)


def test_micro_batch_losses_sum_to_the_whole_batch_loss() -> None:
    gen = torch.Generator().manual_seed(0)
    c, r, m = (torch.randn(6, generator=gen, dtype=torch.float64) for _ in range(3))
    kw = {"center_rewards_coefficient": 0.1, "global_num_pairs": 6}
    whole = bradley_terry_loss(c, r, m, **kw)
    parts = sum(bradley_terry_loss(c[i : i + 2], r[i : i + 2], m[i : i + 2], **kw) for i in (0, 2, 4))
    assert float(parts) == pytest.approx(float(whole), abs=1e-12)
    # the mean of the per-pair formula
    per_pair = -torch.nn.functional.logsigmoid(c - r - m) + 0.1 * (c + r) ** 2
    assert float(whole) == pytest.approx(float(per_pair.mean()), abs=1e-12)


def test_pair_stats_count_ties_as_half() -> None:
    s = pair_stats(torch.tensor([2.0, 0.0, 1.0]), torch.tensor([1.0, 3.0, 1.0]))
    assert {k: float(v) for k, v in s.items()} == {
        "correct": 1.5,
        "margin": 1.0 - 3.0 + 0.0,
        "reward": 8.0,
        "reward_sq": 4 + 0 + 1 + 1 + 9 + 1,
        "pairs": 3.0,
    }


def test_bad_shapes_and_counts_raise() -> None:
    kw = {"center_rewards_coefficient": 0.0, "global_num_pairs": 1}
    with pytest.raises(ValueError, match="must both be"):
        bradley_terry_loss(torch.zeros(2), torch.zeros(3), None, **kw)
    with pytest.raises(ValueError, match="margin"):
        bradley_terry_loss(torch.zeros(2), torch.zeros(2), torch.zeros(3), **kw)
    with pytest.raises(ValueError, match="global_num_pairs"):
        bradley_terry_loss(torch.zeros(2), torch.zeros(2), None, center_rewards_coefficient=0.0, global_num_pairs=0)
