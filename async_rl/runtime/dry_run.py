"""``--dry-run``: validate a config and the wiring built from it, without loading a model or generating.

Builds everything that does not need weights or data: the learner's settings (batch arithmetic, loss choices), the
rollout plane's settings (bind address and CURVE rules), the sampling parameters, the vLLM engine settings, the weight
sync backend, and imports the reward function. Model and data paths are reported (and checked when local), so a
shipped GPU config can be checked on a CPU machine with nothing downloaded.
"""

from __future__ import annotations

import os
from typing import Any

from async_rl.config import Config
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


def dry_run_report(cfg: Config) -> dict[str, Any]:
    """Everything a run would be wired from; raises ValueError naming what is wrong."""
    from async_rl.learner.settings import LearnerSettings
    from async_rl.rewards import load_reward_fn
    from async_rl.runtime.actor_main import engine_settings
    from async_rl.weight_sync.group import resolve_backend

    learner = LearnerSettings.from_config(cfg)
    plane = resources.plane_settings(cfg)
    sampling = resources.sampling_params(cfg, seed=cfg.trainer.seed)
    engine = engine_settings(cfg, cfg.actor_rollout_ref.model.path)
    custom = cfg.custom_reward_function
    if custom.path:
        load_reward_fn(f"{custom.path}:{custom.name}", verl_style=True)
        reward = f"{custom.path}:{custom.name} (verl signature)"
    else:
        load_reward_fn(cfg.reward.function)
        reward = cfg.reward.function
    ws = cfg.async_training.weight_sync
    # On a machine without CUDA an explicit nccl backend cannot be resolved; report what the GPU machine will use.
    backend = ws.backend if ws.backend != "auto" else resolve_backend("auto")
    files = cfg.data.train_files
    return {
        "policy": {"path": cfg.actor_rollout_ref.model.path, "status": _path_status(cfg.actor_rollout_ref.model.path)},
        "critic": (
            {"path": cfg.critic.model.path, "status": _path_status(cfg.critic.model.path)}
            if learner.needs_critic
            else None
        ),
        "reference_model": learner.needs_ref,
        "train_files": {str(f): _path_status(f) for f in ([files] if isinstance(files, str) else files)},
        "adv_estimator": learner.adv_estimator,
        "loss": {"mode": learner.loss_mode, "agg": learner.loss_agg_mode, "tis_cap": learner.tis_cap},
        "sequences_per_step": cfg.data.train_batch_size * learner.rollout_n,
        "optimizer_steps_per_step": (cfg.data.train_batch_size // learner.ppo_mini_batch_size) * learner.ppo_epochs,
        "coordinator": f"tcp://{plane.host}:{plane.port}",
        "max_staleness": plane.max_staleness,
        "inflight_cap": plane.inflight_cap,
        "sampling": {"n": sampling.n, "temperature": sampling.temperature, "max_tokens": sampling.max_tokens},
        "engine": {"tp": engine.tensor_parallel_size, "dtype": engine.dtype, "logprobs_mode": engine.logprobs_mode},
        "weight_sync": {"backend": backend, "bucket_size_mb": ws.bucket_size_mb},
        "reward": reward,
    }
