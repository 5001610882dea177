"""The single-process learner step: micro-batch invariance, non-finite skips, model roles, metrics."""

from __future__ import annotations

import math

import msgspec
import pytest
import torch
from _learner_testlib import (
    START,
    Prompts,
    equal_rewards,
    layout,
    scripted_groups,
    settings,
    tiny_critic,
    tiny_policy,
)

from async_rl.learner import Learner, local_context
from async_rl.peft_format import LoRASpec
from async_rl.transport.protocol import RolloutGroup, pack_array, unpack_array


def _grads_of_first_update(**overrides: object) -> dict[str, torch.Tensor]:
    learner = Learner(settings(**overrides), START, local_context(), tiny_policy)
    store: list[dict[str, torch.Tensor]] = []
    learner.actor.grad_hook = lambda m: store.append(
        {n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}
    )
    learner.train_step(*scripted_groups(4, 4, seed=21))
    return store[0]


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_gradient_is_invariant_to_micro_batch_size(mode: str) -> None:
    # one mini-batch of all 16 sequences; micro-batches of 16 (one big padded batch) vs 1 vs 5 (5+5+5+1) vs 3 (groups
    # of 4 straddle the cuts), in each layout
    common = {"ppo_mini_batch_size": 4, "loss_agg_mode": mode, "max_response_length": 12}
    big = _grads_of_first_update(ppo_micro_batch_size_per_gpu=16, **layout("padded"), **common)
    assert max(float(g.abs().max()) for g in big.values()) > 1e-2  # gradients are far from zero
    for micro, lay in ((1, "padded"), (5, "packed"), (3, "shared"), (16, "shared")):
        small = _grads_of_first_update(ppo_micro_batch_size_per_gpu=micro, **layout(lay), **common)
        assert small.keys() == big.keys()
        for name in big:
            torch.testing.assert_close(small[name], big[name], atol=1e-6, rtol=0, msg=f"{mode} {micro} {lay} {name}")


def test_activation_checkpointing_leaves_gradients_unchanged() -> None:
    common = {"ppo_mini_batch_size": 4, "ppo_micro_batch_size_per_gpu": 8}
    plain = _grads_of_first_update(**layout("padded"), **common)
    for lay in ("padded", "shared"):  # the shared layout's gathers are replayed with each checkpointed layer
        ckpt = _grads_of_first_update(enable_gradient_checkpointing=True, **layout(lay), **common)
        for name in plain:
            torch.testing.assert_close(ckpt[name], plain[name], atol=1e-6, rtol=0, msg=f"{lay} {name}")


def test_activation_checkpointing_leaves_lora_gradients_unchanged() -> None:
    # frozen embeddings feed the first checkpointed layer: the adapters' gradients must still flow through it
    common = {"ppo_mini_batch_size": 4, "ppo_micro_batch_size_per_gpu": 8, "lora": LoRASpec(4, 8.0, "all-linear")}
    plain = _grads_of_first_update(**layout("shared"), **common)
    ckpt = _grads_of_first_update(enable_gradient_checkpointing=True, **layout("shared"), **common)
    assert plain and all("lora" in name for name in plain)
    assert max(float(g.abs().max()) for g in plain.values()) > 1e-4
    assert ckpt.keys() == plain.keys()
    for name in plain:
        torch.testing.assert_close(ckpt[name], plain[name], atol=1e-6, rtol=0, msg=name)


def _snapshot(learner: Learner) -> dict[str, torch.Tensor]:
    state = {f"w.{k}": v.detach().clone() for k, v in learner.model.state_dict().items()}
    for i, st in enumerate(learner.actor.optimizer.state.values()):
        state.update({f"o{i}.{k}": v.clone() for k, v in st.items() if isinstance(v, torch.Tensor)})
    return state


def _nan_reward_groups(seed: int) -> tuple[list[RolloutGroup], Prompts]:
    groups, prompts = scripted_groups(4, 4, seed=seed)
    groups[1].completions[0] = msgspec.structs.replace(groups[1].completions[0], reward=float("nan"))
    return groups, prompts


def test_nan_advantage_skips_the_update_bit_for_bit_and_the_limit_raises() -> None:
    # one mini-batch per step (4 prompts x 4), so one optimizer update per step
    learner = Learner(settings(ppo_mini_batch_size=4, max_consecutive_nonfinite=3), START, local_context(), tiny_policy)
    learner.train_step(*scripted_groups(4, 4, seed=1))  # a normal step: optimizer state exists
    before = _snapshot(learner)
    metrics = learner.train_step(*_nan_reward_groups(2))  # a NaN reward makes its group's GRPO advantages NaN
    assert metrics["learner/actor/skipped_updates"] == 1.0
    assert metrics["learner/actor/skipped_total"] == 1.0
    after = _snapshot(learner)
    assert before.keys() == after.keys()
    for key in before:
        assert torch.equal(before[key], after[key]), key  # weights and Adam moments bit-for-bit unchanged
    assert all(p.grad is None for p in learner.model.parameters())  # gradients zeroed
    assert learner.version == 2  # the step still consumed its batch
    learner.train_step(*_nan_reward_groups(3))  # 2 in a row
    # the 3rd non-finite update in a row raises, naming the limit
    with pytest.raises(RuntimeError, match="3 consecutive optimizer steps skipped"):
        learner.train_step(*_nan_reward_groups(4))


