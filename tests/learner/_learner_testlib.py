"""Shared fixtures for the learner tests: a tiny seeded Qwen2, a scripted rollout source, default settings.

Plain functions (not pytest fixtures) because the multi-rank tests call them from ``torchrun`` worker processes too;
the module has a unique name because test directories are not packages (pytest prepend import mode).
"""

from __future__ import annotations

import copy
import random

import msgspec
import torch
from torch import nn

from async_rl.config import Config, default_config
from async_rl.config.resolve import LearnerStart
from async_rl.learner.batching import RolloutBatch, collate_groups, local_group
from async_rl.peft_format import LoRASpec
from async_rl.transport.protocol import RolloutGroup, make_completion

VOCAB = 64


def tiny_config(tie: bool = False) -> object:
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=128,
        max_position_embeddings=256,
        tie_word_embeddings=tie,
    )


def tiny_policy(seed: int = 0, tie: bool = False) -> nn.Module:
    """A 2-layer Qwen2ForCausalLM with weights fixed by ``seed`` (same on every rank and process)."""
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    return Qwen2ForCausalLM(tiny_config(tie)).float()


def tiny_critic(seed: int = 1) -> nn.Module:
    from transformers import Qwen2ForTokenClassification

    torch.manual_seed(seed)
    cfg = tiny_config()
    cfg.num_labels = 1
    return Qwen2ForTokenClassification(cfg).float()


Prompts = dict[int, list[int]]  # each group's prompt tokens, by prompt id


def scripted_groups(num_groups: int, n: int, seed: int = 0, version: int = 0) -> tuple[list[RolloutGroup], Prompts]:
    """Deterministic groups (prompt ids 0, 1, ...) and their prompts: random prompts (3..9 tokens), responses
    (1..12 tokens); reward = share of even tokens."""
    rng = random.Random(seed)
    groups, prompts = [], {}
    for g in range(num_groups):
        prompts[g] = [rng.randrange(1, VOCAB) for _ in range(rng.randint(3, 9))]
        completions = []
        for _ in range(n):
            tokens = [rng.randrange(1, VOCAB) for _ in range(rng.randint(1, 12))]
            logprobs = [-4.2 + rng.uniform(-0.3, 0.3) for _ in tokens]
            reward = sum(1 for t in tokens if t % 2 == 0) / len(tokens)
            completions.append(make_completion(tokens, logprobs, version_min=version, reward=reward))
        groups.append(local_group(g, completions))
    return groups, prompts


def equal_rewards(groups: list[RolloutGroup], which: tuple[int, ...]) -> list[RolloutGroup]:
    """``groups`` with every completion of the groups ``which`` rewarded 0.5 (zero advantage under GRPO)."""
    out = list(groups)
    for g in which:
        done = [msgspec.structs.replace(c, reward=0.5) for c in groups[g].completions]
        out[g] = msgspec.structs.replace(groups[g], completions=done)
    return out


def collate(groups: list[RolloutGroup], prompts: Prompts, *, max_response_length: int | None = None) -> RolloutBatch:
    """``groups`` padded with id 0 to their longest prompt and to their longest response (or
    ``max_response_length``)."""
    return collate_groups(
        groups, prompts, pad_token_id=0, max_prompt_length=None, max_response_length=max_response_length
    )


def layout(name: str) -> dict[str, bool]:
    """Config overrides (:func:`settings`) that select a micro-batch layout: ``padded``, ``packed`` or ``shared``."""
    assert name in ("padded", "packed", "shared"), name
    return {"use_shared_prompt": name == "shared", "use_remove_padding": name == "packed"}


