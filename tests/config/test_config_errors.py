"""Every config error names the full dotted key (and the allowed values or rule)."""

from __future__ import annotations

import pytest

from async_rl.config import ConfigError, load_config, load_config_with_warnings

ARR = "actor_rollout_ref"


def _error(*overrides: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(None, list(overrides))
    assert isinstance(info.value, ValueError)
    return str(info.value)


def test_unknown_key_with_suggestion() -> None:
    msg = _error("data.train_batch_sze=8")
    assert "data.train_batch_sze" in msg
    assert "did you mean `data.train_batch_size`" in msg


def test_unknown_key_in_wrong_section_suggests_where_it_lives() -> None:
    msg = _error("trainer.ppo_epochs=2")
    assert "trainer.ppo_epochs" in msg
    assert f"{ARR}.actor.ppo_epochs" in msg and "critic.ppo_epochs" in msg


def test_unknown_top_level_section() -> None:
    assert "unknown config key `foo`" in _error("foo.bar=1")


def test_wrong_type_names_key_and_type() -> None:
    msg = _error("data.train_batch_size=abc")
    assert "data.train_batch_size" in msg and "int" in msg and "'abc'" in msg


def test_out_of_range_names_key_and_bound() -> None:
    msg = _error("data.train_batch_size=0")
    assert "data.train_batch_size" in msg and ">= 1" in msg and "got int 0" in msg


@pytest.mark.parametrize(
    ("override", "key", "allowed"),
    [
        ("algorithm.adv_estimator=ppo", "algorithm.adv_estimator", ["'gae'", "'grpo'", "'rloo_vectorized'"]),
        (f"{ARR}.actor.kl_loss_type=k9", f"{ARR}.actor.kl_loss_type", ["'low_var_kl'", "'k3+'", "'abs'"]),
        ("algorithm.kl_penalty=full", "algorithm.kl_penalty", ["'kl'", "'mse+'"]),
        (f"{ARR}.actor.loss_agg_mode=mean", f"{ARR}.actor.loss_agg_mode", ["'seq-mean-token-sum-norm'"]),
        (f"{ARR}.actor.policy_loss.loss_mode=gpg", f"{ARR}.actor.policy_loss.loss_mode", ["'geo_mean'"]),
        (f"{ARR}.rollout.name=sglang", f"{ARR}.rollout.name", ["'vllm'"]),
        ("algorithm.kl_ctrl.type=pid", "algorithm.kl_ctrl.type", ["'adaptive'"]),
        ("algorithm.rollout_correction.is_level=batch", "algorithm.rollout_correction.is_level", ["'geometric'"]),
        ("async_training.stale_policy=keep", "async_training.stale_policy", ["'regrant'"]),
        ("async_training.actor.logprobs_mode=x", "async_training.actor.logprobs_mode", ["'processed'", "'raw'"]),
        (
            f"{ARR}.actor.fsdp_config.mixed_precision.param_dtype=bfloat16",
            f"{ARR}.actor.fsdp_config.mixed_precision.param_dtype",
            ["'auto'", "'bf16'", "'fp32'"],
        ),
    ],
)
def test_bad_enum_lists_allowed_values(override: str, key: str, allowed: list[str]) -> None:
    msg = _error(override)
    assert f"`{key}`" in msg
    for value in allowed:
        assert value in msg


def test_bad_list_item_names_index_and_allowed() -> None:
    msg = _error("trainer.logger=[console,mlflow]")
    assert "trainer.logger[1]" in msg and "'mlflow'" in msg and "'wandb'" in msg


def test_train_batch_not_divisible_by_mini_batch() -> None:
    msg = _error("data.train_batch_size=10", f"{ARR}.actor.ppo_mini_batch_size=4")
    assert "data.train_batch_size (10)" in msg and f"{ARR}.actor.ppo_mini_batch_size (4" in msg


def test_micro_batch_must_divide_per_rank_mini_batch() -> None:
    # 4 prompts x n=3 = 12 sequences over 2 ranks = 6 per rank; 4 does not divide 6.
    msg = _error(
        f"{ARR}.actor.ppo_mini_batch_size=4",
        "data.train_batch_size=8",
        f"{ARR}.rollout.n=3",
        "trainer.n_gpus_per_node=2",
        f"{ARR}.actor.ppo_micro_batch_size_per_gpu=4",
    )
    assert f"{ARR}.actor.ppo_micro_batch_size_per_gpu (4)" in msg and "= 6 sequences" in msg


def test_mini_batch_sequences_must_split_over_ranks() -> None:
    # 8 prompts x n=1 = 8 sequences cannot be split evenly over 3 ranks.
    msg = _error("trainer.n_gpus_per_node=3")
    assert f"{ARR}.actor.ppo_mini_batch_size (8)" in msg and "trainer.n_gpus_per_node" in msg


def test_micro_batch_global_and_per_gpu_both_set() -> None:
    msg = _error(f"{ARR}.actor.ppo_micro_batch_size=8", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=8")
    assert f"{ARR}.actor.ppo_micro_batch_size (8)" in msg and "ppo_micro_batch_size_per_gpu (8)" in msg


def test_dynamic_bsz_token_budget_must_fit_one_sequence() -> None:
    # default lengths: 16 prompt + 8 response = 24 tokens > 20
    msg = _error(f"{ARR}.actor.use_dynamic_bsz=true", f"{ARR}.actor.ppo_max_token_len_per_gpu=20")
    assert f"{ARR}.actor.ppo_max_token_len_per_gpu (20)" in msg and "(24)" in msg


def test_critic_mini_batch_divisibility() -> None:
    msg = _error("critic.ppo_mini_batch_size=5")
    assert "critic.ppo_mini_batch_size (5" in msg


@pytest.mark.parametrize(
    ("override", "key"),
    [
        (f"{ARR}.actor.clip_ratio_c=1.0", f"{ARR}.actor.clip_ratio_c"),
        (f"{ARR}.actor.clip_ratio=0", f"{ARR}.actor.clip_ratio"),
        (f"{ARR}.actor.clip_ratio_high=-0.1", f"{ARR}.actor.clip_ratio_high"),
        (f"{ARR}.actor.clip_ratio_low=1.0", f"{ARR}.actor.clip_ratio_low"),
        (f"{ARR}.rollout.top_p=0", f"{ARR}.rollout.top_p"),
        (f"{ARR}.rollout.top_p=1.5", f"{ARR}.rollout.top_p"),
        (f"{ARR}.rollout.top_k=0", f"{ARR}.rollout.top_k"),
        (f"{ARR}.rollout.top_k=-2", f"{ARR}.rollout.top_k"),
        (f"{ARR}.rollout.val_kwargs.top_k=0", f"{ARR}.rollout.val_kwargs.top_k"),
        (f"{ARR}.rollout.val_kwargs.n=0", f"{ARR}.rollout.val_kwargs.n"),
        ("data.val_max_samples=0", "data.val_max_samples"),
        ("data.val_max_samples=-2", "data.val_max_samples"),
        ("trainer.test_freq=-2", "trainer.test_freq"),
        ("async_training.timeouts.validation_s=0", "async_training.timeouts.validation_s"),
        (f"{ARR}.rollout.temperature=-0.5", f"{ARR}.rollout.temperature"),
        (f"{ARR}.rollout.n=0", f"{ARR}.rollout.n"),
        (f"{ARR}.rollout.gpu_memory_utilization=1.2", f"{ARR}.rollout.gpu_memory_utilization"),
        (f"{ARR}.rollout.response_length=99", f"{ARR}.rollout.response_length"),
        (f"{ARR}.rollout.max_model_len=10", f"{ARR}.rollout.max_model_len"),
        (f"{ARR}.actor.optim.betas=[0.9,1.0]", f"{ARR}.actor.optim.betas"),
        ("async_training.max_staleness=-1", "async_training.max_staleness"),
        ("async_training.weight_sync.bucket_size_mb=0", "async_training.weight_sync.bucket_size_mb"),
        ("async_training.transport.port=70000", "async_training.transport.port"),
        ("async_training.transport.peer_timeout_s=1", "async_training.transport.peer_timeout_s"),
        ("async_training.transport.max_inflight_groups=4", "async_training.transport.max_inflight_groups"),
        ("async_training.transport.max_message_bytes=32", "async_training.transport.max_message_bytes"),  # < 1x8x8
        ("async_training.transport.max_message_bytes=1000", "async_training.transport.max_message_bytes"),  # < 1024
        ("async_training.transport.host=''", "async_training.transport.host"),
        ("async_training.transport.curve_server_public_key=''", "async_training.transport.curve_server_public_key"),
        ("async_training.stale_policy=keep", "async_training.stale_policy"),
        ("algorithm.rollout_correction.is_threshold=0.5", "algorithm.rollout_correction.is_threshold"),
        ("algorithm.rollout_correction.is_threshold_lower=3", "algorithm.rollout_correction.is_threshold_lower"),
        ("reward.function=not_a_spec", "reward.function"),
        ("trainer.resume_mode=resume_path", "trainer.resume_from_path"),
    ],
)
def test_range_and_rule_errors_name_the_key(override: str, key: str) -> None:
    assert key in _error(override)


def test_run_must_be_bounded() -> None:
    msg = _error("trainer.total_epochs=null", "trainer.total_training_steps=null")
    assert "trainer.total_epochs" in msg and "trainer.total_training_steps" in msg


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "rloo_vectorized", "reinforce_plus_plus_baseline"])
def test_group_estimators_need_n_at_least_2(estimator: str) -> None:
    msg = _error(f"algorithm.adv_estimator={estimator}", f"{ARR}.rollout.n=1")
    assert "algorithm.adv_estimator" in msg and f"{ARR}.rollout.n >= 2" in msg


