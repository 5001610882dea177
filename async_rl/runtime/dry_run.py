"""``--dry-run``: validate a config and the wiring built from it, without loading a model or generating.

Builds everything that does not need weights or data: the learner's settings (batch arithmetic, loss choices), the
rollout plane's admission cap and bind address, the sampling parameters, the vLLM engine's start-up values, the weight
sync backend, and imports the reward function. Model and data paths are reported (and checked when local), so a
shipped GPU config can be checked on a CPU machine with nothing downloaded. A run bounded by ``trainer.total_epochs``
gets its step count from the training data when that is on this machine (filtered with the policy's tokenizer when
that is local too); otherwise the report says the count is derived at start-up.
"""

from __future__ import annotations

import os
from typing import Any

from async_rl.config import Config
from async_rl.config.names import needs_critic
from async_rl.runtime import resources


def _path_status(spec: Any) -> str:
    if spec is None:
        return "none"
    if isinstance(spec, str) and spec.startswith("builtin:"):
        return "builtin"
    path = os.path.expanduser(str(spec))
    if os.path.exists(path):
        return "found"
    return "not on this machine (hub id or remote path; loaded at run time)"


def _tokenizer(spec: str) -> Any:
    """The policy's tokenizer when it is on this machine without downloading or building anything, else None."""
    if spec == resources.BUILTIN_MODEL:
        from async_rl.models.tiny import build_char_tokenizer

        return build_char_tokenizer()
    path = os.path.expanduser(spec)
    if spec.startswith("builtin:") or not os.path.isdir(path):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def _run_length(cfg: Config) -> dict[str, Any]:
    """The step count: as set, derived from the training data when it is on this machine, or left to start-up."""
    from async_rl.runtime.run_length import derive_run_length

    tr, d = cfg.trainer, cfg.data
    report: dict[str, Any] = {"total_training_steps": None, "how": "", "train_prompts": None, "note": None}
    if tr.total_training_steps is not None:
        return {**report, "total_training_steps": tr.total_training_steps, "how": "trainer.total_training_steps"}
    files = [d.train_files] if isinstance(d.train_files, str) else list(d.train_files or [])
    missing = [str(f) for f in files if _path_status(f) not in ("builtin", "found")]
    if missing:
        how = "derived at start-up: len(train set) // data.train_batch_size * trainer.total_epochs"
        return {**report, "how": how, "note": f"the training data is not on this machine: {', '.join(missing)}"}
    tokenizer = _tokenizer(cfg.actor_rollout_ref.model.path)
    if tokenizer is not None:
        tokenizer = resources.with_chat_template(cfg, tokenizer)
    note = None
    if tokenizer is not None:
        num_prompts = len(resources.prompt_records(cfg, tokenizer))
    else:
        num_prompts = len(resources.load_raw_records(d.train_files, d.prompt_key, "train", d.seed))
        if d.filter_overlong_prompts:
            note = (
                "counted before data.filter_overlong_prompts (the tokenizer is not on this machine): an upper bound;"
                " the learner logs the exact count at start-up"
            )
    length = derive_run_length(cfg, num_prompts)
    return {"total_training_steps": length.steps, "how": length.how, "train_prompts": num_prompts, "note": note}


