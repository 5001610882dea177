"""Tests for the per-token KL estimators (values, clamps, straight-through gradients, unbiasedness)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from async_rl.algorithms import KL_KINDS, kl_penalty, policy_shift_sums

LN2 = math.log(2.0)


def test_estimator_values_by_hand() -> None:
    # logprob = log .5, ref = log .25: logprob - ref = ln 2
    lp = torch.tensor([[math.log(0.5), math.log(0.25)]])
    ref = torch.tensor([[math.log(0.25), math.log(0.5)]])
    for kind in ("kl", "k1"):
        torch.testing.assert_close(kl_penalty(lp, ref, kind), torch.tensor([[LN2, -LN2]]))
    torch.testing.assert_close(kl_penalty(lp, ref, "abs"), torch.tensor([[LN2, LN2]]))
    for kind in ("mse", "k2"):
        # .5 * ln2^2 = .240227 either way round
        torch.testing.assert_close(kl_penalty(lp, ref, kind), torch.tensor([[0.5 * LN2**2] * 2]))
    for kind in ("low_var_kl", "k3"):
        # token 0: d = ref - lp = -ln2, exp(d) = .5 -> .5 + ln2 - 1 = .193147
        # token 1: d = +ln2, exp(d) = 2 -> 2 - ln2 - 1 = .306853
        torch.testing.assert_close(kl_penalty(lp, ref, kind), torch.tensor([[0.5 + LN2 - 1, 1 - LN2]]))


def test_k3_is_clamped() -> None:
    # d = ref - lp = -100 -> clamped to -20: exp(-20) + 20 - 1 ~ 19 -> clamped to 10
    out = kl_penalty(torch.tensor([[0.0]]), torch.tensor([[-100.0]]), "k3")
    assert out.item() == 10.0
    # d = +100 -> clamped to 20: exp(20) - 21 is huge -> clamped to 10
    assert kl_penalty(torch.tensor([[-100.0]]), torch.tensor([[0.0]]), "k3").item() == 10.0


@settings(max_examples=25, deadline=None)
@given(
    diffs=st.lists(st.floats(-3, 3, allow_nan=False), min_size=1, max_size=8),
    base=st.sampled_from(["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"]),
)
def test_plus_kinds_take_value_of_base_and_gradient_of_k2(diffs: list[float], base: str) -> None:
    ref = torch.zeros(1, len(diffs), dtype=torch.float64)
    lp = torch.tensor([diffs], dtype=torch.float64, requires_grad=True)
    value = kl_penalty(lp, ref, base + "+")
    torch.testing.assert_close(value.detach(), kl_penalty(lp.detach(), ref, base))
    (grad,) = torch.autograd.grad(value.sum(), lp)
    # d/dlp of .5 * (lp - ref)^2 = lp - ref
    torch.testing.assert_close(grad, lp.detach() - ref)


@settings(max_examples=15, deadline=None)
@given(
    p_raw=st.lists(st.floats(0.2, 1.0), min_size=5, max_size=5),
    q_raw=st.lists(st.floats(0.2, 1.0), min_size=5, max_size=5),
    seed=st.integers(0, 2**31 - 1),
)
def test_k1_and_k3_sample_means_approach_true_kl(p_raw: list[float], q_raw: list[float], seed: int) -> None:
    p = torch.tensor(p_raw, dtype=torch.float64)
    p = p / p.sum()
    q = torch.tensor(q_raw, dtype=torch.float64)
    q = q / q.sum()
    true_kl = float((p * (p / q).log()).sum())
    n = 20_000
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.multinomial(p, n, replacement=True, generator=gen)
    lp, ref = p.log()[tokens].unsqueeze(0), q.log()[tokens].unsqueeze(0)
    # tolerance: 6 standard errors of each estimator under p (probabilities >= .04 keep the clamps inactive)
    log_ratio = (p / q).log()
    k1_sd = math.sqrt(float((p * (log_ratio - true_kl) ** 2).sum()))
    k3_vals = q / p + log_ratio - 1
    k3_sd = math.sqrt(float((p * (k3_vals - true_kl) ** 2).sum()))
    assert abs(kl_penalty(lp, ref, "k1").mean().item() - true_kl) <= 6 * k1_sd / math.sqrt(n) + 1e-9
    assert abs(kl_penalty(lp, ref, "k3").mean().item() - true_kl) <= 6 * k3_sd / math.sqrt(n) + 1e-9


def test_unknown_kind_and_bad_shapes_raise() -> None:
    assert "k3+" in KL_KINDS and "low_var_kl" in KL_KINDS
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="kind.*k1"):
        kl_penalty(x, x, "full")
    with pytest.raises(ValueError, match="ref_logprob"):
        kl_penalty(x, x[:, :2], "k1")
    with pytest.raises(ValueError, match="logprob"):
        kl_penalty(x[0], x[0], "k1")


def test_policy_shift_sums_by_hand() -> None:
    # before -> after: token 0 from .5 to .25, token 1 from .25 to .5, token 2 masked out (a huge move that must not
    # count), row 2: one token unchanged
    before = torch.tensor([[math.log(0.5), math.log(0.25), math.log(0.9)], [math.log(0.3), 0.0, 0.0]])
    after = torch.tensor([[math.log(0.25), math.log(0.5), math.log(1e-6)], [math.log(0.3), 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    kl, moved, count = policy_shift_sums(before, after, mask)
    # k3 of KL(before || after) per token: r = after / before; r - 1 - ln r: .5 - 1 + ln2 and 2 - 1 - ln2; 0 for row 2
    assert float(kl) == pytest.approx((0.5 - 1 + LN2) + (2 - 1 - LN2), abs=1e-6)  # fp32 log-probs in
    assert float(moved) == pytest.approx(2 * LN2, abs=1e-6)
    assert float(count) == 3.0
    assert kl.dtype == torch.float64
    with pytest.raises(ValueError, match="mask"):
        policy_shift_sums(before, after, mask[:, :2])
