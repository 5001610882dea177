"""Tests for the PPO (vanilla, dual-clip) and GMPO (geo_mean) policy losses with hand-derived values.

Compared against verl 0.9.1 ``compute_policy_loss_vanilla`` / ``compute_policy_loss_geo_mean`` (``ActorConfig`` with
``clip_ratio=0.2``, ``clip_ratio_c=3``, empty ``global_batch_info``): the expected numbers below are what verl returns
for the same tensors. GMPO with IS weights <-> ``compute_policy_loss_geo_mean``: the sequence weight
``exp(sum_t log(w_t + 1e-10) * m_t / (n + 1e-8))`` (a geometric mean) and ``torch.mean`` over all B rows when no
global sequence count is given. ``tools/verl_crosscheck.py`` runs both libraries on random inputs.

IS weights reach every loss precomputed (``is_weights``, from ``rollout_is_weights``): they scale each token's loss
and gradient, are detached, leave the denominators alone, and on-policy (all weights 1) change nothing, bitwise.
"""

import math

import pytest
import torch
from _loss_testlib import ppo_loss
from hypothesis import given, settings
from hypothesis import strategies as st

from async_rl.algorithms import LOSS_AGG_MODES, POLICY_LOSSES, ROLLOUT_IS_LEVELS, rollout_is_weights

E = math.e
LN2 = math.log(2.0)


