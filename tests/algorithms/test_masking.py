"""Tests for the masked reductions (mean, variance, whitening) that every estimator and loss builds on."""

import math

import pytest
import torch

from async_rl.algorithms import masked_mean, masked_sum, masked_var, masked_whiten

X = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


def test_masked_mean_all_and_per_row() -> None:
    # valid values 1, 2, 4 -> 7 / 3
    assert masked_mean(X, MASK).item() == pytest.approx(7 / 3)
    # row 0: (1 + 2) / 2 = 1.5; row 1: 4 / 1 = 4
    torch.testing.assert_close(masked_mean(X, MASK, dim=-1), torch.tensor([1.5, 4.0]))
    assert masked_sum(X, MASK).item() == pytest.approx(7.0)


def test_masked_mean_accepts_bool_mask_and_ignores_nan_padding() -> None:
    x = X.clone()
    x[0, 2] = float("nan")
    x[1, 1] = float("inf")
    assert masked_mean(x, MASK.bool()).item() == pytest.approx(7 / 3)


def test_masked_mean_empty_mask_is_zero_not_nan() -> None:
    assert masked_mean(X, torch.zeros_like(X)).item() == 0.0


def test_masked_var_biased_and_unbiased() -> None:
    # values 1, 2, 4: mean 7/3, squared deviations 16/9 + 1/9 + 25/9 = 42/9 = 14/3
    assert masked_var(X, MASK, unbiased=False).item() == pytest.approx(14 / 9)  # 14/3 / 3
    assert masked_var(X, MASK).item() == pytest.approx(7 / 3)  # 14/3 / 2


def test_masked_var_unbiased_needs_two_valid_positions() -> None:
    one = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    with pytest.raises(ValueError, match="mask"):
        masked_var(X, one)
    with pytest.raises(ValueError, match="mask"):
        masked_var(X, torch.zeros_like(X))


def test_masked_whiten_values() -> None:
    # mean 7/3, unbiased var 7/3 -> value 4 maps to (4 - 7/3) / sqrt(7/3) = (5/3) / 1.527525 = 1.091089
    out = masked_whiten(X, MASK)
    assert out[1, 0].item() == pytest.approx((5 / 3) / math.sqrt(7 / 3), rel=1e-5)
    valid = out[MASK.bool()]
    assert valid.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert valid.var().item() == pytest.approx(1.0, rel=1e-5)
    # shift_mean=False adds the mean back: 1.091089 + 7/3
    kept = masked_whiten(X, MASK, shift_mean=False)
    assert kept[1, 0].item() == pytest.approx((5 / 3) / math.sqrt(7 / 3) + 7 / 3, rel=1e-5)


def test_mask_shape_mismatch_names_mask() -> None:
    with pytest.raises(ValueError, match="mask"):
        masked_mean(X, MASK[:, :2])
    with pytest.raises(ValueError, match="mask"):
        masked_whiten(X, MASK[0])