def test_reinforce_plus_plus_allows_n_1() -> None:
    assert load_config(None, ["algorithm.adv_estimator=reinforce_plus_plus"]).actor_rollout_ref.rollout.n == 1


def test_critic_less_estimator_rejects_changed_critic_settings() -> None:
    msg = _error(
        "algorithm.adv_estimator=grpo",
        f"{ARR}.rollout.n=4",
        "critic.optim.lr=1e-4",
        "critic.cliprange_value=0.2",
        "trainer.critic_warmup=5",
    )
    assert "critic.optim.lr" in msg and "critic.cliprange_value" in msg and "trainer.critic_warmup" in msg
    assert "critic.grad_clip" not in msg  # unchanged keys are not listed


def test_gae_needs_a_critic_model() -> None:
    assert "critic.model.path" in _error("critic.model.path=null")
    # A real policy with the builtin (default) critic is a forgotten critic.model.path.
    assert "critic.model.path" in _error(f"{ARR}.model.path=Qwen/Qwen2.5-0.5B-Instruct")


def test_non_loopback_host_needs_curve_keys_and_explains_how() -> None:
    msg = _error("async_training.transport.host=0.0.0.0")
    assert "async_training.transport.host" in msg
    assert "python -m async_rl.transport.keys DIR" in msg
    assert "curve_server_secret_key" in msg


