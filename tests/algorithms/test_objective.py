"""The actor's objective on hand-built tensors: each term by hand, and each mode of the rollout correction, without a
learner (the learner's use of it is covered by tests/learner)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from _loss_testlib import ppo_loss

from async_rl.algorithms import reinforce_loss, rollout_is_weights
from async_rl.algorithms.objective import ActorMicroBatch, ObjectiveSpec, actor_objective, correction_weights

SPEC = ObjectiveSpec(
    loss_mode="vanilla",
    clip_ratio=0.2,
    clip_ratio_low=0.2,
    clip_ratio_high=0.2,
    clip_ratio_c=3.0,
    loss_agg_mode="token-mean",
    loss_scale_factor=None,
    entropy_coeff=0.0,
    kl_loss_coef=None,
    kl_loss_type="low_var_kl",
    rollout_is=None,
    is_upper=2.0,
    is_lower=None,
    is_batch_normalize=False,
    rs_bounds=None,
    bypass_loss_type=None,
)
MASK = torch.tensor([[True, True, False], [True, True, True]])  # 5 valid tokens
ADV = torch.tensor([[1.0, -1.0, 9.0], [0.5, 2.0, -1.0]])


def _batch(log_prob: torch.Tensor, **changes: object) -> ActorMicroBatch:
    base = ActorMicroBatch(
        log_prob=log_prob,
        entropy=torch.tensor([[1.0, 2.0, 50.0], [3.0, 4.0, 5.0]]),
        old_log_prob=log_prob.detach().clone(),
        rollout_log_prob=log_prob.detach().clone(),
        advantages=ADV,
        loss_mask=MASK,
        is_weights=None,
        ref_log_prob=None,
        global_num_tokens=5.0,
        global_num_seqs=2.0,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_on_policy_terms_by_hand() -> None:
    """Ratio 1 everywhere: the PPO term is -mean(A) over the 5 valid tokens, its gradient -A/5 per token; the entropy
    term subtracts 0.1 x mean(H); a KL to a reference equal to the policy adds 0 (low_var_kl of equal log-probs)."""
    log_prob = torch.full((2, 3), -1.0, requires_grad=True)
    spec = dataclasses.replace(SPEC, entropy_coeff=0.1, kl_loss_coef=0.5)
    out = actor_objective(_batch(log_prob, ref_log_prob=log_prob.detach().clone()), spec)
    mean_adv = (1.0 - 1.0 + 0.5 + 2.0 - 1.0) / 5
    mean_entropy = (1.0 + 2.0 + 3.0 + 4.0 + 5.0) / 5
    assert out.pg_loss.item() == pytest.approx(-mean_adv)
    assert out.kl_loss is not None and out.kl_loss.item() == pytest.approx(0.0, abs=1e-7)
    assert out.loss.item() == pytest.approx(-mean_adv - 0.1 * mean_entropy)
    out.loss.backward()
    assert log_prob.grad is not None
    torch.testing.assert_close(log_prob.grad, torch.where(MASK, -ADV / 5, torch.zeros(())))
    assert out.correction_metrics == {} and torch.equal(out.mask, MASK)
    with pytest.raises(ValueError, match="reference log-probs"):
        actor_objective(_batch(log_prob.detach()), spec)


def test_importance_weights_precomputed_or_computed_here_are_the_same_loss() -> None:
    """Decoupled with ``rollout_is``: the step's precomputed weights, or (proximal pass skipped) weights computed from
    the micro-batch: the same weights, so the same loss; only the second reports the correction's metrics."""
    gen = torch.Generator().manual_seed(0)
    log_prob = torch.randn(2, 3, generator=gen)
    rollout = log_prob + 0.5 * torch.randn(2, 3, generator=gen)
    spec = dataclasses.replace(SPEC, rollout_is="token", is_upper=1.5)
    weights, _ = rollout_is_weights(log_prob, rollout, MASK, level="token", upper=1.5, lower=None)
    given = actor_objective(_batch(log_prob, rollout_log_prob=rollout, is_weights=weights), spec)
    here = actor_objective(_batch(log_prob, rollout_log_prob=rollout), spec)
    assert given.loss.item() == here.loss.item()
    assert given.correction_metrics == {} and "rollout_is_eff_sample_size" in here.correction_metrics
    plain, _ = ppo_loss(
        log_prob,
        log_prob,
        ADV,
        MASK,
        is_weights=weights,
        global_num_tokens=5.0,
        global_num_seqs=2.0,
    )
    assert here.loss.item() == pytest.approx(plain.item())
    assert torch.equal(correction_weights(log_prob, rollout, MASK, spec)[0], weights)


def test_bypass_ppo_clip_is_ppo_against_the_rollout() -> None:
    log_prob = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -1.5, -3.0]])
    rollout = torch.tensor([[-1.2, -1.9, 0.0], [-0.5, -2.5, -3.1]])
    spec = dataclasses.replace(SPEC, bypass_loss_type="ppo_clip", rollout_is="token")  # ppo_clip takes no weights
    out = actor_objective(_batch(log_prob, old_log_prob=torch.zeros(2, 3), rollout_log_prob=rollout), spec)
    expected, _ = ppo_loss(
        rollout,
        log_prob,
        ADV,
        MASK,
        global_num_tokens=5.0,
        global_num_seqs=2.0,
    )
    assert out.pg_loss.item() == pytest.approx(expected.item())


def test_bypass_reinforce_rejects_then_weights_by_the_current_policy() -> None:
    """Bypass REINFORCE: a token whose |log ratio| to the rollout is out of bounds leaves the mask (token_k1 within
    [1/2, 2]: the second row's first token, log ratio 1 > log 2, goes), and the rest are weighted by
    pi_current / pi_rollout truncated at 2."""
    log_prob = torch.tensor([[-1.0, -2.0, 0.0], [0.0, -1.5, -3.0]], requires_grad=True)
    rollout = torch.tensor([[-1.2, -1.9, 0.0], [-1.0, -1.6, -3.1]])
    spec = dataclasses.replace(
        SPEC, bypass_loss_type="reinforce", rollout_is="token", rs_bounds={"token_k1": (0.5, 2.0)}
    )
    out = actor_objective(_batch(log_prob, rollout_log_prob=rollout), spec)
    kept = MASK.clone()
    kept[1, 0] = False
    assert torch.equal(out.mask, kept)
    assert out.correction_metrics["rollout_rs_masked_fraction"].item() == pytest.approx(1 / 5)
    weights = torch.clamp(torch.exp(log_prob.detach() - rollout), max=2.0) * kept
    expected, _ = reinforce_loss(
        log_prob.detach(),
        ADV,
        kept,
        is_weights=weights,
        global_num_tokens=5.0,
        global_num_seqs=2.0,
        loss_agg_mode="token-mean",
        loss_scale_factor=None,
    )
    assert out.pg_loss.item() == pytest.approx(expected.item())
    # by hand: -(1 * -1 * e^.2 + -1 * -2 * e^-.1 + 2 * -1.5 * e^.1 + -1 * -3 * e^.1) / 5
    by_hand = -(-math.exp(0.2) + 2 * math.exp(-0.1) - 3 * math.exp(0.1) + 3 * math.exp(0.1)) / 5
    assert out.pg_loss.item() == pytest.approx(by_hand)