def dry_run_report(cfg: Config) -> dict[str, Any]:
    """Everything a run would be wired from; raises ValueError naming what is wrong."""
    from async_rl.actor.engine import actor_device, lora_engine_kwargs
    from async_rl.config.resolve import engine_start
    from async_rl.learner.lora import lora_spec
    from async_rl.learner.objective_spec import objective_spec
    from async_rl.learner.optim import check_schedule
    from async_rl.transport.admission import inflight_cap
    from async_rl.transport.protocol import GroupSampling
    from async_rl.weight_sync.group import resolve_backend

    run_length = _run_length(cfg)
    arr, algo = cfg.actor_rollout_ref, cfg.algorithm
    spec = objective_spec(arr.actor, algo.rollout_correction, cfg.distillation)  # parses the correction's thresholds
    lora = lora_spec(arr.model)
    # Without the data the horizon is unknown until start-up; 1 stands in so the schedules still check.
    run_steps = run_length["total_training_steps"] or 1
    check_schedule(arr.actor.optim, run_steps=run_steps, section="actor_rollout_ref.actor.optim")
    critic = needs_critic(algo.adv_estimator)
    if critic:
        check_schedule(cfg.critic.optim, run_steps=run_steps, section="critic.optim")
    needs_ref = arr.actor.use_kl_loss or algo.use_kl_in_reward
    sampling = GroupSampling.from_config(cfg, seed=cfg.trainer.seed)
    engine = engine_start(cfg, model_path=cfg.actor_rollout_ref.model.path, device_type=actor_device())
    reward = _reward_report(cfg)
    if arr.rollout.engine_kwargs:  # built as the actor builds its engine's arguments (imports vLLM; starts nothing)
        from async_rl.runtime.actor_main import build_engine

        build_engine(cfg, str(arr.model.path)).engine_args()
    at = cfg.async_training
    transport, ws = at.transport, at.weight_sync
    # On a machine without CUDA an explicit nccl backend cannot be resolved; report what the GPU machine will use.
    backend = ws.backend if ws.backend != "auto" else resolve_backend(backend="auto")
    files = cfg.data.train_files
    return {
        "policy": {"path": cfg.actor_rollout_ref.model.path, "status": _path_status(cfg.actor_rollout_ref.model.path)},
        "critic": ({"path": cfg.critic.model.path, "status": _path_status(cfg.critic.model.path)} if critic else None),
        "reward_model": _reward_model_report(cfg),
        "distillation": _distillation_report(cfg, spec),
        "reference_model": (("the frozen base (adapters off)" if lora is not None else True) if needs_ref else False),
        "lora": (
            None
            if lora is None
            else {
                "rank": lora.rank,
                "alpha": lora.alpha,
                "target_modules": lora.target_modules,
                "exclude_modules": list(lora.exclude_modules),
                "vllm": lora_engine_kwargs(arr.model.lora_rank, engine.max_loras),
            }
        ),
        "train_files": {str(f): _path_status(f) for f in ([files] if isinstance(files, str) else files)},
        "adv_estimator": algo.adv_estimator,
        "loss": _loss_report(cfg, spec),
        "run_length": run_length,
        "sequences_per_step": cfg.data.train_batch_size * arr.rollout.n,
        "optimizer_steps_per_step": (cfg.data.train_batch_size // arr.actor.ppo_mini_batch_size) * arr.actor.ppo_epochs,
        "coordinator": f"tcp://{transport.host}:{transport.port}",
        "max_staleness": at.max_staleness,
        "inflight_cap": inflight_cap(
            transport.max_inflight_groups, max_staleness=at.max_staleness, groups_per_step=cfg.data.train_batch_size
        ),
        "sampling": {"n": sampling.n, "temperature": sampling.temperature, "max_tokens": sampling.max_tokens},
        "engine": {
            "tp": arr.rollout.tensor_model_parallel_size,
            "dtype": engine.dtype,
            "logprobs_mode": at.actor.logprobs_mode,
            "engine_kwargs": dict(arr.rollout.engine_kwargs),
        },
        "weight_sync": {"backend": backend, "bucket_size_mb": ws.bucket_size_mb},
        "reward": reward,
    }


def _reward_report(cfg: Config) -> str:
    """What scores the rollouts: the reward function (imported, so a bad name fails here) or, for multi-turn
    episodes, the environment (imported and built with its arguments)."""
    from async_rl.rewards import load_reward_fn

    custom = cfg.custom_reward_function
    if custom.path:
        load_reward_fn(f"{custom.path}:{custom.name}", verl_style=True)
        reward = f"{custom.path}:{custom.name} (verl signature)"
    else:
        load_reward_fn(cfg.reward.function)
        reward = cfg.reward.function
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    if not mt.enable:
        return reward
    from async_rl.envs.base import load_environment_class
    from async_rl.runtime.actor_main import environment_kwargs

    env_cls = load_environment_class(str(mt.environment))
    try:
        env_cls(**environment_kwargs(cfg))
    except TypeError as exc:
        raise ValueError(f"actor_rollout_ref.rollout.multi_turn.environment_kwargs: {exc}") from None
    return f"the environment {mt.environment} (multi-turn episodes)"


def _loss_report(cfg: Config, spec: Any) -> dict[str, Any]:
    """The policy loss as the learner will compute it (``spec``: its objective spec)."""
    correction = cfg.algorithm.rollout_correction
    return {
        "mode": spec.loss_mode,
        "agg": spec.loss_agg_mode,
        "rollout_is": spec.rollout_is,
        "rollout_is_threshold": correction.rollout_is_threshold,
        "rollout_rs": correction.rollout_rs,
        "bypass_mode": correction.bypass_mode,
        "mask_truncated_responses": cfg.actor_rollout_ref.actor.mask_truncated_responses,
    }


def _distillation_report(cfg: Config, spec: Any) -> dict[str, Any] | None:
    """On-policy distillation's teacher (where it runs, whether its directory exists yet) and its loss term."""
    if spec.distill is None:
        return None
    teacher = cfg.distillation.teacher_model
    d = spec.distill
    return {
        "teacher": {"path": teacher.model_path, "status": _path_status(teacher.model_path), "on": teacher.placement},
        "loss_mode": d.loss_mode,
        "policy_gradient": d.use_policy_gradient,
        "with_task_rewards": d.use_task_rewards,
    }


def _reward_model_report(cfg: Config) -> dict[str, Any] | None:
    """The learned reward model's directory and whether it holds a model yet (an earlier stage may export it)."""
    rm = cfg.reward.reward_model
    if not rm.enable or rm.model_path is None:
        return None
    from async_rl.config.validate import check_reward_model_dir

    try:
        check_reward_model_dir(cfg)
        status = "a model directory"
    except ValueError:
        status = "no model there yet (train and export it before the run starts)"
    return {"path": rm.model_path, "placement": rm.placement, "status": status}


def print_dry_run(cfg: Config) -> int:
    """The entry points' ``--dry-run``: print the report as JSON (exit code 0), or what is wrong (exit code 2)."""
    import json
    import sys

    try:
        report = dry_run_report(cfg)
    except ValueError as exc:
        print(f"dry-run: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2))
    return 0
