"""help text, CLI flags, printing, and the torch-free import guarantee."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from async_rl.config import Config, ConfigError, config_to_dict, format_config, help_text, iter_schema, parse_cli
from async_rl.config.fields import NOOP_PREFIX

# Every verl key this system must honour (brief's list), with the dotted names verl documents.
REQUIRED_KEYS = """
data.train_batch_size data.max_prompt_length data.max_response_length data.train_files data.val_files
data.prompt_key data.shuffle data.seed actor_rollout_ref.model.path
actor_rollout_ref.model.enable_gradient_checkpointing actor_rollout_ref.model.use_remove_padding
actor_rollout_ref.rollout.n actor_rollout_ref.rollout.name actor_rollout_ref.rollout.tensor_model_parallel_size
actor_rollout_ref.rollout.temperature actor_rollout_ref.rollout.top_p actor_rollout_ref.rollout.top_k
actor_rollout_ref.rollout.response_length actor_rollout_ref.rollout.gpu_memory_utilization
actor_rollout_ref.rollout.max_num_seqs actor_rollout_ref.rollout.dtype actor_rollout_ref.rollout.enforce_eager
actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu actor_rollout_ref.rollout.val_kwargs.temperature
actor_rollout_ref.rollout.val_kwargs.top_p actor_rollout_ref.rollout.val_kwargs.top_k
actor_rollout_ref.rollout.val_kwargs.n actor_rollout_ref.rollout.val_kwargs.do_sample
actor_rollout_ref.actor.ppo_mini_batch_size actor_rollout_ref.actor.ppo_micro_batch_size
actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu actor_rollout_ref.actor.use_dynamic_bsz
actor_rollout_ref.actor.ppo_max_token_len_per_gpu actor_rollout_ref.actor.ppo_epochs actor_rollout_ref.actor.shuffle
actor_rollout_ref.actor.clip_ratio actor_rollout_ref.actor.clip_ratio_low actor_rollout_ref.actor.clip_ratio_high
actor_rollout_ref.actor.clip_ratio_c actor_rollout_ref.actor.loss_agg_mode actor_rollout_ref.actor.entropy_coeff
actor_rollout_ref.actor.use_kl_loss actor_rollout_ref.actor.kl_loss_coef actor_rollout_ref.actor.kl_loss_type
actor_rollout_ref.actor.grad_clip actor_rollout_ref.actor.policy_loss.loss_mode actor_rollout_ref.actor.optim.lr
actor_rollout_ref.actor.optim.lr_warmup_steps actor_rollout_ref.actor.optim.lr_warmup_steps_ratio
actor_rollout_ref.actor.optim.warmup_style actor_rollout_ref.actor.optim.lr_scheduler_type
actor_rollout_ref.actor.optim.min_lr_ratio actor_rollout_ref.actor.optim.weight_decay
actor_rollout_ref.actor.optim.betas actor_rollout_ref.actor.optim.total_training_steps
actor_rollout_ref.actor.strategy actor_rollout_ref.actor.fsdp_config.param_offload
actor_rollout_ref.actor.fsdp_config.optimizer_offload actor_rollout_ref.actor.fsdp_config.model_dtype
actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu actor_rollout_ref.ref.fsdp_config.param_offload
critic.model.path critic.model.enable_gradient_checkpointing critic.ppo_mini_batch_size critic.ppo_micro_batch_size
critic.ppo_micro_batch_size_per_gpu critic.ppo_epochs critic.cliprange_value critic.grad_clip critic.optim.lr
critic.optim.weight_decay critic.loss_agg_mode algorithm.gamma algorithm.lam algorithm.adv_estimator
algorithm.norm_adv_by_std_in_grpo algorithm.use_kl_in_reward algorithm.kl_penalty algorithm.kl_ctrl.type
algorithm.kl_ctrl.kl_coef algorithm.kl_ctrl.horizon algorithm.kl_ctrl.target_kl algorithm.rollout_correction.enable
algorithm.rollout_correction.is_level algorithm.rollout_correction.is_mode algorithm.rollout_correction.is_threshold
algorithm.rollout_correction.is_threshold_lower custom_reward_function.path custom_reward_function.name
reward.function reward.timeout_s trainer.project_name trainer.experiment_name trainer.total_epochs
trainer.total_training_steps trainer.logger trainer.save_freq trainer.test_freq trainer.default_local_dir
trainer.resume_mode trainer.resume_from_path trainer.n_gpus_per_node trainer.nnodes trainer.val_before_train
trainer.critic_warmup trainer.seed trainer.device async_training.num_actors async_training.max_staleness
async_training.update_mode async_training.stale_policy async_training.sync_every_n_steps
async_training.transport.host async_training.transport.port async_training.transport.max_message_bytes
async_training.transport.max_inflight_groups async_training.transport.heartbeat_interval_s
async_training.transport.peer_timeout_s async_training.transport.lease_timeout_s
async_training.transport.max_invalid_groups
async_training.transport.curve_server_secret_key async_training.transport.curve_server_public_key
async_training.transport.curve_client_keys_dir async_training.transport.curve_client_secret_key
async_training.transport.curve_client_public_key async_training.weight_sync.backend
async_training.weight_sync.bucket_size_mb async_training.weight_sync.timeout_s
async_training.weight_sync.master_addr async_training.weight_sync.master_port async_training.checkpoint.dir
async_training.checkpoint.save_every_n_steps async_training.checkpoint.keep_last async_training.checkpoint.save_hf
async_training.timeouts.actor_start_s async_training.timeouts.step_s async_training.actor.max_concurrent_groups
async_training.actor.logprobs_mode
""".split()


# Keys of that list that the code does not honour on their own yet, with what happens instead: each is a gap against
# the list, declared (a no-op, or a key whose value is replaced by the one used; both warn at start-up when set)
# rather than ignored in silence. Remove a key from here once it works.
NOT_YET_HONOURED = {
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": "no-op: dynamic batching is rejected",
    "actor_rollout_ref.actor.fsdp_config.param_offload": "no-op: no CPU offload",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": "no-op: no CPU offload",
    "actor_rollout_ref.actor.fsdp_config.model_dtype": "no-op: master weights are fp32",
    "actor_rollout_ref.ref.fsdp_config.param_offload": "no-op: no CPU offload",
    "trainer.critic_warmup": "no-op: the actor updates from the first step",
    "async_training.checkpoint.save_hf": "no-op: the HF model is written at the end of the run only",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": "rollout.log_prob_micro_batch_size_per_gpu is used",
    "critic.model.enable_gradient_checkpointing": "actor_rollout_ref.model.enable_gradient_checkpointing is used",
}


def test_help_lists_every_required_key_with_a_description() -> None:
    text = help_text()
    docs = {d.key: d for d in iter_schema() if not d.is_section}
    for key in REQUIRED_KEYS:
        assert f"  {key}: " in text, key
        assert docs[key].description, key
        if key in NOT_YET_HONOURED:
            assert docs[key].noop or "ignored with a start-up warning" in docs[key].description, key
        else:
            assert not docs[key].noop, f"{key} is required to have an effect"


def test_help_shows_type_default_and_logprobs_mode_doc() -> None:
    text = help_text()
    assert "  data.train_batch_size: int >= 1 = 16" in text
    assert "the distribution actually sampled" in " ".join(text.split())  # descriptions are wrapped
    assert NOOP_PREFIX in text


def test_cli_help_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_cli(["--help"])
    assert info.value.code == 0
    assert "algorithm.adv_estimator" in capsys.readouterr().out


def test_cli_flags_configs_and_print(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = tmp_path / "a.yaml"
    a.write_text("data:\n  train_batch_size: 32\n")
    b = tmp_path / "b.yaml"
    b.write_text("data:\n  seed: 5\n")
    cfg, flags = parse_cli(["--config", str(a), f"--config={b}", "--print-config", "--dry-run", "trainer.seed=3"])
    assert flags.config_paths == [str(a), str(b)]
    assert flags.overrides == ["trainer.seed=3"]
    assert flags.print_config and flags.dry_run
    assert (cfg.data.train_batch_size, cfg.data.seed, cfg.trainer.seed) == (32, 5, 3)
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["data"]["train_batch_size"] == 32


def test_cli_error_exits_2_with_the_key(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_cli(["data.train_batch_size=-3"])
    assert info.value.code == 2
    assert "data.train_batch_size" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="unknown option '--frobnicate'"):
        parse_cli(["--frobnicate"], exit_on_error=False)
    with pytest.raises(ConfigError, match="--config needs a file path"):
        parse_cli(["--config"], exit_on_error=False)


def test_config_to_dict_and_format() -> None:
    cfg = Config()
    d = config_to_dict(cfg)
    assert d["actor_rollout_ref"]["actor"]["optim"]["betas"] == [0.9, 0.999]  # tuple becomes list
    assert yaml.safe_load(format_config(cfg)) == d


def test_import_is_torch_free() -> None:
    code = (
        "import async_rl.config, sys; from async_rl.config import Config, validate_config; validate_config(Config());"
        " assert 'torch' not in sys.modules and 'vllm' not in sys.modules"
    )
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root, timeout=60)


def test_module_main_prints_a_valid_config(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-m", "async_rl.config", "--config", "configs/demo_grpo.yaml", "trainer.seed=11"],
        check=True,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert yaml.safe_load(out)["trainer"]["seed"] == 11