def test_partial_curve_keys_are_rejected() -> None:
    msg = _error("async_training.transport.curve_server_secret_key=/k/server.key_secret")
    assert "curve_client_public_key" in msg and "curve_server_secret_key" not in msg.split("missing:")[1].split(";")[0]


def test_non_loopback_host_with_all_keys_is_accepted() -> None:
    keys = [
        f"async_training.transport.{k}=/keys/{k}"
        for k in (
            "curve_server_secret_key",
            "curve_server_public_key",
            "curve_client_keys_dir",
            "curve_client_secret_key",
            "curve_client_public_key",
        )
    ]
    cfg = load_config(None, ["async_training.transport.host=10.0.0.5", *keys])
    assert cfg.async_training.transport.host == "10.0.0.5"


def test_nccl_on_cpu_is_rejected() -> None:
    msg = _error("trainer.device=cpu", "async_training.weight_sync.backend=nccl")
    assert "async_training.weight_sync.backend" in msg and "trainer.device" in msg


def test_checkpoint_alias_conflict() -> None:
    msg = _error("trainer.save_freq=10", "async_training.checkpoint.save_every_n_steps=20")
    assert "async_training.checkpoint.save_every_n_steps" in msg and "trainer.save_freq" in msg


def test_several_errors_are_reported_together() -> None:
    msg = _error(f"{ARR}.actor.clip_ratio_c=0.5", f"{ARR}.rollout.top_k=0")
    assert msg.startswith("2 config errors")
    assert f"{ARR}.actor.clip_ratio_c" in msg and f"{ARR}.rollout.top_k" in msg