def _vanilla_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    # 2 rows x 3 tokens, last column is padding with garbage; log-ratios (log_prob - old) per valid token:
    #   t1: A=+1, lr=1 (ratio e)   t2: A=-1, lr=1 (ratio e)
    #   t3: A=-1, lr=2 (ratio e^2) t4: A=+1, lr=0 (ratio 1)
    old = torch.zeros(2, 3)
    log_prob = torch.tensor([[1.0, 1.0, 50.0], [2.0, 0.0, -50.0]])
    adv = torch.tensor([[1.0, -1.0, 7.0], [-1.0, 1.0, -7.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    return old, log_prob, adv, mask


def test_vanilla_ppo_values_clipfracs_and_kl() -> None:
    old, log_prob, adv, mask = _vanilla_case()
    loss, metrics = ppo_loss(old, log_prob, adv, mask)
    # t1: max(-e, -1.2) = -1.2 (clipped)          t2: max(e, 1.2) = e; min(3, e) = e
    # t3: max(e^2, 1.2) = 7.389; dual clip min(3, 7.389) = 3 (lower-clipped)   t4: -1
    expected = (-1.2 + E + 3.0 - 1.0) / 4  # = 0.879570
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert metrics["pg_clipfrac"].item() == pytest.approx(0.25)
    assert metrics["pg_clipfrac_lower"].item() == pytest.approx(0.25)
    assert metrics["ppo_kl"].item() == pytest.approx(-1.0)  # mean(-lr) = -(1 + 1 + 2 + 0) / 4
    assert all(v.ndim == 0 and not v.requires_grad for v in metrics.values())


def test_vanilla_ppo_gradient_flows_only_through_unclipped_tokens() -> None:
    old, log_prob, adv, mask = _vanilla_case()
    log_prob.requires_grad_(True)
    loss, _ = ppo_loss(old, log_prob, adv, mask)
    loss.backward()
    assert log_prob.grad is not None
    # unclipped tokens: d(-A * exp(lr))/dlr = -A * ratio, / 4 tokens: t2 -> e/4, t4 -> -1/4; clipped tokens -> 0
    torch.testing.assert_close(log_prob.grad, torch.tensor([[0.0, E / 4, 0.0], [0.0, -0.25, 0.0]]))


def test_asymmetric_clip_ranges() -> None:
    old = torch.zeros(1, 2)
    log_prob = torch.tensor([[0.5, -1.0]])  # ratios e^.5 = 1.6487 and e^-1 = .3679
    adv = torch.tensor([[1.0, -1.0]])
    loss, metrics = ppo_loss(old, log_prob, adv, torch.ones(1, 2), clip_ratio_low=0.2, clip_ratio_high=0.28)
    # t1: clamp(1.6487, .8, 1.28) = 1.28 -> max(-1.6487, -1.28) = -1.28
    # t2: clamp(.3679, .8, 1.28) = .8 -> max(.3679, .8) = .8 (< 3, no dual clip)
    assert loss.item() == pytest.approx((-1.28 + 0.8) / 2, rel=1e-6)
    assert metrics["pg_clipfrac"].item() == pytest.approx(1.0)


@settings(max_examples=30, deadline=None)
@given(
    lr=st.floats(-5, 5, allow_nan=False),
    a=st.floats(-10, -0.01, allow_nan=False),
    c=st.floats(1.01, 10, allow_nan=False),
)
def test_dual_clip_bounds_negative_advantage_loss(lr: float, a: float, c: float) -> None:
    loss, _ = ppo_loss(
        torch.zeros(1, 1, dtype=torch.float64),
        torch.tensor([[lr]], dtype=torch.float64),
        torch.tensor([[a]], dtype=torch.float64),
        torch.ones(1, 1, dtype=torch.float64),
        clip_ratio_c=c,
    )
    assert loss.item() <= c * abs(a) * (1 + 1e-12)
    # without the dual clip the loss would be max(-A*ratio, -A*clamp(ratio)) = |A| * max(ratio, .8)
    assert loss.item() == pytest.approx(min(c * abs(a), abs(a) * max(math.exp(lr), 0.8)), rel=1e-12)


def _gmpo_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    old = torch.zeros(2, 3)
    log_prob = torch.tensor([[0.5, -0.1, 30.0], [0.5, -0.1, -30.0]])  # column 2 is padding
    adv = torch.tensor([[1.0, 1.0, 5.0], [-1.0, -1.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    return old, log_prob, adv, mask


def test_geo_mean_values_and_clipfracs() -> None:
    old, log_prob, adv, mask = _gmpo_case()
    loss, metrics = ppo_loss(old, log_prob, adv, mask, loss_mode="geo_mean")
    # clamp(lr, -.2, .2) = [.2, -.1]
    # row 0 (A=+1): min(lr, clamped) = [.2, -.1] -> mean .05 -> ratio e^.05; loss -1 * e^.05 = -1.051271
    # row 1 (A=-1): max(lr, clamped) = [.5, -.1] -> mean .2 -> ratio e^.2; loss +1 * e^.2 = 1.221403
    expected = (-math.exp(0.05) + math.exp(0.2)) / 2  # = 0.085066
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    # token 0 of each row is clipped (.5 != .2): one of 4 tokens with A>0, one with A<0
    assert metrics["pg_clipfrac"].item() == pytest.approx(0.25)
    assert metrics["pg_clipfrac_lower"].item() == pytest.approx(0.25)
    # ppo_kl = mean(-lr) over valid tokens = -(.5 - .1 + .5 - .1) / 4 = -.2
    assert metrics["ppo_kl"].item() == pytest.approx(-0.2)


def test_geo_mean_global_num_seqs() -> None:
    old, log_prob, adv, mask = _gmpo_case()
    full, _ = ppo_loss(old, log_prob, adv, mask, loss_mode="geo_mean")
    parts = [
        ppo_loss(
            old[i : i + 1],
            log_prob[i : i + 1],
            adv[i : i + 1],
            mask[i : i + 1],
            loss_mode="geo_mean",
            global_num_seqs=2,
        )[0]
        for i in range(2)
    ]
    assert (parts[0] + parts[1]).item() == pytest.approx(full.item(), rel=1e-6)


@settings(max_examples=40, deadline=None)
@given(
    b=st.integers(2, 6),
    mode=st.sampled_from(sorted(LOSS_AGG_MODES)),
    loss_mode=st.sampled_from(["vanilla", "gspo", "cispo"]),
    seed=st.integers(0, 10_000),
)
def test_micro_batches_with_global_counts_match_full_batch(b: int, mode: str, loss_mode: str, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    old = torch.randn(b, 5, generator=gen, dtype=torch.float64)
    log_prob = old + 0.3 * torch.randn(b, 5, generator=gen, dtype=torch.float64)
    rollout = old + 0.3 * torch.randn(b, 5, generator=gen, dtype=torch.float64)
    adv = torch.randn(b, 5, generator=gen, dtype=torch.float64)
    mask = (torch.rand(b, 5, generator=gen) > 0.3).to(torch.float64)
    mask[:, 0] = 1.0
    w, _ = rollout_is_weights(old, rollout, mask, level="token", upper=2.0, lower=None)
    full, _ = ppo_loss(old, log_prob, adv, mask, is_weights=w, loss_agg_mode=mode, loss_mode=loss_mode)
    total = torch.zeros((), dtype=torch.float64)
    for rows in (slice(0, b // 2), slice(b // 2, b)):
        part, _ = ppo_loss(
            old[rows],
            log_prob[rows],
            adv[rows],
            mask[rows],
            is_weights=w[rows],
            loss_agg_mode=mode,
            loss_mode=loss_mode,
            global_num_tokens=float(mask.sum()),
            global_num_seqs=b,
        )
        total = total + part
    assert total.item() == pytest.approx(full.item(), rel=1e-9, abs=1e-12)


def test_bad_arguments_raise_value_error() -> None:
    old, log_prob, adv, mask = _vanilla_case()
    assert set(POLICY_LOSSES) == {"vanilla", "geo_mean", "gspo", "cispo"}
    with pytest.raises(ValueError, match="clip_ratio_c"):
        ppo_loss(old, log_prob, adv, mask, clip_ratio_c=1.0)
    with pytest.raises(ValueError, match="loss_mode.*cispo.*geo_mean.*gspo.*vanilla"):
        ppo_loss(old, log_prob, adv, mask, loss_mode="sapo")
    with pytest.raises(ValueError, match="loss_agg_mode"):
        ppo_loss(old, log_prob, adv, mask, loss_agg_mode="sum")
    with pytest.raises(ValueError, match="clip_ratio_low"):
        ppo_loss(old, log_prob, adv, mask, clip_ratio_low=-0.1)
    with pytest.raises(ValueError, match="advantages"):
        ppo_loss(old, log_prob, adv[:, :2], mask)
    with pytest.raises(ValueError, match="old_log_prob"):
        ppo_loss(old[0], log_prob, adv, mask)


def test_is_weights_scale_each_token_and_are_detached() -> None:
    # d = old - rollout = [ln 2, 0 | ln 3, pad]; IcePop "0.5_2.5" -> w = [2, 1 | 0 (e^ln3 = 3 > 2.5), 0 (padding)]
    old = torch.zeros(2, 2)
    rollout = torch.tensor([[-LN2, 0.0], [-math.log(3.0), 9.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    w, _ = rollout_is_weights(old, rollout, mask, level="token", upper=2.5, lower=0.5)
    torch.testing.assert_close(w, torch.tensor([[2.0, 1.0], [0.0, 0.0]]))
    log_prob = torch.zeros(2, 2, requires_grad=True)
    loss, metrics = ppo_loss(old, log_prob, torch.ones(2, 2), mask, is_weights=w)
    # ratio 1, A = +1: token losses -w = [-2, -1 | 0]; the rejected token still counts: token-mean over 3 tokens
    assert loss.item() == pytest.approx(-1.0)
    assert set(metrics) == {"pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"}  # no IS metrics from the loss
    loss.backward()
    assert rollout.grad is None and not w.requires_grad
    # d(-A * w * ratio)/dlr at ratio 1, / 3 tokens
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-2 / 3, -1 / 3], [0.0, 0.0]]))
    # weights that do carry a graph are detached by the loss itself
    w_graph = w.clone().requires_grad_(True)
    again, _ = ppo_loss(old, log_prob, torch.ones(2, 2), mask, is_weights=w_graph)
    again.backward()
    assert w_graph.grad is None


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    loss_mode=st.sampled_from(sorted(POLICY_LOSSES)),
    level=st.sampled_from(sorted(ROLLOUT_IS_LEVELS)),
    bounds=st.tuples(st.floats(1.0, 10.0), st.one_of(st.none(), st.floats(0.1, 1.0))),
    batch_normalize=st.booleans(),
    agg=st.sampled_from(sorted(LOSS_AGG_MODES)),
)
def test_on_policy_is_weights_leave_the_loss_bitwise_unchanged(
    seed: int, loss_mode: str, level: str, bounds: tuple[float, float | None], batch_normalize: bool, agg: str
) -> None:
    gen = torch.Generator().manual_seed(seed)
    old = torch.randn(3, 4, generator=gen)
    lp = old + 0.5 * torch.randn(3, 4, generator=gen)
    adv = torch.randn(3, 4, generator=gen)
    mask = (torch.rand(3, 4, generator=gen) > 0.3).float()
    w, is_m = rollout_is_weights(
        old, old.clone(), mask, level=level, upper=bounds[0], lower=bounds[1], batch_normalize=batch_normalize
    )
    assert torch.equal(w, mask)  # exactly 1 on valid tokens (TIS caps and IcePop bounds enclose 1), 0 on padding
    if mask.sum() > 0:
        assert is_m["rollout_is_min"].item() == is_m["rollout_is_max"].item() == 1.0
        assert is_m["rollout_is_eff_sample_size"].item() == 1.0
    plain, plain_m = ppo_loss(old, lp, adv, mask, loss_mode=loss_mode, loss_agg_mode=agg)
    corrected, m = ppo_loss(old, lp, adv, mask, loss_mode=loss_mode, loss_agg_mode=agg, is_weights=w)
    assert torch.equal(plain, corrected)  # bitwise
    assert set(m) == set(plain_m)
    for key, value in plain_m.items():
        assert torch.equal(value, m[key])


def test_geo_mean_is_weight_is_a_geometric_mean_in_mask_mode() -> None:
    old, log_prob, adv, mask = _gmpo_case()
    # rollout so that d = old - rollout = [[-1, 0], [.5, 0]]: token weights [[e^-1, 1], [e^.5, 1]];
    # IcePop "0.5_2" zeroes e^-1 = .368 and keeps e^.5 = 1.6487
    rollout = torch.tensor([[1.0, 0.0, 0.0], [-0.5, 0.0, 0.0]])
    w, _ = rollout_is_weights(old, rollout, mask, level="token", upper=2.0, lower=0.5)
    loss, _ = ppo_loss(old, log_prob, adv, mask, loss_mode="geo_mean", is_weights=w)
    # Without weights (see test_policy_loss): row 0 -> -e^.05, row 1 -> +e^.2.
    # Row weights exp(mean log(w + 1e-10)): row 0 exp((log 1e-10 + log 1) / 2) = 1e-5 (the zeroed token nearly zeroes
    # the sequence; an arithmetic mean would give .5); row 1 exp((.5 + 0) / 2) = e^.25.
    expected = (-math.exp(0.05) * 1e-5 + math.exp(0.2) * math.exp(0.25)) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-5)  # 0.784150


def test_geo_mean_without_counts_is_a_plain_mean_over_all_rows() -> None:
    old, log_prob, adv, mask = _gmpo_case()
    pad = torch.zeros(1, 3)
    loss, _ = ppo_loss(
        torch.cat([old, pad]),
        torch.cat([log_prob, pad]),
        torch.cat([adv, pad]),
        torch.cat([mask, pad]),
        loss_mode="geo_mean",
    )
    # verl: torch.mean over all B = 3 rows, the fully padded one contributing 0
    assert loss.item() == pytest.approx((-math.exp(0.05) + math.exp(0.2)) / 3, rel=1e-6)