def test_loss_hook_nan_then_recovery_resets_the_consecutive_count() -> None:
    learner = Learner(settings(max_consecutive_nonfinite=3), START, local_context(), tiny_policy)
    learner.loss_hook = lambda loss: loss + float("nan")  # finite gradients, non-finite loss: still skipped
    m = learner.train_step(*scripted_groups(4, 4, seed=1))
    assert m["learner/actor/skipped_updates"] == 2.0
    learner.loss_hook = None
    m = learner.train_step(*scripted_groups(4, 4, seed=2))
    assert m["learner/actor/skipped_updates"] == 0.0
    assert learner.actor.guard.consecutive == 0 and learner.actor.guard.skipped_total == 2


def test_models_are_built_only_for_their_roles() -> None:
    plain = Learner(settings(), START, local_context(), tiny_policy)
    assert plain.ref is None and plain.critic is None and plain.kl_ctrl is None
    full = Learner(
        settings(
            adv_estimator="gae",
            critic=dict(ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=2),
            use_kl_loss=True,
        ),
        START,
        local_context(),
        tiny_policy,
        critic=tiny_critic,
    )
    assert full.ref is not None and full.critic is not None
    assert not any(p.requires_grad for p in full.ref.parameters())
    metrics = full.train_step(*scripted_groups(4, 4, seed=5))
    assert all(k.startswith("learner/") for k in metrics)
    assert all(math.isfinite(v) for v in metrics.values())
    for key in ("learner/critic/loss", "learner/critic/vf_clipfrac", "learner/actor/kl_loss", "learner/actor/entropy"):
        assert key in metrics
    with pytest.raises(ValueError, match="critic"):
        Learner(settings(adv_estimator="gae", critic={"model.path": ""}), START, local_context(), tiny_policy)


def test_step_metrics_and_version() -> None:
    corr = {"rollout_is": "token", "rollout_is_threshold": 2.0}
    learner = Learner(settings(**corr, **layout("padded")), START, local_context(), tiny_policy)
    groups, prompts = scripted_groups(4, 4, seed=8, version=0)
    m0 = learner.train_step(groups, prompts)
    m1 = learner.train_step(groups, prompts)  # same samples, now one version stale
    assert (m0["learner/version"], m1["learner/version"]) == (1.0, 2.0)
    assert (m0["learner/staleness/mean"], m1["learner/staleness/max"]) == (0.0, 1.0)
    assert m0["learner/batch/size"] == 16.0
    assert 0.0 < m0["learner/batch/padding_waste"] < 1.0
    assert 0.0 < m0["learner/offpolicy/ess"] <= 1.0
    for key in ("learner/rollout_corr/rollout_is_eff_sample_size", "learner/rollout_corr/rollout_is_max"):
        assert key in m0
    assert "learner/perf/tokens_per_s" in m0
    assert m0["learner/rollout_corr/rollout_is_max"] <= 2.0 + 1e-6  # truncated at rollout_is_threshold
    packed = Learner(settings(**layout("packed")), START, local_context(), tiny_policy).train_step(groups, prompts)
    assert packed["learner/batch/padding_waste"] < m0["learner/batch/padding_waste"]
    shared = Learner(settings(**corr, **layout("shared")), START, local_context(), tiny_policy)
    m_shared = shared.train_step(groups, prompts)
    assert m_shared["learner/batch/padding_waste"] == 0.0  # one padding-free row per micro-batch
    # the same update: only float summation order differs
    assert m_shared["learner/actor/pg_loss"] == pytest.approx(m0["learner/actor/pg_loss"], abs=1e-6)
    assert m_shared["learner/actor/grad_norm"] == pytest.approx(m0["learner/actor/grad_norm"], rel=1e-5)


