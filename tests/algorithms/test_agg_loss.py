"""Tests for loss aggregation, including global-count normalisation for micro-batching.

Compared against verl 0.9.1 ``verl.trainer.ppo.core_algos.agg_loss`` (with ``dp_size=1``): the hand-computed values
below are the numbers verl returns for the same inputs -- ``seq-mean-*`` divide by the number of *non-empty* rows
(verl's ``seq_mask.sum()`` when ``global_batch_size`` is None), ``token-sum`` is the plain masked sum, and Dr. GRPO
(``seq-mean-token-sum-norm``) is ``sum of row sums / rows / loss_scale_factor`` with ``loss_scale_factor`` defaulting
to ``loss_mask.shape[-1]``. With global counts verl also multiplies by ``dp_size``; ours never does (the learner
multiplies by the world size), so the values here are verl's at ``dp_size=1``. ``tools/verl_crosscheck.py`` compares
every mode against verl on random inputs.
"""

from functools import partial

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from async_rl.algorithms import LOSS_AGG_MODES, agg_loss

LOSS = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 5.0, 6.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])

agg = partial(agg_loss, loss_scale_factor=None)  # no Dr. GRPO constant: seq-mean-token-sum-norm divides by T


def test_local_modes_by_hand() -> None:
    # valid: row 0 -> 1, 2 (sum 3, mean 1.5); row 1 -> 4 (sum 4, mean 4)
    assert agg(LOSS, MASK, "token-mean").item() == pytest.approx(7 / 3)  # (1 + 2 + 4) / 3
    assert agg(LOSS, MASK, "seq-mean-token-sum").item() == pytest.approx(3.5)  # (3 + 4) / 2
    assert agg(LOSS, MASK, "seq-mean-token-mean").item() == pytest.approx(2.75)  # (1.5 + 4) / 2
    assert agg(LOSS, MASK, "seq-mean-token-sum-norm").item() == pytest.approx(0.875)  # (3 + 4) / 2 rows / T=4
    assert agg(LOSS, MASK, "token-sum").item() == pytest.approx(7.0)  # 1 + 2 + 4


def test_global_counts_replace_local_denominators() -> None:
    assert agg(LOSS, MASK, "token-mean", global_num_tokens=7).item() == pytest.approx(1.0)  # 7 / 7
    assert agg(LOSS, MASK, "seq-mean-token-sum", global_num_seqs=4).item() == pytest.approx(1.75)  # 7 / 4
    assert agg(LOSS, MASK, "seq-mean-token-mean", global_num_seqs=4).item() == pytest.approx(1.375)  # 5.5 / 4
    # Dr. GRPO: row sums / global sequences / T (the token count is not read)
    out = agg(LOSS, MASK, "seq-mean-token-sum-norm", global_num_tokens=100, global_num_seqs=100)
    assert out.item() == pytest.approx(7 / 100 / 4)
    # token-sum reads neither count (the learner multiplies by the world size; verl's dp_size factor is not applied)
    assert agg(LOSS, MASK, "token-sum", global_num_tokens=100, global_num_seqs=100).item() == pytest.approx(7.0)
    # tensor counts are accepted as-is
    assert agg(LOSS, MASK, "token-mean", global_num_tokens=torch.tensor(14.0)).item() == pytest.approx(0.5)


