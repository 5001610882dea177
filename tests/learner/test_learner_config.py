"""What the learner takes from the config: the schedule by hand, the objective's spec, the adapter, the start-up values,
and the rules that config validation (not the learner) enforces."""

from __future__ import annotations

import pytest
from _learner_testlib import START, settings, tiny_policy

from async_rl.config import ConfigError, default_config, load_config
from async_rl.config.common import OptimConfig
from async_rl.config.resolve import LearnerStart, learner_start
from async_rl.learner import Learner, local_context
from async_rl.learner.lora import lora_spec
from async_rl.learner.objective_spec import objective_spec
from async_rl.learner.optim import check_schedule, lr_factor, schedule_span
from async_rl.peft_format import LoRASpec

ARR = "actor_rollout_ref"
RC = "algorithm.rollout_correction"


def test_lr_schedule_by_hand() -> None:
    cos = OptimConfig(lr=1.0, lr_warmup_steps=2, lr_scheduler_type="cosine", min_lr_ratio=0.1, total_training_steps=10)
    # warm-up: (step + 1) / 2
    assert lr_factor(0, cos, run_steps=0) == pytest.approx(0.5)
    assert lr_factor(1, cos, run_steps=0) == pytest.approx(1.0)
    # progress (step - 2) / 8: step 2 -> 0 -> 1.0; step 6 -> 0.5 -> 0.1 + 0.9 * 0.5 * (1 + cos(pi/2)) = 0.55
    assert lr_factor(2, cos, run_steps=0) == pytest.approx(1.0)
    assert lr_factor(6, cos, run_steps=0) == pytest.approx(0.55)
    assert lr_factor(10, cos, run_steps=0) == pytest.approx(0.1)
    assert lr_factor(50, cos, run_steps=0) == pytest.approx(0.1)  # clipped after the end
    # one full period (num_cycles=1): progress 0.5 -> cos(pi) = -1 -> floor 0.1; progress 1 -> back to 1.0
    full = OptimConfig(lr=1.0, lr_scheduler_type="cosine", min_lr_ratio=0.1, num_cycles=1.0, total_training_steps=8)
    assert lr_factor(4, full, run_steps=0) == pytest.approx(0.1)
    assert lr_factor(8, full, run_steps=0) == pytest.approx(1.0)
    const = OptimConfig(lr=1.0, lr_warmup_steps=4)
    assert [lr_factor(s, const, run_steps=0) for s in (0, 3, 4, 100)] == [0.25, 1.0, 1.0, 1.0]


def test_the_run_length_is_the_horizon_unless_the_section_sets_one() -> None:
    # total_training_steps -1 (the default): the run's length; a warm-up of -1 steps is the ratio of it
    ratio = OptimConfig(lr_warmup_steps=-1, lr_warmup_steps_ratio=0.1, lr_scheduler_type="cosine")
    assert schedule_span(ratio, run_steps=100) == (10, 100)
    assert lr_factor(4, ratio, run_steps=100) == pytest.approx(0.5)
    own = OptimConfig(lr_warmup_steps=-1, lr_warmup_steps_ratio=0.1, total_training_steps=40)
    assert schedule_span(own, run_steps=100) == (4, 40)
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.actor\.optim\.lr_scheduler_type=cosine needs a horizon"):
        check_schedule(ratio, run_steps=0, section="actor_rollout_ref.actor.optim")
    check_schedule(OptimConfig(), run_steps=0, section="x")  # constant: no horizon needed