def test_skipping_the_proximal_pass_gives_the_same_update_and_metrics() -> None:
    # One optimizer step per train_step (4 prompts x 4 = the whole batch): the proximal pass is redundant, since
    # old log-probs are the update pass's own. Forcing the separate pass must give the same gradient and metrics.
    common = {"ppo_mini_batch_size": 4, "ppo_micro_batch_size_per_gpu": 5, "max_response_length": 12}
    results = {}
    for reuse in (True, False):
        learner = Learner(settings(**common), START, local_context(), tiny_policy)
        assert learner._reuses_proximal(16)
        if not reuse:
            learner._reuses_proximal = lambda batch_size: False  # type: ignore[method-assign]
        grads: list[dict[str, torch.Tensor]] = []
        learner.actor.grad_hook = lambda m, store=grads: store.append(
            {n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}
        )
        metrics = learner.train_step(*scripted_groups(4, 4, seed=21))
        results[reuse] = (grads[0], metrics)
    (g_reuse, m_reuse), (g_full, m_full) = results[True], results[False]
    skipped = "learner/actor/proximal_pass_skipped"
    assert (m_reuse[skipped], m_full[skipped]) == (1.0, 0.0)
    assert max(float(g.abs().max()) for g in g_full.values()) > 1e-2
    for name in g_full:
        torch.testing.assert_close(g_reuse[name], g_full[name], atol=1e-6, rtol=0, msg=name)
    for key in ("learner/offpolicy/ess", "learner/offpolicy/abs_log_ratio_mean", "learner/actor/pg_loss"):
        assert math.isclose(m_reuse[key], m_full[key], rel_tol=1e-5, abs_tol=1e-7), key
    assert m_full["learner/offpolicy/abs_log_ratio_mean"] > 1e-3  # scripted behaviour log-probs differ: not trivial
    # two mini-batches: the second one's proximal policy is not the current weights, so the pass stays
    assert not Learner(settings(ppo_mini_batch_size=2), START, local_context(), tiny_policy)._reuses_proximal(16)


def test_a_group_with_an_out_of_vocab_id_is_dropped_not_a_crash() -> None:
    # the incident: one completion with token id 1,000,000 (the tiny policy has 64 embedding rows)
    groups, prompts = scripted_groups(4, 4, seed=31)
    bad = groups[1].completions[2]
    tokens = [*unpack_array(bad.token_ids)[:-1], 1_000_000]
    groups[1].completions[2] = msgspec.structs.replace(bad, token_ids=pack_array(tokens, bad.token_ids.dtype))
    store: list[dict[str, torch.Tensor]] = []

    def first_update(learner: Learner, batch: list[RolloutGroup]) -> dict[str, float]:
        learner.actor.grad_hook = lambda m: store.append({n: p.grad.clone() for n, p in m.named_parameters()})
        return learner.train_step(batch, prompts)

    common = {"ppo_micro_batch_size_per_gpu": 4, "max_response_length": 12}
    learner = Learner(settings(ppo_mini_batch_size=4, **common), START, local_context(), tiny_policy)
    assert learner.vocab_size == 64
    metrics = first_update(learner, groups)
    assert metrics["learner/batch/invalid_groups"] == 1.0 and learner.version == 1
    # the update is exactly the one of the other three groups alone (token-mean: group 1 adds no token)
    alone = Learner(settings(ppo_mini_batch_size=3, **common), START, local_context(), tiny_policy)
    clean = first_update(alone, [g for i, g in enumerate(groups) if i != 1])
    assert clean["learner/batch/invalid_groups"] == 0.0
    with_bad, without = store
    assert max(float(g.abs().max()) for g in without.values()) > 1e-2  # a real update, not two zero gradients
    for name in without:
        torch.testing.assert_close(with_bad[name], without[name], atol=1e-6, rtol=0, msg=name)


