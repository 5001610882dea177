"""Tests for the off-policy IS correction: truncation, masking, levels, exactness when on-policy, diagnostics."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from async_rl.algorithms import compute_is_weights, policy_loss

LN2 = math.log(2.0)


def _on_ratio_one(
    rollout: torch.Tensor,
    mask: torch.Tensor,
    *,
    tis_cap: float,
    is_level: str = "token",
    is_mode: str = "truncate",
    is_threshold_lower: float | None = None,
) -> tuple[float, dict[str, float]]:
    """Policy loss with log_prob == old == 0 (ratio 1) and A = +1, so every token's loss is -w."""
    zeros = torch.zeros_like(rollout)
    loss, metrics = policy_loss(
        zeros,
        zeros,
        torch.ones_like(rollout),
        mask,
        rollout_log_prob=rollout,
        tis_cap=tis_cap,
        is_level=is_level,
        is_mode=is_mode,
        is_threshold_lower=is_threshold_lower,
    )
    return loss.item(), {k: v.item() for k, v in metrics.items()}


def test_token_level_truncation() -> None:
    # old - rollout = [ln 3, ln .5] -> w = [3, .5]; cap 2 -> [2, .5]
    rollout = torch.tensor([[-math.log(3.0), -math.log(0.5)]])
    loss, m = _on_ratio_one(rollout, torch.ones(1, 2), tis_cap=2.0)
    assert loss == pytest.approx(-1.25)  # mean(-2, -.5)
    assert m["is_frac_truncated"] == pytest.approx(0.5)
    assert m["is_weight_mean"] == pytest.approx(1.25)
    assert m["is_weight_max"] == pytest.approx(2.0)
    assert m["is_weight_min"] == pytest.approx(0.5)
    assert m["is_ess"] == pytest.approx(2.5**2 / (2 * (4 + 0.25)))  # = .735294


def test_token_level_masking_keeps_weight_of_kept_tokens() -> None:
    rollout = torch.tensor([[-math.log(3.0), -math.log(0.5)]])
    # default lower = 1/cap = .5: w=3 rejected (0), w=.5 kept with its weight .5 -> mean(0, -.5)
    loss, m = _on_ratio_one(rollout, torch.ones(1, 2), tis_cap=2.0, is_mode="mask")
    assert loss == pytest.approx(-0.25)
    assert m["is_frac_masked"] == pytest.approx(0.5)
    # lower .6 rejects .5 too -> every weight 0 -> loss 0 and ESS 0
    loss, m = _on_ratio_one(rollout, torch.ones(1, 2), tis_cap=2.0, is_mode="mask", is_threshold_lower=0.6)
    assert loss == 0.0
    assert m["is_ess"] == 0.0


def test_sequence_and_geometric_levels() -> None:
    # valid log-ratios [ln2, ln2]; padding holds garbage that must be ignored
    rollout = torch.tensor([[-LN2, -LN2, 40.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, _ = _on_ratio_one(rollout, mask, tis_cap=5.0, is_level="sequence")
    assert loss == pytest.approx(-4.0)  # w = exp(2 ln2) = 4 < cap
    loss, m = _on_ratio_one(rollout, mask, tis_cap=3.0, is_level="sequence")
    assert loss == pytest.approx(-3.0)  # truncated to 3
    assert m["is_frac_truncated"] == pytest.approx(1.0)
    loss, _ = _on_ratio_one(rollout, mask, tis_cap=3.0, is_level="geometric")
    assert loss == pytest.approx(-2.0)  # exp(mean = ln2) = 2


def test_sequence_level_masking_rejects_whole_rows() -> None:
    # row 0: w = 4 > cap 3 -> rejected; row 1: log-ratios [ln1.5, -ln1.5] -> w = 1 kept
    rollout = torch.tensor([[-LN2, -LN2], [-math.log(1.5), math.log(1.5)]])
    loss, m = _on_ratio_one(rollout, torch.ones(2, 2), tis_cap=3.0, is_level="sequence", is_mode="mask")
    assert loss == pytest.approx(-0.5)  # (0 + 0 - 1 - 1) / 4 tokens (rejected tokens stay in the denominator)
    assert m["is_frac_masked"] == pytest.approx(0.5)


def test_weights_are_detached_and_scale_the_gradient() -> None:
    old = torch.zeros(1, 2)
    rollout = torch.tensor([[-LN2, 0.0]], requires_grad=True)  # w = [2, 1]
    log_prob = torch.zeros(1, 2, requires_grad=True)
    loss, _ = policy_loss(old, log_prob, torch.ones(1, 2), torch.ones(1, 2), rollout_log_prob=rollout, tis_cap=5.0)
    loss.backward()
    assert rollout.grad is None
    assert log_prob.grad is not None
    # d(-A * w * ratio)/dlr at ratio 1, / 2 tokens: [-2/2, -1/2]
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-1.0, -0.5]]))


