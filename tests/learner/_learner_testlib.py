"""Shared fixtures for the learner tests: a tiny seeded Qwen2, a scripted rollout source, default settings.

Plain functions (not pytest fixtures) because the multi-rank tests call them from ``torchrun`` worker processes too;
the module has a unique name because test directories are not packages (pytest prepend import mode).
"""

from __future__ import annotations

import random

import torch
from torch import nn

from async_rl.learner.batching import Response, SampledGroup
from async_rl.learner.settings import LearnerSettings, OptimSettings

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


def scripted_groups(num_groups: int, n: int, seed: int = 0, version: int = 0) -> list[SampledGroup]:
    """Deterministic groups: random prompts (3..9 tokens), responses (1..12 tokens); reward = share of even tokens."""
    rng = random.Random(seed)
    groups = []
    for g in range(num_groups):
        prompt = [rng.randrange(1, VOCAB) for _ in range(rng.randint(3, 9))]
        responses = []
        for _ in range(n):
            tokens = [rng.randrange(1, VOCAB) for _ in range(rng.randint(1, 12))]
            logprobs = [-4.2 + rng.uniform(-0.3, 0.3) for _ in tokens]
            reward = sum(1 for t in tokens if t % 2 == 0) / len(tokens)
            responses.append(Response(token_ids=tokens, logprobs=logprobs, reward=reward, version=version))
        groups.append(SampledGroup(group_id=f"g{seed}-{g}", prompt_ids=prompt, responses=responses))
    return groups


def layout(name: str) -> dict[str, bool]:
    """Settings overrides that select a micro-batch layout: ``padded``, ``packed`` or ``shared``."""
    assert name in ("padded", "packed", "shared"), name
    return {"use_shared_prompt": name == "shared", "use_remove_padding": name == "packed"}


def settings(**overrides: object) -> LearnerSettings:
    """The config's defaults for a small GRPO learner: 4 prompts x 4 responses per step, 2 mini-batches, micro-batches
    of 2, lr 1e-3, no importance weights, no gradient checkpointing, fp32, and no fixed prompt/response lengths (the
    scripted groups have prompts and responses of any length)."""
    base = LearnerSettings.defaults(
        adv_estimator="grpo",
        ppo_mini_batch_size=2,
        ppo_micro_batch_size_per_gpu=2,
        log_prob_micro_batch_size_per_gpu=4,
        rollout_n=4,
        grad_clip=1.0,
        optim=OptimSettings.defaults(lr=1e-3, weight_decay=0.0),
        max_consecutive_nonfinite=3,
        rollout_is=None,
        clip_ratio_low=None,
        clip_ratio_high=None,
        enable_gradient_checkpointing=False,
        max_prompt_length=None,
        max_response_length=None,
        seed=0,
        # fp32 on every host: these tests compare layouts and world sizes to 1e-6, and `auto` would be bf16 on a CPU
        # with native bf16 (the bf16 path has tests of its own, with tolerances from bf16's rounding)
        param_dtype="fp32",
    )
    return base.replace(**overrides)
