"""verl command lines port with only the entry point changed: every key parses and lands on the same-named field."""

from __future__ import annotations

import shlex
from pathlib import Path

from async_rl.config import load_config_with_warnings, parse_cli

# verl's GSM8K GRPO example (examples/grpo_trainer), exactly as typed in a shell script ($HOME expanded by hand).
VERL_GRPO = """
    algorithm.adv_estimator=grpo
    data.train_files=/home/u/data/gsm8k/train.parquet
    data.val_files=/home/u/data/gsm8k/test.parquet
    data.train_batch_size=1024
    data.max_prompt_length=512
    data.max_response_length=1024
    data.filter_overlong_prompts=True
    data.truncation='error'
    actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct
    actor_rollout_ref.actor.optim.lr=1e-6
    actor_rollout_ref.model.use_remove_padding=True
    actor_rollout_ref.actor.ppo_mini_batch_size=256
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40
    actor_rollout_ref.actor.use_kl_loss=True
    actor_rollout_ref.actor.kl_loss_coef=0.001
    actor_rollout_ref.actor.kl_loss_type=low_var_kl
    actor_rollout_ref.actor.entropy_coeff=0
    actor_rollout_ref.model.enable_gradient_checkpointing=True
    actor_rollout_ref.actor.fsdp_config.param_offload=False
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40
    actor_rollout_ref.rollout.tensor_model_parallel_size=2
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6
    actor_rollout_ref.rollout.n=5
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=40
    actor_rollout_ref.ref.fsdp_config.param_offload=True
    algorithm.use_kl_in_reward=False
    trainer.critic_warmup=0
    trainer.logger=['console','wandb']
    trainer.project_name='verl_grpo_example_gsm8k'
    trainer.experiment_name='qwen2_7b_function_rm'
    trainer.n_gpus_per_node=8
    trainer.nnodes=1
    trainer.save_freq=20
    trainer.test_freq=5
    trainer.total_epochs=15
"""

# verl's GSM8K PPO example (examples/ppo_trainer): GAE with a critic.
VERL_PPO = """
    algorithm.adv_estimator=gae
    data.train_files=/home/u/data/gsm8k/train.parquet
    data.val_files=/home/u/data/gsm8k/test.parquet
    data.train_batch_size=1024
    data.max_prompt_length=512
    data.max_response_length=512
    actor_rollout_ref.model.path=deepseek-ai/deepseek-llm-7b-chat
    actor_rollout_ref.actor.optim.lr=1e-6
    actor_rollout_ref.actor.ppo_mini_batch_size=256
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32
    actor_rollout_ref.rollout.tensor_model_parallel_size=4
    actor_rollout_ref.rollout.gpu_memory_utilization=0.4
    critic.optim.lr=1e-5
    critic.model.use_remove_padding=True
    critic.model.path=deepseek-ai/deepseek-llm-7b-chat
    critic.model.enable_gradient_checkpointing=True
    critic.ppo_micro_batch_size_per_gpu=32
    critic.model.fsdp_config.param_offload=False
    critic.model.fsdp_config.optimizer_offload=False
    algorithm.use_kl_in_reward=False
    trainer.critic_warmup=0
    trainer.logger=['console','wandb']
    trainer.n_gpus_per_node=8
    trainer.nnodes=1
    trainer.save_freq=20
    trainer.test_freq=1
    trainer.total_epochs=15
"""


def test_verl_grpo_command_line_lands_on_the_right_fields() -> None:
    argv = shlex.split(VERL_GRPO)  # the shell strips the quotes, as bash would
    assert "trainer.logger=[console,wandb]" in argv
    cfg, flags = parse_cli(argv, exit_on_error=False)
    # every key of this command line has an effect here, but one: the start-up warning names it
    assert flags.warnings == [
        "these keys are accepted but have no effect in async_rl: actor_rollout_ref.ref.fsdp_config.param_offload"
    ]
    arr = cfg.actor_rollout_ref
    assert cfg.algorithm.adv_estimator == "grpo"
    assert cfg.data.train_files == "/home/u/data/gsm8k/train.parquet"
    assert (cfg.data.train_batch_size, cfg.data.max_prompt_length, cfg.data.max_response_length) == (1024, 512, 1024)
    assert cfg.data.filter_overlong_prompts is True and cfg.data.truncation == "error"
    assert arr.model.path == "Qwen/Qwen2-7B-Instruct"
    assert arr.model.use_remove_padding is True and arr.model.enable_gradient_checkpointing is True
    assert arr.actor.optim.lr == 1e-6
    assert arr.actor.ppo_mini_batch_size == 256 and arr.actor.ppo_micro_batch_size_per_gpu == 40
    assert arr.actor.use_kl_loss is True and arr.actor.kl_loss_coef == 0.001 and arr.actor.kl_loss_type == "low_var_kl"
    assert arr.actor.entropy_coeff == 0.0
    assert arr.actor.fsdp_config.param_offload is False and arr.ref.fsdp_config.param_offload is True
    assert arr.rollout.n == 5 and arr.rollout.tensor_model_parallel_size == 2 and arr.rollout.name == "vllm"
    assert arr.rollout.gpu_memory_utilization == 0.6 and arr.rollout.log_prob_micro_batch_size_per_gpu == 40
    assert arr.ref.log_prob_micro_batch_size_per_gpu == 40
    assert cfg.trainer.logger == ["console", "wandb"]
    assert cfg.trainer.project_name == "verl_grpo_example_gsm8k"
    assert cfg.trainer.experiment_name == "qwen2_7b_function_rm"
    assert (cfg.trainer.n_gpus_per_node, cfg.trainer.nnodes) == (8, 1)
    assert (cfg.trainer.save_freq, cfg.trainer.test_freq, cfg.trainer.total_epochs) == (20, 5, 15)
    # Derived values: 256 prompts x 5 = 1280 sequences per mini-batch, 1280 / 8 ranks = 160 per rank (40 divides it).
    assert arr.rollout.response_length == 1024 and arr.rollout.prompt_length == 512
    assert arr.actor.clip_ratio_low == 0.2 and arr.actor.clip_ratio_high == 0.2
    # verl's default checkpoint dir: checkpoints/<project>/<experiment>
    assert cfg.trainer.default_local_dir == "checkpoints/verl_grpo_example_gsm8k/qwen2_7b_function_rm"
    assert cfg.async_training.checkpoint.save_every_n_steps == 20