def test_no_weighting_without_cap_or_rollout() -> None:
    old = torch.zeros(1, 2)
    lp = torch.tensor([[0.1, -0.1]])
    adv, mask = torch.tensor([[1.0, -1.0]]), torch.ones(1, 2)
    plain, plain_m = policy_loss(old, lp, adv, mask)
    no_cap, m = policy_loss(old, lp, adv, mask, rollout_log_prob=torch.full((1, 2), -3.0))
    assert torch.equal(plain, no_cap)
    assert set(m) == set(plain_m) == {"pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"}


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    loss_mode=st.sampled_from(["vanilla", "geo_mean"]),
    is_level=st.sampled_from(["token", "sequence", "geometric"]),
    is_mode=st.sampled_from(["truncate", "mask"]),
    agg=st.sampled_from(["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]),
    cap=st.floats(1.0, 10.0),
)
def test_on_policy_rollout_equals_plain_ppo_exactly(
    seed: int, loss_mode: str, is_level: str, is_mode: str, agg: str, cap: float
) -> None:
    gen = torch.Generator().manual_seed(seed)
    old = torch.randn(3, 4, generator=gen)
    lp = old + 0.5 * torch.randn(3, 4, generator=gen)
    adv = torch.randn(3, 4, generator=gen)
    mask = (torch.rand(3, 4, generator=gen) > 0.3).float()
    plain, plain_m = policy_loss(old, lp, adv, mask, loss_mode=loss_mode, loss_agg_mode=agg)
    corrected, m = policy_loss(
        old,
        lp,
        adv,
        mask,
        loss_mode=loss_mode,
        loss_agg_mode=agg,
        rollout_log_prob=old.clone(),
        tis_cap=cap,
        is_level=is_level,
        is_mode=is_mode,
    )
    assert torch.equal(plain, corrected)  # bitwise
    for key, value in plain_m.items():
        assert torch.equal(value, m[key])
    if mask.sum() > 0:
        assert m["is_weight_min"].item() == m["is_weight_max"].item() == 1.0
        assert m["is_ess"].item() == 1.0


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), is_level=st.sampled_from(["token", "sequence", "geometric"]))
def test_ess_is_in_unit_interval(seed: int, is_level: str) -> None:
    gen = torch.Generator().manual_seed(seed)
    old = torch.randn(4, 5, generator=gen)
    rollout = old + torch.randn(4, 5, generator=gen)
    mask = (torch.rand(4, 5, generator=gen) > 0.2).float()
    mask[0, 0] = 1.0
    weights, m = compute_is_weights(old, rollout, mask, tis_cap=4.0, is_level=is_level)
    assert 0.0 < m["is_ess"].item() <= 1.0
    assert weights.max().item() <= 4.0
    assert not weights.requires_grad


def test_bad_is_arguments_raise_value_error() -> None:
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="tis_cap"):
        policy_loss(x, x, x, x + 1, rollout_log_prob=x, tis_cap=0.5)
    with pytest.raises(ValueError, match="is_level.*geometric"):
        policy_loss(x, x, x, x + 1, rollout_log_prob=x, tis_cap=2.0, is_level="seq")
    with pytest.raises(ValueError, match="is_mode.*truncate"):
        policy_loss(x, x, x, x + 1, rollout_log_prob=x, tis_cap=2.0, is_mode="clip")
    with pytest.raises(ValueError, match="is_threshold_lower"):
        policy_loss(x, x, x, x + 1, rollout_log_prob=x, tis_cap=2.0, is_mode="mask", is_threshold_lower=1.5)