@pytest.mark.parametrize(
    ("override", "match"),
    [
        (f"{ARR}.actor.ppo_mini_batch_size=0", "ppo_mini_batch_size"),
        (f"{ARR}.actor.ppo_epochs=0", "ppo_epochs"),
        (f"{ARR}.actor.loss_agg_mode=mean", "loss_agg_mode"),
        (f"{ARR}.rollout.temperature=0", "temperature"),
        (f"{ARR}.actor.grad_clip=0", "grad_clip"),
        (f"{ARR}.actor.max_consecutive_nonfinite=0", "max_consecutive_nonfinite"),
        (f"{ARR}.actor.optim.lr_scheduler_type=linear", "lr_scheduler_type"),
        (f"{ARR}.actor.fsdp_config.mixed_precision.param_dtype=fp16", "param_dtype"),
        (f"{RC}.rollout_is=batch", "rollout_is"),
        (f"{RC}.loss_type=dpo", "loss_type"),
        ("critic.ppo_epochs=0", "critic.ppo_epochs"),
    ],
)
def test_the_config_rejects_what_the_learner_cannot_run(override: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(None, [override])


@pytest.mark.parametrize(
    "key", [f"{ARR}.actor.use_dynamic_bsz", f"{ARR}.ref.log_prob_use_dynamic_bsz", "critic.use_dynamic_bsz"]
)
def test_dynamic_batches_are_refused_by_validation(key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.") + "=true is not supported by the learner yet"):
        load_config(None, [f"{key}=true"])


def test_objective_spec_reads_the_actor_and_correction_sections() -> None:
    cfg = load_config(
        None,
        [
            f"{ARR}.actor.clip_ratio_high=0.28",
            f"{ARR}.actor.clip_ratio_c=4.0",
            f"{ARR}.actor.loss_agg_mode=seq-mean-token-mean",
            f"{ARR}.actor.loss_scale_factor=64",
            f"{ARR}.actor.entropy_coeff=0.001",
            f"{ARR}.actor.use_kl_loss=true",
            f"{ARR}.actor.kl_loss_coef=0.01",
            f"{ARR}.actor.kl_loss_type=k3",
            f"{ARR}.actor.policy_loss.loss_mode=geo_mean",
            f"{RC}.rollout_is=sequence",
            f"{RC}.rollout_is_threshold=0.5_5.0",
            f"{RC}.rollout_is_batch_normalize=true",
            f"{RC}.rollout_rs=token_k1",
            f"{RC}.rollout_rs_threshold=0.5_2.0",
        ],
    )
    spec = objective_spec(cfg.actor_rollout_ref.actor, cfg.algorithm.rollout_correction, cfg.distillation)
    assert (spec.loss_mode, spec.clip_ratio, spec.clip_ratio_low, spec.clip_ratio_high, spec.clip_ratio_c) == (
        "geo_mean",
        0.2,
        0.2,  # null clip_ratio_low resolves to clip_ratio
        0.28,
        4.0,
    )
    assert (spec.loss_agg_mode, spec.loss_scale_factor, spec.entropy_coeff) == ("seq-mean-token-mean", 64.0, 0.001)
    assert (spec.kl_loss_coef, spec.kl_loss_type) == (0.01, "k3")
    # the IcePop threshold string is parsed here, once: (upper, lower)
    assert (spec.rollout_is, spec.is_upper, spec.is_lower, spec.is_batch_normalize) == ("sequence", 5.0, 0.5, True)
    assert spec.rs_bounds == {"token_k1": (0.5, 2.0)}
    assert spec.bypass_loss_type is None
    default = default_config()
    plain = objective_spec(default.actor_rollout_ref.actor, default.algorithm.rollout_correction, default.distillation)
    assert (plain.kl_loss_coef, plain.rs_bounds, plain.is_upper, plain.is_lower) == (None, None, 2.0, None)
    bypass = load_config(None, [f"{RC}.bypass_mode=true", f"{RC}.loss_type=reinforce"])
    bypass_spec = objective_spec(
        bypass.actor_rollout_ref.actor, bypass.algorithm.rollout_correction, bypass.distillation
    )
    assert bypass_spec.bypass_loss_type == "reinforce" and bypass_spec.distill is None


def test_lora_spec_from_the_model_section() -> None:
    assert lora_spec(default_config().actor_rollout_ref.model) is None
    cfg = load_config(
        None,
        [
            f"{ARR}.model.lora_rank=4",
            f"{ARR}.model.lora_alpha=12",
            f"{ARR}.model.target_modules=[q_proj,v_proj]",
            f"{ARR}.model.exclude_modules=[layers.0.self_attn.q_proj]",
        ],
    )
    lora = lora_spec(cfg.actor_rollout_ref.model)
    assert lora == LoRASpec(4, 12.0, ("q_proj", "v_proj"), ("layers.0.self_attn.q_proj",))
    assert lora is not None and lora.scaling == 3.0


def test_learner_start_takes_the_run_length_from_the_trainer_unless_given() -> None:
    cfg = load_config(None, ["trainer.total_training_steps=30"])
    assert learner_start(cfg, pad_token_id=3, total_training_steps=None) == LearnerStart(3, 30)
    assert learner_start(cfg, pad_token_id=0, total_training_steps=12) == LearnerStart(0, 12)
    assert learner_start(default_config(), pad_token_id=0, total_training_steps=None).total_training_steps == 0


def test_the_learner_reads_its_sections() -> None:
    cfg = settings(
        use_shared_prompt=False, use_remove_padding=True, log_prob_micro_batch_size_per_gpu=3, seed=5, use_kl_loss=True
    )
    cfg.algorithm.use_kl_in_reward = True
    cfg.algorithm.kl_ctrl.type = "adaptive"
    learner = Learner(cfg, START, local_context(), tiny_policy)
    assert (learner.layout, learner.micro_forward, learner.seed, learner.lora) == ("packed", 3, 5, None)
    assert learner.ref is not None and learner.critic is None  # a KL term builds the reference; GRPO no critic
    assert type(learner.kl_ctrl).__name__ == "AdaptiveKLController"
    assert learner.objective.kl_loss_coef == cfg.actor_rollout_ref.actor.kl_loss_coef
    with pytest.raises(ValueError, match="needs a critic model"):
        Learner(settings(adv_estimator="gae", critic={"model.path": ""}), START, local_context(), tiny_policy)


def test_wrap_policy_min_num_params_groups_consecutive_decoder_layers() -> None:
    from torch import nn

    from async_rl.learner.model import layer_units

    layers = [nn.Linear(10, 10) for _ in range(7)]  # 110 parameters each
    assert [len(u) for u in layer_units(layers, 0)] == [1] * 7
    assert [len(u) for u in layer_units(layers, 300)] == [3, 3, 1]  # 330 >= 300; the last takes what is left
    assert [len(u) for u in layer_units(layers, 220)] == [2, 2, 2, 1]
    assert [len(u) for u in layer_units(layers, 10**9)] == [7]
    assert [m for u in layer_units(layers, 300) for m in u] == layers  # in order, each once
    cfg = load_config(None, ["actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params=35000000"])
    assert cfg.actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params == 35_000_000
    with pytest.raises(ConfigError, match="min_num_params"):
        load_config(None, ["actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params=-1"])