def test_verl_grpo_command_line_with_quotes_kept() -> None:
    # The same overrides with the quotes still present (e.g. from a Python launcher) give the same config.
    unquoted, _ = load_config_with_warnings(None, shlex.split(VERL_GRPO))
    quoted, _ = load_config_with_warnings(None, VERL_GRPO.split())
    assert quoted == unquoted


def test_verl_ppo_command_line_lands_on_the_right_fields() -> None:
    cfg, flags = parse_cli(shlex.split(VERL_PPO), exit_on_error=False)
    # the critic packs sequences as the policy does (verl's example packs only the critic's): the warning says so
    assert flags.warnings == [
        "critic.model.use_remove_padding=True is ignored: the learner uses"
        " actor_rollout_ref.model.use_remove_padding=False (set them equal)"
    ]
    assert cfg.algorithm.adv_estimator == "gae"
    assert cfg.critic.model.path == "deepseek-ai/deepseek-llm-7b-chat"
    assert cfg.critic.optim.lr == 1e-5 and cfg.critic.model.use_remove_padding is False  # the policy's
    assert cfg.critic.ppo_micro_batch_size_per_gpu == 32
    # Inherited from the actor like verl's interpolations: mini-batch 256 prompts, 1 epoch, token-mean.
    assert cfg.critic.ppo_mini_batch_size == 256 and cfg.critic.ppo_epochs == 1
    assert cfg.critic.loss_agg_mode == "token-mean"


def test_deprecated_global_micro_batch_is_split_over_ranks() -> None:
    # verl: ppo_micro_batch_size=64 over 8 ranks -> 8 sequences per rank.
    cfg, _ = load_config_with_warnings(
        None,
        [
            "data.train_batch_size=64",
            "actor_rollout_ref.actor.ppo_mini_batch_size=16",
            "actor_rollout_ref.rollout.n=4",
            "trainer.n_gpus_per_node=8",
            "actor_rollout_ref.actor.ppo_micro_batch_size=64",
            "critic.ppo_micro_batch_size=32",
        ],
    )
    actor = cfg.actor_rollout_ref.actor
    assert actor.ppo_micro_batch_size is None and actor.ppo_micro_batch_size_per_gpu == 8
    assert cfg.critic.ppo_micro_batch_size_per_gpu == 4  # 32 / 8 ranks


def test_unset_micro_batch_defaults_to_the_rank_share() -> None:
    # 8 prompts x n=2 = 16 sequences over 2 ranks = 8 per rank, one micro-batch.
    cfg, _ = load_config_with_warnings(None, ["actor_rollout_ref.rollout.n=2", "trainer.n_gpus_per_node=2"])
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 8
    assert cfg.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu == 8


def test_warmup_style_is_an_alias_of_lr_scheduler_type() -> None:
    cfg, _ = load_config_with_warnings(None, ["actor_rollout_ref.actor.optim.warmup_style=cosine"])
    assert cfg.actor_rollout_ref.actor.optim.lr_scheduler_type == "cosine"
    assert cfg.actor_rollout_ref.actor.optim.warmup_style is None


def test_verl_mixed_precision_section_keeps_its_spelling_and_meaning(tmp_path: Path) -> None:
    """verl writes ``fsdp_config.mixed_precision`` as bf16/fp32/fp32 (or leaves it null); both load, and verl's
    ``param_dtype: bf16`` still means mixed precision. Unset it is ``auto`` (bf16 on CUDA, fp32 on CPU)."""
    mp = "actor_rollout_ref.actor.fsdp_config.mixed_precision"
    verl = [f"+{mp}.param_dtype=bf16", f"+{mp}.reduce_dtype=fp32", f"+{mp}.buffer_dtype=fp32"]
    cfg, warnings = load_config_with_warnings(None, verl)
    assert cfg.actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype == "bf16" and warnings == []
    yaml_file = tmp_path / "verl.yaml"
    yaml_file.write_text(
        "actor_rollout_ref:\n  actor:\n    fsdp_config:\n      mixed_precision:\n"
        "        param_dtype: bf16\n        reduce_dtype: fp32\n        buffer_dtype: fp32\n"
    )
    from_yaml, _ = load_config_with_warnings([str(yaml_file)], [])
    assert (
        from_yaml.actor_rollout_ref.actor.fsdp_config.mixed_precision
        == cfg.actor_rollout_ref.actor.fsdp_config.mixed_precision
    )
    for overrides in ([], [f"{mp}=null"]):
        unset, _ = load_config_with_warnings(None, overrides)
        assert unset.actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype == "auto"