@pytest.mark.parametrize(("layout_name", "mini"), [("shared", 2), ("padded", 2), ("shared", 4)])
def test_skipping_zero_advantage_sequences_gives_the_same_update(layout_name: str, mini: int) -> None:
    """actor.skip_zero_advantage: two of four groups have equal rewards, so their advantages are all zero; leaving them
    out of the forward and backward gives the same gradients, loss and parameters (the loss is still normalised over
    all 16 sequences), over two steps of two mini-batches, or of one (the proximal pass skipped)."""
    groups, prompts = scripted_groups(4, 4, seed=21)
    batches = [equal_rewards(groups, (1, 2)), equal_rewards(scripted_groups(4, 4, seed=22)[0], (0, 3))]
    common = {"ppo_mini_batch_size": mini, "ppo_micro_batch_size_per_gpu": 3, "max_response_length": 12}
    runs = {}
    for skip in (True, False):
        learner = Learner(
            settings(skip_zero_advantage=skip, **common, **layout(layout_name)), START, local_context(), tiny_policy
        )
        grads: list[dict[str, torch.Tensor]] = []
        learner.actor.grad_hook = lambda m, store=grads: store.append(
            {n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}
        )
        metrics = [learner.train_step(batch, prompts) for batch in batches]
        params = {n: p.detach().clone() for n, p in learner.actor.model.named_parameters()}
        runs[skip] = (grads, metrics, params)
    (g_skip, m_skip, p_skip), (g_all, m_all, p_all) = runs[True], runs[False]
    assert [m["learner/batch/skipped_sequences"] for m in m_skip] == [8.0, 8.0]
    assert [m["learner/batch/skipped_sequences"] for m in m_all] == [0.0, 0.0]
    assert m_skip[0]["learner/batch/tokens_computed"] < m_all[0]["learner/batch/tokens_computed"]
    assert len(g_skip) == len(g_all) == 2 * 4 // mini  # optimizer steps
    for step_skip, step_all in zip(g_skip, g_all, strict=True):
        assert max(float(g.abs().max()) for g in step_all.values()) > 1e-3
        for name in step_all:
            torch.testing.assert_close(step_skip[name], step_all[name], atol=1e-6, rtol=1e-5, msg=name)
    for a, b in zip(m_skip, m_all, strict=True):
        assert a["learner/actor/pg_loss"] == pytest.approx(b["learner/actor/pg_loss"], abs=1e-7)
        assert a["learner/actor/grad_norm"] == pytest.approx(b["learner/actor/grad_norm"], rel=1e-5)
    # within 1% of one step (lr 1e-3): AdamW divides a gradient near its eps by its own scale, so the summation order's
    # 1e-8 differences move a few weights by a few 1e-6
    for name in p_all:
        torch.testing.assert_close(p_skip[name], p_all[name], atol=1e-5, rtol=0, msg=name)


@pytest.mark.parametrize(
    "extra", [{"entropy_coeff": 0.01}, {"use_kl_loss": True}, {"rollout_is": "token", "is_batch_normalize": True}]
)
def test_zero_advantage_sequences_are_computed_where_their_gradient_is_not_zero(extra: dict[str, object]) -> None:
    groups, prompts = scripted_groups(4, 4, seed=21)
    cfg = settings(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=4, max_response_length=12, **extra)
    learner = Learner(cfg, START, local_context(), tiny_policy)
    metrics = learner.train_step(equal_rewards(groups, (1, 2)), prompts)
    assert metrics["learner/batch/skipped_sequences"] == 0.0


@pytest.mark.parametrize(
    "extra",
    [
        {"ppo_mini_batch_size": 4},  # one update: the update's own forward is the policy before the step
        {"ppo_mini_batch_size": 2},  # two updates: the proximal pass is the policy before the step
        {"ppo_mini_batch_size": 2, "bypass_mode": True, "bypass_loss_type": "ppo_clip"},  # no proximal pass: a pass
    ],
)
def test_step_kl_is_the_kl_from_the_policy_before_the_step_to_the_one_after(extra: dict[str, object]) -> None:
    learner = Learner(settings(step_kl_freq=2, skip_zero_advantage=False, **extra), START, local_context(), tiny_policy)
    groups, prompts = scripted_groups(4, 4, seed=21)
    batch = learner.collate(groups, prompts)
    learner.model.eval()
    before = learner._log_probs(learner.model, batch)
    metrics = learner.train_batch(batch, [g.prompt_id for g in groups])
    after = learner._log_probs(learner.model, batch)
    learner.model.train()
    mask = batch.loss_mask.double()
    shift = (after - before).double()
    k3 = (shift.exp() - shift - 1.0) * mask
    assert metrics["learner/actor/step_kl"] == pytest.approx(float(k3.sum() / mask.sum()), rel=1e-4, abs=1e-7)
    moved = float((shift.abs() * mask).sum() / mask.sum())
    assert metrics["learner/actor/step_abs_log_ratio"] == pytest.approx(moved, rel=1e-4)
    assert moved > 1e-3  # lr 1e-3 on a tiny model moves it: not a trivial zero
    # every second step only (step_kl_freq=2): the next step does not measure, the one after does
    assert "learner/actor/step_kl" not in learner.train_step(groups, prompts)
    assert learner.train_step(groups, prompts)["learner/actor/step_kl"] > 0.0


def test_step_kl_is_off_by_default_and_the_zero_advantage_share_is_reported() -> None:
    learner = Learner(settings(), START, local_context(), tiny_policy)
    groups, prompts = scripted_groups(4, 4, seed=21)
    metrics = learner.train_step(equal_rewards(groups, (0, 2)), prompts)
    assert "learner/actor/step_kl" not in metrics
    informative = metrics["learner/batch/informative_groups"]
    assert metrics["learner/batch/zero_advantage_share"] == pytest.approx(1.0 - informative / 4)
    assert metrics["learner/batch/zero_advantage_share"] >= 0.5  # groups 0 and 2 at least
