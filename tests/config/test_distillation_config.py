"""The distillation section: verl's keys and defaults, and every rule naming its key."""

from __future__ import annotations

import pytest

from async_rl.config import ConfigError, load_config, load_config_with_warnings

ON = ["distillation.enabled=true", "distillation.teacher_model.model_path=builtin:tiny-arith"]


def _error(*overrides: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config([], list(overrides))
    return str(info.value)


def test_verl_defaults() -> None:
    d = load_config([], []).distillation
    loss = d.distillation_loss
    assert not d.enabled and d.teacher_model.model_path is None
    assert (loss.loss_mode, loss.topk, loss.use_task_rewards, loss.use_policy_gradient) == ("k3", 128, True, True)
    assert (loss.distillation_loss_coef, loss.loss_max_clamp, loss.log_prob_min_clamp) == (1.0, 10.0, -10.0)
    assert (loss.clip_ratio, loss.clip_ratio_low, loss.clip_ratio_high, loss.policy_loss_mode) == (
        0.2,
        0.2,
        0.2,
        "vanilla",
    )


def test_enabled_needs_a_teacher() -> None:
    assert "distillation.teacher_model.model_path" in _error("distillation.enabled=true")
    assert "builtin:nope" in _error("distillation.enabled=true", "distillation.teacher_model.model_path=builtin:nope")


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("distillation.distillation_loss.loss_mode=forward_kl_topk", "top-k distribution"),
        ("distillation.distillation_loss.loss_mode=bogus", "loss_mode must be one of"),
        ("distillation.distillation_loss.policy_loss_mode=gspo", "policy_loss_mode must be 'vanilla'"),
        ("distillation.distillation_loss.clip_ratio_high=1.5", "clip_ratio_high must be in (0, 1)"),
        ("rejection_sampling.enable=true", "rejection_sampling.enable=true trains nothing"),
    ],
)
def test_rules_name_their_key(override: str, needle: str) -> None:
    extra = ["trainer.n_gpus_per_node=1"] if override.startswith("rejection") else []
    assert needle in _error(*ON, override, *extra)


def test_k1_cannot_be_back_propagated_directly() -> None:
    error = _error(
        *ON, "distillation.distillation_loss.loss_mode=k1", "distillation.distillation_loss.use_policy_gradient=false"
    )
    assert "does not depend on the teacher" in error
    cfg = load_config([], [*ON, "distillation.distillation_loss.loss_mode=k1"])  # with the policy gradient: fine
    assert cfg.distillation.distillation_loss.loss_mode == "k1"


def test_the_top_k_size_is_accepted_and_warned_about() -> None:
    _, warnings = load_config_with_warnings([], [*ON, "distillation.distillation_loss.topk=64"])
    assert any("distillation.distillation_loss.topk" in w for w in warnings)


def test_nothing_is_checked_while_disabled() -> None:
    cfg = load_config([], ["distillation.distillation_loss.loss_mode=forward_kl_topk"])
    assert not cfg.distillation.enabled


def test_the_memory_rule_is_the_actor_placements_only() -> None:
    big = "distillation.teacher_model.inference.gpu_memory_utilization=0.6"
    assert "gpu_memory_utilization = 1.10" in _error(*ON, big, "distillation.teacher_model.placement=actor")
    cfg = load_config([], [*ON, big])
    assert cfg.distillation.teacher_model.placement == "learner"  # the default: no teacher engine to fit
    assert "placement" in _error(*ON, "distillation.teacher_model.placement=gpu")
