"""verl 0.9.1's rollout-correction modes and the newer policy losses, wired through the learner step.

The math of each piece is checked against verl 0.9.1 in tests/algorithms (and tools/verl_crosscheck.py); these tests
check the learner's wiring: which log-probs are the old policy in bypass mode, that rejection sampling and batch
normalisation happen once per step on the whole batch (and force the proximal pass), and that the loss modes and
``loss_scale_factor`` reach the loss.
"""

from __future__ import annotations

import math

import msgspec
import pytest
import torch
from _learner_testlib import START, Prompts, collate, scripted_groups, settings, tiny_policy

from async_rl.config import ConfigError, load_config
from async_rl.learner import Learner, local_context
from async_rl.learner.batching import local_group
from async_rl.transport.protocol import RolloutGroup, pack_array

COMMON = {"ppo_mini_batch_size": 4, "ppo_micro_batch_size_per_gpu": 5, "max_response_length": 12}


def _first_update(
    groups: tuple[list[RolloutGroup], Prompts], **overrides: object
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    learner = Learner(settings(**{**COMMON, **overrides}), START, local_context(), tiny_policy)
    grads: list[dict[str, torch.Tensor]] = []
    learner.actor.grad_hook = lambda m: grads.append(
        {n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}
    )
    metrics = learner.train_step(*groups)
    return grads[0], metrics


def _on_policy_groups(seed: int = 21) -> tuple[list[RolloutGroup], Prompts]:
    """Scripted groups whose behaviour log-probs are exactly the initial model's (pi_rollout == pi_old)."""
    groups, prompts = scripted_groups(4, 4, seed=seed)
    learner = Learner(settings(**COMMON), START, local_context(), tiny_policy)
    batch = collate(groups, prompts, max_response_length=12)
    logps = learner._log_probs(learner.model, batch)
    out, row = [], 0
    for g in groups:
        completions = []
        for c in g.completions:
            lp = pack_array(logps[row, : c.token_ids.length].tolist(), "<f4")
            completions.append(msgspec.structs.replace(c, logprobs=lp))
            row += 1
        out.append(local_group(g.prompt_id, completions))
    return out, prompts


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 1e-6) -> None:
    assert a.keys() == b.keys()
    assert max(float(g.abs().max()) for g in a.values()) > 1e-3  # not trivially zero
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=atol, rtol=1e-5, msg=name)


