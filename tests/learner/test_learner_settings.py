"""LearnerSettings validation and verl-name mapping; the learning-rate schedule by hand."""

from __future__ import annotations

import math
from types import SimpleNamespace as NS

import pytest

from async_rl.learner.optim import lr_factor
from async_rl.learner.settings import CriticSettings, LearnerSettings, OptimSettings


def test_lr_schedule_by_hand() -> None:
    cos = OptimSettings(
        lr=1.0, lr_warmup_steps=2, lr_scheduler_type="cosine", min_lr_ratio=0.1, total_training_steps=10
    )
    # warm-up: (step + 1) / 2
    assert lr_factor(0, cos) == pytest.approx(0.5)
    assert lr_factor(1, cos) == pytest.approx(1.0)
    # progress (step - 2) / 8: step 2 -> 0 -> 1.0; step 6 -> 0.5 -> 0.1 + 0.9 * 0.5 * (1 + cos(pi/2)) = 0.55
    assert lr_factor(2, cos) == pytest.approx(1.0)
    assert lr_factor(6, cos) == pytest.approx(0.55)
    assert lr_factor(10, cos) == pytest.approx(0.1)
    assert lr_factor(50, cos) == pytest.approx(0.1)  # clipped after the end
    # one full period (num_cycles=1): progress 0.5 -> cos(pi) = -1 -> floor 0.1; progress 1 -> back to 1.0
    full = OptimSettings(lr=1.0, lr_scheduler_type="cosine", min_lr_ratio=0.1, num_cycles=1.0, total_training_steps=8)
    assert lr_factor(4, full) == pytest.approx(0.1)
    assert lr_factor(8, full) == pytest.approx(1.0)
    const = OptimSettings(lr=1.0, lr_warmup_steps=4)
    assert [lr_factor(s, const) for s in (0, 3, 4, 100)] == [0.25, 1.0, 1.0, 1.0]
    assert math.isclose(lr_factor(0, OptimSettings()), 1.0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"ppo_mini_batch_size": 0}, "ppo_mini_batch_size"),
        ({"ppo_epochs": 0}, "ppo_epochs"),
        ({"loss_agg_mode": "mean"}, "loss_agg_mode"),
        ({"temperature": 0.0}, "temperature"),
        ({"grad_clip": 0.0}, "grad_clip"),
        ({"adv_estimator": "gae"}, "critic"),
        ({"max_consecutive_nonfinite": 0}, "max_consecutive_nonfinite"),
    ],
)
def test_settings_reject_bad_values(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LearnerSettings(**kwargs)  # type: ignore[arg-type]


def test_optim_and_critic_settings_reject_bad_values() -> None:
    with pytest.raises(ValueError, match="lr_scheduler_type"):
        OptimSettings(lr_scheduler_type="linear")
    with pytest.raises(ValueError, match="total_training_steps"):
        OptimSettings(lr_scheduler_type="cosine")
    with pytest.raises(ValueError, match="critic.ppo_epochs"):
        CriticSettings(ppo_epochs=0)


def test_from_config_reads_verl_names() -> None:
    cfg = NS(
        actor_rollout_ref=NS(
            actor=NS(
                ppo_mini_batch_size=8,
                ppo_micro_batch_size_per_gpu=2,
                ppo_epochs=3,
                clip_ratio_high=0.28,
                loss_agg_mode="seq-mean-token-mean",
                entropy_coeff=0.001,
                use_kl_loss=True,
                kl_loss_coef=0.01,
                grad_clip=0.5,
                policy_loss=NS(loss_mode="geo_mean"),
                optim=NS(lr=2e-6, lr_warmup_steps_ratio=0.1, lr_scheduler_type="cosine", min_lr_ratio=0.2),
            ),
            rollout=NS(n=5, temperature=0.9),
            model=NS(use_remove_padding=True),
        ),
        algorithm=NS(
            adv_estimator="gae",
            gamma=0.99,
            lam=0.95,
            rollout_correction=NS(rollout_is="token", rollout_is_threshold=2.0),
        ),
        critic=NS(ppo_mini_batch_size=4, cliprange_value=0.2, optim=NS(lr=1e-5)),
        data=NS(max_response_length=256),
        trainer=NS(total_training_steps=100, seed=7),
    )
    s = LearnerSettings.from_config(cfg)
    assert (s.ppo_mini_batch_size, s.ppo_micro_batch_size_per_gpu, s.ppo_epochs, s.rollout_n) == (8, 2, 3, 5)
    assert (s.clip_ratio, s.clip_ratio_high, s.loss_agg_mode, s.loss_mode) == (
        0.2,
        0.28,
        "seq-mean-token-mean",
        "geo_mean",
    )
    assert (s.use_kl_loss, s.kl_loss_coef, s.grad_clip, s.temperature) == (True, 0.01, 0.5, 0.9)
    assert s.use_remove_padding and s.needs_ref and s.needs_critic
    assert (s.gamma, s.lam, s.rollout_is, s.rollout_is_threshold, s.max_response_length, s.seed) == (
        0.99,
        0.95,
        "token",
        2.0,
        256,
        7,
    )
    # warm-up ratio 0.1 of 100 steps -> 10 steps
    assert (s.optim.lr, s.optim.lr_warmup_steps, s.optim.lr_scheduler_type) == (2e-6, 10, "cosine")
    assert s.critic is not None and (s.critic.ppo_mini_batch_size, s.critic.cliprange_value) == (4, 0.2)
    assert s.critic.optim.lr == 1e-5
    # an empty config gives the defaults; disabled correction means no IS weights; dynamic batches are refused
    assert LearnerSettings.from_config(NS()) == LearnerSettings()
    off = NS(algorithm=NS(rollout_correction=NS(rollout_is=None, rollout_is_threshold=2.0)))
    assert LearnerSettings.from_config(off).rollout_is is None
    icepop = NS(algorithm=NS(rollout_correction=NS(rollout_is="sequence", rollout_is_threshold="0.5_5.0")))
    got = LearnerSettings.from_config(icepop)
    assert (got.rollout_is, got.rollout_is_threshold) == ("sequence", "0.5_5.0")
    with pytest.raises(ValueError, match="use_dynamic_bsz"):
        LearnerSettings.from_config(NS(actor_rollout_ref=NS(actor=NS(use_dynamic_bsz=True))))


def test_from_config_accepts_the_real_config_tree() -> None:
    from async_rl.config import load_config

    cfg = load_config(["configs/demo_ppo.yaml"], [])
    s = LearnerSettings.from_config(cfg)
    assert s.ppo_mini_batch_size == cfg.actor_rollout_ref.actor.ppo_mini_batch_size
    assert s.rollout_n == cfg.actor_rollout_ref.rollout.n
    assert s.adv_estimator == cfg.algorithm.adv_estimator
    assert (s.critic is not None) is (cfg.algorithm.adv_estimator == "gae")