def test_warnings_noop_keys_and_double_kl() -> None:
    _, warnings = load_config_with_warnings(
        None,
        [
            "data.return_raw_chat=True",
            "critic.model.lora_rank=8",
            "reward_model.launch_reward_fn_async=true",
            f"{ARR}.actor.use_kl_loss=true",
            "algorithm.use_kl_in_reward=true",
        ],
    )
    noop = [w for w in warnings if "no effect" in w]
    assert len(noop) == 1  # one start-up warning naming every such key
    for key in ("data.return_raw_chat", "critic.model.lora_rank", "reward_model.launch_reward_fn_async"):
        assert key in noop[0]
    assert any("algorithm.use_kl_in_reward" in w and "use_kl_loss" in w for w in warnings)


def test_noop_key_at_default_value_does_not_warn() -> None:
    _, warnings = load_config_with_warnings(None, ["data.return_raw_chat=False"])
    assert warnings == []


def test_validation_warnings_name_the_ignored_keys() -> None:
    _, warnings = load_config_with_warnings(None, [f"{ARR}.rollout.val_kwargs.n=4"])
    assert warnings == [
        f"{ARR}.rollout.val_kwargs.n are ignored with {ARR}.rollout.val_kwargs.do_sample=false: validation decodes"
        " greedily, one sample per prompt (set do_sample=true to sample)"
    ]
    _, warnings = load_config_with_warnings(
        None, [f"{ARR}.rollout.val_kwargs.n=4", f"{ARR}.rollout.val_kwargs.do_sample=true"]
    )
    assert warnings == []
    _, warnings = load_config_with_warnings(None, ["data.val_files=null", "trainer.test_freq=5"])
    assert warnings == ["trainer.test_freq=5 is ignored: data.val_files is null, so nothing is validated"]
    _, warnings = load_config_with_warnings(None, ["trainer.test_freq=5", "data.val_max_samples=8"])
    assert warnings == []  # the validation keys have an effect: none is reported as a no-op


def test_validation_group_must_fit_in_a_message() -> None:
    msg = _error(
        f"{ARR}.rollout.val_kwargs.do_sample=true", f"{ARR}.rollout.val_kwargs.n=200",
        "async_training.transport.max_message_bytes=4096",
    )  # fmt: skip
    assert "async_training.transport.max_message_bytes (4096)" in msg and f"{ARR}.rollout.val_kwargs.n=200" in msg


def test_disabled_correction_with_staleness_warns() -> None:
    _, warnings = load_config_with_warnings(None, ["algorithm.rollout_correction.enable=false"])
    assert any("algorithm.rollout_correction.enable" in w for w in warnings)


def test_gradient_checkpointing_interval_without_checkpointing_warns() -> None:
    _, warnings = load_config_with_warnings(
        None,
        [
            "actor_rollout_ref.model.enable_gradient_checkpointing=false",
            "actor_rollout_ref.model.gradient_checkpointing_interval=3",
        ],
    )
    assert any("gradient_checkpointing_interval=3 has no effect" in w for w in warnings)
    _, warnings = load_config_with_warnings(
        None,
        [
            "actor_rollout_ref.model.enable_gradient_checkpointing=false",
            "actor_rollout_ref.model.gradient_checkpointing_interval=auto",
        ],
    )
    assert any("gradient_checkpointing_interval=auto has no effect" in w for w in warnings)
    _, warnings = load_config_with_warnings(None, ["actor_rollout_ref.model.gradient_checkpointing_interval=auto"])
    assert not any("gradient_checkpointing_interval" in w for w in warnings)  # checkpointing is on by default


def test_gradient_checkpointing_interval_takes_a_positive_number_or_auto() -> None:
    for bad in ("0", "every"):
        with pytest.raises(ConfigError, match="gradient_checkpointing_interval"):
            load_config(None, [f"actor_rollout_ref.model.gradient_checkpointing_interval={bad}"])
