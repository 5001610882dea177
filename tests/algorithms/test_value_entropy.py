"""Tests for the clipped value loss and the numerically stable entropy of token distributions.

The value loss matches verl 0.9.1 ``compute_value_loss`` (``0.5 * agg_loss(max(l1, l2))``, ``dp_size=1``); the
``loss_scale_factor`` case below is the number verl returns when its ``loss_scale_factor`` is forwarded to
``agg_loss`` for ``seq-mean-token-sum-norm``.
"""

import math

import pytest
import torch

from async_rl.algorithms import entropy_from_logits, value_loss


def test_value_loss_by_hand() -> None:
    values = torch.tensor([[1.0, 1.0, 1.0]])
    returns = torch.tensor([[3.0, 0.5, 0.0]])
    vpreds = torch.tensor([[2.5, 0.8, 123.0]])  # last token is padding
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, clipfrac = value_loss(
        vpreds, returns, values, mask, cliprange_value=0.5, loss_agg_mode="token-mean", loss_scale_factor=None
    )
    # t0: vclip = clamp(2.5, .5, 1.5) = 1.5; l1 = (2.5 - 3)^2 = .25; l2 = (1.5 - 3)^2 = 2.25 -> 2.25, clipped
    # t1: vclip = clamp(.8, .5, 1.5) = .8 -> l1 = l2 = (.8 - .5)^2 = .09, not clipped
    # loss = .5 * mean(2.25, .09) = .585
    assert loss.item() == pytest.approx(0.585)
    assert clipfrac.item() == pytest.approx(0.5)
    # seq-mean-token-sum: .5 * (2.25 + .09) / 1 row = 1.17
    loss_sum, _ = value_loss(
        vpreds, returns, values, mask, cliprange_value=0.5, loss_agg_mode="seq-mean-token-sum", loss_scale_factor=None
    )
    assert loss_sum.item() == pytest.approx(1.17)
    # global token count 9 -> .5 * 2.34 / 9 = .13
    loss_g, _ = value_loss(
        vpreds,
        returns,
        values,
        mask,
        cliprange_value=0.5,
        loss_agg_mode="token-mean",
        loss_scale_factor=None,
        global_num_tokens=9,
    )
    assert loss_g.item() == pytest.approx(0.13)


def test_value_loss_forwards_loss_scale_factor() -> None:
    values = torch.tensor([[1.0, 1.0, 1.0]])
    returns = torch.tensor([[3.0, 0.5, 0.0]])
    vpreds = torch.tensor([[2.5, 0.8, 123.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    # row sum of max(l1, l2) = 2.25 + .09 = 2.34 over 1 sequence; default factor T = 3, then 10
    loss_t, _ = value_loss(
        vpreds,
        returns,
        values,
        mask,
        cliprange_value=0.5,
        loss_agg_mode="seq-mean-token-sum-norm",
        loss_scale_factor=None,
    )
    assert loss_t.item() == pytest.approx(0.5 * 2.34 / 3)
    loss_f, _ = value_loss(
        vpreds,
        returns,
        values,
        mask,
        cliprange_value=0.5,
        loss_agg_mode="seq-mean-token-sum-norm",
        loss_scale_factor=10,
    )
    assert loss_f.item() == pytest.approx(0.5 * 2.34 / 10)


def test_value_loss_gradient_is_zero_for_clipped_token() -> None:
    values = torch.tensor([[1.0, 1.0]])
    returns = torch.tensor([[3.0, 2.0]])
    vpreds = torch.tensor([[2.5, 1.2]], requires_grad=True)
    loss, _ = value_loss(
        vpreds,
        returns,
        values,
        torch.ones(1, 2),
        cliprange_value=0.5,
        loss_agg_mode="token-mean",
        loss_scale_factor=None,
    )
    loss.backward()
    assert vpreds.grad is not None
    # t0 uses the clipped branch (constant) -> 0; t1 unclipped: d(.5 * (v - 2)^2 / 2)/dv = (1.2 - 2) / 2 = -.4
    torch.testing.assert_close(vpreds.grad, torch.tensor([[0.0, -0.4]]))


def test_value_loss_bad_arguments() -> None:
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="cliprange_value"):
        value_loss(x, x, x, x, cliprange_value=-1.0, loss_agg_mode="token-mean", loss_scale_factor=None)
    with pytest.raises(ValueError, match="returns"):
        value_loss(x, x[:, :1], x, x, cliprange_value=0.2, loss_agg_mode="token-mean", loss_scale_factor=None)


def test_entropy_values() -> None:
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [0.0, math.log(3.0), -200.0, -200.0]]])
    out = entropy_from_logits(logits)
    assert out.shape == (1, 2)
    assert out[0, 0].item() == pytest.approx(math.log(4.0))  # uniform over 4
    # p ~ [.25, .75, 0, 0] (e^-200 ~ 0): -(.25 ln .25 + .75 ln .75) = .346574 + .215762 = .562335
    assert out[0, 1].item() == pytest.approx(0.25 * math.log(4) + 0.75 * math.log(4 / 3), rel=1e-6)


def test_entropy_is_stable_for_huge_logits() -> None:
    logits = torch.tensor([[[1e4, 0.0, 0.0], [5e4, 5e4, 5e4]]])
    out = entropy_from_logits(logits)
    assert torch.isfinite(out).all()
    assert out[0, 0].item() == pytest.approx(0.0, abs=1e-6)  # one-hot
    assert out[0, 1].item() == pytest.approx(math.log(3.0), rel=1e-5)  # uniform, shift-invariant


def test_entropy_rejects_1d() -> None:
    with pytest.raises(ValueError, match="logits"):
        entropy_from_logits(torch.zeros(5))
