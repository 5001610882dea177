"""LearnerSettings validation and verl-name mapping; the learning-rate schedule by hand."""

from __future__ import annotations

import dataclasses
import math

import pytest

from async_rl.config import default_config, load_config
from async_rl.learner.optim import lr_factor
from async_rl.learner.settings import CriticSettings, LearnerSettings, OptimSettings
from async_rl.peft_format import LoRASpec

ARR = "actor_rollout_ref"
RC = "algorithm.rollout_correction"
GRPO = ["algorithm.adv_estimator=grpo", f"{ARR}.rollout.n=4"]


def test_lr_schedule_by_hand() -> None:
    cos = OptimSettings.defaults(
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
    full = OptimSettings.defaults(
        lr=1.0, lr_scheduler_type="cosine", min_lr_ratio=0.1, num_cycles=1.0, total_training_steps=8
    )
    assert lr_factor(4, full) == pytest.approx(0.1)
    assert lr_factor(8, full) == pytest.approx(1.0)
    const = OptimSettings.defaults(lr=1.0, lr_warmup_steps=4)
    assert [lr_factor(s, const) for s in (0, 3, 4, 100)] == [0.25, 1.0, 1.0, 1.0]
    assert math.isclose(lr_factor(0, OptimSettings.defaults()), 1.0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"ppo_mini_batch_size": 0}, "ppo_mini_batch_size"),
        ({"ppo_epochs": 0}, "ppo_epochs"),
        ({"loss_agg_mode": "mean"}, "loss_agg_mode"),
        ({"temperature": 0.0}, "temperature"),
        ({"grad_clip": 0.0}, "grad_clip"),
        ({"adv_estimator": "gae", "critic": None}, "critic"),
        ({"max_consecutive_nonfinite": 0}, "max_consecutive_nonfinite"),
    ],
)
def test_settings_reject_bad_values(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LearnerSettings.defaults(**kwargs)


def test_optim_and_critic_settings_reject_bad_values() -> None:
    with pytest.raises(ValueError, match="lr_scheduler_type"):
        OptimSettings.defaults(lr_scheduler_type="linear")
    with pytest.raises(ValueError, match="total_training_steps"):
        OptimSettings.defaults(lr_scheduler_type="cosine")
    with pytest.raises(ValueError, match="critic.ppo_epochs"):
        CriticSettings.defaults(ppo_epochs=0)


def test_from_config_reads_verl_names() -> None:
    cfg = load_config(
        None,
        [
            f"{ARR}.actor.ppo_mini_batch_size=8",
            f"{ARR}.actor.ppo_micro_batch_size_per_gpu=2",
            f"{ARR}.actor.ppo_epochs=3",
            f"{ARR}.actor.clip_ratio_high=0.28",
            f"{ARR}.actor.loss_agg_mode=seq-mean-token-mean",
            f"{ARR}.actor.entropy_coeff=0.001",
            f"{ARR}.actor.use_kl_loss=true",
            f"{ARR}.actor.kl_loss_coef=0.01",
            f"{ARR}.actor.grad_clip=0.5",
            f"{ARR}.actor.policy_loss.loss_mode=geo_mean",
            f"{ARR}.actor.optim.lr=2e-6",
            f"{ARR}.actor.optim.lr_warmup_steps_ratio=0.1",
            f"{ARR}.actor.optim.lr_scheduler_type=cosine",
            f"{ARR}.actor.optim.min_lr_ratio=0.2",
            f"{ARR}.rollout.n=5",
            f"{ARR}.rollout.temperature=0.9",
            f"{ARR}.model.use_remove_padding=true",
            "algorithm.gamma=0.99",
            "algorithm.lam=0.95",
            "critic.ppo_mini_batch_size=4",
            "critic.cliprange_value=0.2",
            "data.train_batch_size=8",
            "data.max_response_length=256",
            "trainer.total_training_steps=100",
            "trainer.seed=7",
        ],
    )
    s = LearnerSettings.from_config(cfg, total_training_steps=None)
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
    # the defaults are the config's; disabled correction means no IS weights; dynamic batches are refused
    assert LearnerSettings.from_config(default_config(), total_training_steps=None) == LearnerSettings.defaults()
    assert (
        LearnerSettings.from_config(load_config(None, [f"{RC}.rollout_is=null"]), total_training_steps=None).rollout_is
        is None
    )
    icepop = LearnerSettings.from_config(
        load_config(None, [f"{RC}.rollout_is=sequence", f"{RC}.rollout_is_threshold=0.5_5.0"]),
        total_training_steps=None,
    )
    assert (icepop.rollout_is, icepop.rollout_is_threshold) == ("sequence", "0.5_5.0")
    for key in (f"{ARR}.actor.use_dynamic_bsz", f"{ARR}.ref.log_prob_use_dynamic_bsz", "critic.use_dynamic_bsz"):
        with pytest.raises(ValueError, match=key.replace(".", r"\.")):
            LearnerSettings.from_config(load_config(None, [f"{key}=true"]), total_training_steps=None)


def test_every_setting_comes_from_its_config_key() -> None:
    """Each field of LearnerSettings changes with the config key it is read from: no default of its own, no key
    left unread (param_dtype and max_consecutive_nonfinite included)."""
    keys: dict[str, tuple[str, object, object]] = {  # field: (key, value, the field's value)
        "ppo_mini_batch_size": (f"{ARR}.actor.ppo_mini_batch_size", 4, 4),
        "ppo_micro_batch_size_per_gpu": (f"{ARR}.actor.ppo_micro_batch_size_per_gpu", 2, 2),
        "log_prob_micro_batch_size_per_gpu": (f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu", 4, 4),
        "ppo_epochs": (f"{ARR}.actor.ppo_epochs", 2, 2),
        "shuffle": (f"{ARR}.actor.shuffle", True, True),
        "rollout_n": (f"{ARR}.rollout.n", 2, 2),
        "temperature": (f"{ARR}.rollout.temperature", 0.7, 0.7),
        "max_prompt_length": ("data.max_prompt_length", 20, 20),
        "max_response_length": ("data.max_response_length", 12, 12),
        "use_remove_padding": (f"{ARR}.model.use_remove_padding", True, True),
        "enable_gradient_checkpointing": (f"{ARR}.model.enable_gradient_checkpointing", False, False),
        "clip_ratio": (f"{ARR}.actor.clip_ratio", 0.3, 0.3),
        "clip_ratio_low": (f"{ARR}.actor.clip_ratio_low", 0.1, 0.1),
        "clip_ratio_high": (f"{ARR}.actor.clip_ratio_high", 0.25, 0.25),
        "clip_ratio_c": (f"{ARR}.actor.clip_ratio_c", 4.0, 4.0),
        "loss_agg_mode": (f"{ARR}.actor.loss_agg_mode", "token-sum", "token-sum"),
        "loss_mode": (f"{ARR}.actor.policy_loss.loss_mode", "gspo", "gspo"),
        "mask_truncated_responses": (f"{ARR}.actor.mask_truncated_responses", True, True),
        "entropy_coeff": (f"{ARR}.actor.entropy_coeff", 0.01, 0.01),
        "use_kl_loss": (f"{ARR}.actor.use_kl_loss", True, True),
        "kl_loss_coef": (f"{ARR}.actor.kl_loss_coef", 0.5, 0.5),
        "kl_loss_type": (f"{ARR}.actor.kl_loss_type", "k3", "k3"),
        "grad_clip": (f"{ARR}.actor.grad_clip", 0.5, 0.5),
        "adv_estimator": ("algorithm.adv_estimator", "grpo", "grpo"),
        "gamma": ("algorithm.gamma", 0.9, 0.9),
        "lam": ("algorithm.lam", 0.9, 0.9),
        "norm_adv_by_std_in_grpo": ("algorithm.norm_adv_by_std_in_grpo", False, False),
        "use_kl_in_reward": ("algorithm.use_kl_in_reward", True, True),
        "kl_penalty": ("algorithm.kl_penalty", "k2", "k2"),
        "kl_ctrl_type": ("algorithm.kl_ctrl.type", "adaptive", "adaptive"),
        "kl_coef": ("algorithm.kl_ctrl.kl_coef", 0.2, 0.2),
        "kl_target": ("algorithm.kl_ctrl.target_kl", 0.3, 0.3),
        "kl_horizon": ("algorithm.kl_ctrl.horizon", 50, 50),
        "loss_scale_factor": (f"{ARR}.actor.loss_scale_factor", 64.0, 64.0),
        "rollout_is": (f"{RC}.rollout_is", "sequence", "sequence"),
        "rollout_is_threshold": (f"{RC}.rollout_is_threshold", 3.0, 3.0),
        "is_batch_normalize": (f"{RC}.rollout_is_batch_normalize", True, True),
        "rollout_rs": (f"{RC}.rollout_rs", "token_k1", "token_k1"),
        "rollout_rs_threshold": (f"{RC}.rollout_rs_threshold", "0.5_2.0", "0.5_2.0"),
        "bypass_mode": (f"{RC}.bypass_mode", True, True),
        "max_consecutive_nonfinite": (f"{ARR}.actor.max_consecutive_nonfinite", 2, 2),
        "param_dtype": (f"{ARR}.actor.fsdp_config.mixed_precision.param_dtype", "fp32", "fp32"),
        "use_shared_prompt": (f"{ARR}.model.use_shared_prompt", False, False),
        "seed": ("trainer.seed", 5, 5),
    }
    needs = {  # other keys a value needs to be valid
        "rollout_n": ["data.train_batch_size=8", f"{ARR}.actor.ppo_mini_batch_size=4"],
        "rollout_rs": [f"{RC}.rollout_rs_threshold=0.5_2.0"],
        "rollout_rs_threshold": [f"{RC}.rollout_rs=token_k1"],
        "adv_estimator": [f"{ARR}.rollout.n=2"],
    }
    default = LearnerSettings.defaults()
    for name, (key, value, expected) in keys.items():
        assert getattr(default, name) != expected, f"{name}: pick a non-default value"
        got = LearnerSettings.from_config(
            load_config(None, [f"{key}={value}", *needs.get(name, [])]), total_training_steps=None
        )
        assert getattr(got, name) == expected, key
    bypass = load_config(None, [f"{RC}.bypass_mode=true", f"{RC}.loss_type=reinforce"])
    assert LearnerSettings.from_config(bypass, total_training_steps=None).bypass_loss_type == "reinforce"
    assert LearnerSettings.from_config(default_config(), pad_token_id=3, total_training_steps=None).pad_token_id == 3
    not_keys = {"optim", "critic", "bypass_loss_type", "pad_token_id", "lora"}  # sections, the two checked above
    assert set(keys) | not_keys == {f.name for f in dataclasses.fields(LearnerSettings)}
    # lora: one spec from actor_rollout_ref.model.{lora_rank, lora_alpha, target_modules, exclude_modules}
    assert LearnerSettings.from_config(default_config(), total_training_steps=None).lora is None
    lora = LearnerSettings.from_config(
        load_config(
            None,
            [
                "actor_rollout_ref.model.lora_rank=4",
                "actor_rollout_ref.model.lora_alpha=12",
                "actor_rollout_ref.model.target_modules=[q_proj,v_proj]",
                "actor_rollout_ref.model.exclude_modules=[layers.0.self_attn.q_proj]",
            ],
        ),
        total_training_steps=None,
    ).lora
    assert lora == LoRASpec(4, 12.0, ("q_proj", "v_proj"), ("layers.0.self_attn.q_proj",))
    assert lora.scaling == 3.0


def test_critic_settings_come_from_the_critic_section() -> None:
    cfg = load_config(None, ["critic.shuffle=true", "critic.ppo_epochs=2", "critic.optim.lr=3e-5"])
    critic = LearnerSettings.from_config(cfg, total_training_steps=None).critic
    assert critic is not None and (critic.shuffle, critic.ppo_epochs, critic.optim.lr) == (True, 2, 3e-5)
    inherited = LearnerSettings.from_config(
        load_config(None, [f"{ARR}.actor.shuffle=true"]), total_training_steps=None
    ).critic
    assert inherited is not None and inherited.shuffle  # null = the actor's
    assert LearnerSettings.defaults(adv_estimator="grpo").critic is None


def test_from_config_accepts_the_real_config_tree() -> None:
    from async_rl.config import load_config

    cfg = load_config(["configs/demo_ppo.yaml"], [])
    s = LearnerSettings.from_config(cfg, total_training_steps=None)
    assert s.ppo_mini_batch_size == cfg.actor_rollout_ref.actor.ppo_mini_batch_size
    assert s.rollout_n == cfg.actor_rollout_ref.rollout.n
    assert s.adv_estimator == cfg.algorithm.adv_estimator
    assert (s.critic is not None) is (cfg.algorithm.adv_estimator == "gae")