ARR = "actor_rollout_ref"
RC = "algorithm.rollout_correction"
# The short names these tests use for the config keys the learner reads.
KEYS = {
    "ppo_mini_batch_size": f"{ARR}.actor.ppo_mini_batch_size",
    "ppo_micro_batch_size_per_gpu": f"{ARR}.actor.ppo_micro_batch_size_per_gpu",
    "ppo_epochs": f"{ARR}.actor.ppo_epochs",
    "shuffle": f"{ARR}.actor.shuffle",
    "clip_ratio": f"{ARR}.actor.clip_ratio",
    "clip_ratio_low": f"{ARR}.actor.clip_ratio_low",
    "clip_ratio_high": f"{ARR}.actor.clip_ratio_high",
    "clip_ratio_c": f"{ARR}.actor.clip_ratio_c",
    "loss_agg_mode": f"{ARR}.actor.loss_agg_mode",
    "loss_mode": f"{ARR}.actor.policy_loss.loss_mode",
    "loss_scale_factor": f"{ARR}.actor.loss_scale_factor",
    "mask_truncated_responses": f"{ARR}.actor.mask_truncated_responses",
    "entropy_coeff": f"{ARR}.actor.entropy_coeff",
    "use_kl_loss": f"{ARR}.actor.use_kl_loss",
    "kl_loss_coef": f"{ARR}.actor.kl_loss_coef",
    "kl_loss_type": f"{ARR}.actor.kl_loss_type",
    "grad_clip": f"{ARR}.actor.grad_clip",
    "max_consecutive_nonfinite": f"{ARR}.actor.max_consecutive_nonfinite",
    "param_dtype": f"{ARR}.actor.fsdp_config.mixed_precision.param_dtype",
    "lr": f"{ARR}.actor.optim.lr",
    "weight_decay": f"{ARR}.actor.optim.weight_decay",
    "log_prob_micro_batch_size_per_gpu": f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu",
    "rollout_n": f"{ARR}.rollout.n",
    "temperature": f"{ARR}.rollout.temperature",
    "use_remove_padding": f"{ARR}.model.use_remove_padding",
    "use_shared_prompt": f"{ARR}.model.use_shared_prompt",
    "enable_gradient_checkpointing": f"{ARR}.model.enable_gradient_checkpointing",
    "gradient_checkpointing_interval": f"{ARR}.model.gradient_checkpointing_interval",
    "skip_zero_advantage": f"{ARR}.actor.skip_zero_advantage",
    "step_kl_freq": f"{ARR}.actor.step_kl_freq",
    "use_fused_kernels": f"{ARR}.model.use_fused_kernels",
    "max_prompt_length": "data.max_prompt_length",
    "max_response_length": "data.max_response_length",
    "adv_estimator": "algorithm.adv_estimator",
    "gamma": "algorithm.gamma",
    "lam": "algorithm.lam",
    "norm_adv_by_std_in_grpo": "algorithm.norm_adv_by_std_in_grpo",
    "use_kl_in_reward": "algorithm.use_kl_in_reward",
    "kl_penalty": "algorithm.kl_penalty",
    "kl_coef": "algorithm.kl_ctrl.kl_coef",
    "kl_ctrl_type": "algorithm.kl_ctrl.type",
    "kl_target": "algorithm.kl_ctrl.target_kl",
    "kl_horizon": "algorithm.kl_ctrl.horizon",
    "rollout_is": f"{RC}.rollout_is",
    "rollout_is_threshold": f"{RC}.rollout_is_threshold",
    "is_batch_normalize": f"{RC}.rollout_is_batch_normalize",
    "rollout_rs": f"{RC}.rollout_rs",
    "rollout_rs_threshold": f"{RC}.rollout_rs_threshold",
    "bypass_mode": f"{RC}.bypass_mode",
    "bypass_loss_type": f"{RC}.loss_type",
    "seed": "trainer.seed",
}

# A small GRPO learner: 4 prompts x 4 responses per step, 2 mini-batches, micro-batches of 2, lr 1e-3, no importance
# weights, no gradient checkpointing, fp32, and prompts/responses up to the scripted groups' 9/12 tokens.
BASE: dict[str, object] = {
    "adv_estimator": "grpo",
    "ppo_mini_batch_size": 2,
    "ppo_micro_batch_size_per_gpu": 2,
    "log_prob_micro_batch_size_per_gpu": 4,
    "rollout_n": 4,
    "grad_clip": 1.0,
    "lr": 1e-3,
    "weight_decay": 0.0,
    "max_consecutive_nonfinite": 3,
    "rollout_is": None,
    "clip_ratio_low": None,
    "clip_ratio_high": None,
    "enable_gradient_checkpointing": False,
    "max_prompt_length": 9,
    "max_response_length": 12,
    "seed": 0,
    # fp32 on every host: these tests compare layouts and world sizes to 1e-6, and `auto` would be bf16 on a CPU
    # with native bf16 (the bf16 path has tests of its own, with tolerances from bf16's rounding)
    "param_dtype": "fp32",
}

# What the config cannot say; the tests' schedules are constant, so no horizon is needed.
START = LearnerStart(pad_token_id=0, total_training_steps=0)


def set_key(cfg: Config, key: str, value: object) -> None:
    """Set one config key (dotted path) on ``cfg`` in place, without validation: these tests also build learners the
    config's batching rules would refuse (uneven micro-batches), which the learner handles."""
    *parents, leaf = key.split(".")
    node: object = cfg
    for part in parents:
        node = getattr(node, part)
    assert hasattr(node, leaf), key
    setattr(node, leaf, value)


def settings(*, lora: LoRASpec | None = None, critic: dict[str, object] | None = None, **overrides: object) -> Config:
    """The config's defaults with :data:`BASE` and ``overrides`` (short names, :data:`KEYS`) set. ``lora``: the
    adapter's ``actor_rollout_ref.model.lora_*`` keys; ``critic``: ``critic.*`` keys (dotted below ``critic``)."""
    cfg = default_config()
    for name, value in {**BASE, **overrides}.items():
        set_key(cfg, KEYS[name], value)
    if lora is not None:
        model = cfg.actor_rollout_ref.model
        model.lora_rank, model.lora_alpha = lora.rank, lora.alpha
        model.target_modules = (
            lora.target_modules if isinstance(lora.target_modules, str) else list(lora.target_modules)
        )
        model.exclude_modules = list(lora.exclude_modules)
    for key, value in (critic or {}).items():
        set_key(cfg, f"critic.{key}", value)
    return cfg


def replace(cfg: Config, **overrides: object) -> Config:
    """A copy of ``cfg`` with ``overrides`` (short names) set."""
    out = copy.deepcopy(cfg)
    for name, value in overrides.items():
        set_key(out, KEYS[name], value)
    return out