def test_bypass_mode_takes_the_actors_log_probs_as_the_old_policy() -> None:
    groups = _on_policy_groups()
    # on-policy behaviour log-probs: bypass PPO-clip (old = rollout) is plain PPO against the proximal pass, and
    # at ratio 1 PPO's gradient -A * grad(ratio) equals REINFORCE's -A * grad(log pi)
    decoupled, _ = _first_update(groups, rollout_is=None)
    bypass, m_bypass = _first_update(groups, rollout_is=None, bypass_mode=True)
    reinforce, m_reinforce = _first_update(
        groups, rollout_is="token", rollout_is_threshold=2.0, bypass_mode=True, bypass_loss_type="reinforce"
    )
    _assert_same(bypass, decoupled)
    _assert_same(reinforce, decoupled, atol=1e-5)
    assert m_bypass["learner/actor/proximal_pass_skipped"] == 1.0  # bypass mode has no proximal pass
    assert m_reinforce["learner/rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-5)
    # off-policy behaviour log-probs (scripted, about -4.2 per token): bypass trains against them, so it differs
    off = scripted_groups(4, 4, seed=21)
    b_off, _ = _first_update(off, rollout_is=None, bypass_mode=True)
    d_off, _ = _first_update(off, rollout_is=None)
    assert any(not torch.allclose(b_off[k], d_off[k], atol=1e-4) for k in b_off)


def test_rejection_sampling_masks_tokens_once_per_step_before_the_loss() -> None:
    groups = scripted_groups(4, 4, seed=21)
    # the scripted behaviour log-probs sit in [-4.5, -3.9]; the tiny model's are near -log(64) = -4.16
    learner = Learner(
        settings(**COMMON, rollout_rs="token_k1", rollout_rs_threshold=1.2), START, local_context(), tiny_policy
    )
    assert not learner._reuses_proximal(16)  # rejection needs the proximal log-probs before the loss counts
    batch = collate(*groups, max_response_length=12)
    d = (learner._log_probs(learner.model, batch) - batch.rollout_log_probs)[batch.response_mask.bool()]
    expected = float((d.abs() > math.log(1.2)).float().mean())  # k1 = -d kept within [log(1/1.2), log(1.2)]
    assert 0.05 < expected < 0.95  # a non-trivial share is rejected
    metrics = learner.train_step(*groups)
    assert metrics["learner/rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(expected, abs=1e-6)
    # rejecting everything leaves nothing to learn from: zero gradient
    grads, m_all = _first_update(groups, rollout_rs="token_k2", rollout_rs_threshold=1e-12)
    assert m_all["learner/rollout_corr/rollout_rs_masked_fraction"] == 1.0
    assert max(float(g.abs().max()) for g in grads.values()) == 0.0


def test_batch_normalised_weights_have_mean_one() -> None:
    groups = scripted_groups(4, 4, seed=21)
    learner = Learner(
        settings(**COMMON, rollout_is="sequence", rollout_is_threshold=5.0, is_batch_normalize=True),
        START,
        local_context(),
        tiny_policy,
    )
    assert not learner._reuses_proximal(16)
    batch = collate(*groups, max_response_length=12)
    mask = batch.response_mask.float()
    d = (learner._log_probs(learner.model, batch) - batch.rollout_log_probs) * mask
    rows = torch.clamp(torch.exp(d.sum(-1).clamp(-20, 20)), max=5.0)  # one truncated weight per sequence
    metrics = learner.train_step(*groups)
    assert metrics["learner/rollout_corr/rollout_is_batch_norm_factor"] == pytest.approx(float(rows.mean()), rel=1e-5)
    assert abs(float(rows.mean()) - 1.0) > 1e-3  # normalisation does something here


@pytest.mark.parametrize("loss_mode", ["gspo", "cispo", "geo_mean"])
def test_every_loss_mode_trains(loss_mode: str) -> None:
    clip = {"clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4} if loss_mode == "gspo" else {}
    grads, metrics = _first_update(scripted_groups(4, 4, seed=3), loss_mode=loss_mode, **clip)
    assert all(math.isfinite(v) for v in metrics.values())
    assert max(float(g.abs().max()) for g in grads.values()) > 1e-4
    assert 0.0 <= metrics["learner/actor/pg_clipfrac"] <= 1.0


def test_loss_scale_factor_divides_the_dr_grpo_loss() -> None:
    groups = scripted_groups(4, 4, seed=5)
    mode = {"loss_agg_mode": "seq-mean-token-sum-norm", "norm_adv_by_std_in_grpo": False}
    default, _ = _first_update(groups, **mode)  # T = max_response_length = 12
    explicit, _ = _first_update(groups, loss_scale_factor=12.0, **mode)
    doubled, _ = _first_update(groups, loss_scale_factor=24.0, **mode)
    _assert_same(explicit, default)
    _assert_same(doubled, {k: v / 2 for k, v in default.items()})


def test_bad_correction_settings_fail_before_training() -> None:
    rc = "algorithm.rollout_correction"
    for override, match in (
        (f"{rc}.rollout_is=batch", "rollout_is"),
        (f"{rc}.loss_type=dpo", "loss_type"),
        (f"{rc}.rollout_is_threshold=cap", "not a number"),
        (f"{rc}.rollout_rs=token_k1", "thresholds must be given"),
    ):
        with pytest.raises(ConfigError, match=match):
            load_config(None, [override])
    # the learner parses the same specs once, at construction: a config changed after validation fails there
    for bad, match in (({"rollout_is_threshold": "cap"}, "not a number"), ({"rollout_rs": "token_k1"}, "thresholds")):
        with pytest.raises(ValueError, match=match):
            Learner(settings(**bad), START, local_context(), tiny_policy)