def test_empty_row_and_non_finite_padding() -> None:
    loss = torch.tensor([[1.0, 3.0], [5.0, float("nan")]])
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    # per-row means [2, 0 (empty row, not NaN)]; the empty row is not a sequence: 2 / 1 non-empty row
    assert agg(loss, mask, "seq-mean-token-mean").item() == pytest.approx(2.0)
    assert agg(loss, mask, "seq-mean-token-sum").item() == pytest.approx(4.0)  # (1 + 3) / 1
    assert agg(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx(2.0)  # 4 / 1 / T=2
    assert agg(loss, mask, "token-mean").item() == pytest.approx(2.0)
    assert agg(loss, mask, "token-sum").item() == pytest.approx(4.0)


def test_all_rows_empty_gives_zero_not_nan() -> None:
    loss = torch.tensor([[1.0, float("nan")], [2.0, 3.0]])
    mask = torch.zeros(2, 2)
    for mode in sorted(LOSS_AGG_MODES):
        assert agg(loss, mask, mode).item() == 0.0, mode


def test_dr_grpo_loss_scale_factor_and_mini_batch_size() -> None:
    # 512 rows of 4 valid tokens, each token loss 1, padded to T = 8: row sums 4.
    loss = torch.ones(512, 8)
    mask = torch.zeros(512, 8)
    mask[:, :4] = 1.0
    # verl: 512 * 4 / 512 rows / 8 = 0.5 (the pre-0.9.1 behaviour here was 512 * 4 / 8 = 256, 512x larger)
    assert agg(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx(0.5)
    # a constant loss_scale_factor replaces T
    out = agg_loss(loss, mask, "seq-mean-token-sum-norm", loss_scale_factor=1024.0)
    assert out.item() == pytest.approx(512 * 4 / 512 / 1024)
    # with global counts: 2048 / 1024 sequences / 16
    out = agg_loss(loss, mask, "seq-mean-token-sum-norm", global_num_seqs=1024, loss_scale_factor=16)
    assert out.item() == pytest.approx(2048 / 1024 / 16)
    # the factor is only read by Dr. GRPO
    assert agg_loss(loss, mask, "seq-mean-token-sum", loss_scale_factor=16).item() == pytest.approx(4.0)


def test_token_sum_gradient_is_the_mask() -> None:
    loss = LOSS.clone().requires_grad_(True)
    agg(loss, MASK, "token-sum").backward()
    assert loss.grad is not None
    torch.testing.assert_close(loss.grad, MASK)


def test_gradient_only_reaches_valid_tokens() -> None:
    loss = LOSS.clone().requires_grad_(True)
    agg(loss, MASK, "token-mean").backward()
    assert loss.grad is not None
    torch.testing.assert_close(loss.grad, MASK / 3)


@settings(max_examples=30, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 5), min_size=1, max_size=6),
    data=st.data(),
)
def test_token_mean_equals_seq_mean_token_mean_for_equal_lengths(lengths: list[int], data: st.DataObject) -> None:
    n = lengths[0]
    b, t = len(lengths), 6
    values = data.draw(st.lists(st.floats(-10, 10, allow_nan=False), min_size=b * t, max_size=b * t))
    loss = torch.tensor(values, dtype=torch.float64).view(b, t)
    mask = torch.zeros(b, t, dtype=torch.float64)
    mask[:, :n] = 1.0
    a = agg(loss, mask, "token-mean")
    s = agg(loss, mask, "seq-mean-token-mean")
    assert a.item() == pytest.approx(s.item(), rel=1e-9, abs=1e-9)


@settings(max_examples=40, deadline=None)
@given(
    b=st.integers(1, 8),
    t=st.integers(1, 6),
    mode=st.sampled_from(sorted(LOSS_AGG_MODES)),
    data=st.data(),
)
def test_micro_batches_with_global_counts_sum_to_full_batch(b: int, t: int, mode: str, data: st.DataObject) -> None:
    values = data.draw(st.lists(st.floats(-10, 10, allow_nan=False), min_size=b * t, max_size=b * t))
    bits = data.draw(st.lists(st.booleans(), min_size=b * t, max_size=b * t))
    loss = torch.tensor(values, dtype=torch.float64).view(b, t)
    mask = torch.tensor(bits, dtype=torch.float64).view(b, t)
    mask[0, 0] = 1.0  # at least one valid token in the mini-batch
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, b - 1)), max_size=3))) if b > 1 else []
    bounds = [0, *[c for c in cuts if 0 < c < b], b]
    full = agg(loss, mask, mode)
    seqs = float((mask.sum(dim=-1) > 0).sum())  # non-empty rows, as the learner counts them
    total = torch.zeros((), dtype=torch.float64)
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        part = agg(loss[lo:hi], mask[lo:hi], mode, global_num_tokens=float(mask.sum()), global_num_seqs=seqs)
        total = total + part
    assert total.item() == pytest.approx(full.item(), rel=1e-9, abs=1e-9)


def test_bad_arguments_raise_value_error() -> None:
    with pytest.raises(ValueError, match="loss_agg_mode.*token-mean"):
        agg(LOSS, MASK, "mean")
    with pytest.raises(ValueError, match="loss_mask"):
        agg(LOSS, MASK[:, :3], "token-mean")
    with pytest.raises(ValueError, match="loss_mat"):
        agg(LOSS[0], MASK[0], "token-mean")
    with pytest.raises(ValueError, match="global_num_tokens"):
        agg(LOSS, MASK, "token-mean", global_num_tokens=0)
    with pytest.raises(ValueError, match="global_num_seqs"):
        agg(LOSS, MASK, "seq-mean-token-sum", global_num_seqs=-2)
    with pytest.raises(ValueError, match="loss_scale_factor"):
        agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", loss_scale_factor=0)
    with pytest.raises(ValueError, match="loss_scale_factor"):
        agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", loss_scale_factor=True)
