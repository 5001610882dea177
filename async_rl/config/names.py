"""Allowed names for every enumerated config value, as ``Literal`` types plus the tuples derived from them.

Defined here (torch-free) so the config schema can reject a bad name at load time with the list of allowed names; the
algorithm registries in :mod:`async_rl.algorithms` must hold exactly the same names (a test elsewhere compares them).
Each tuple is derived from its ``Literal`` with ``typing.get_args``, so there is a single source of truth.
"""

from __future__ import annotations

from typing import Literal, get_args

AdvEstimator = Literal[
    "gae", "grpo", "grpo_passk", "opo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "rloo", "rloo_vectorized"
]
KLKind = Literal[
    "kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "kl+", "k1+", "abs+", "mse+", "k2+", "low_var_kl+", "k3+"
]
LossAggMode = Literal["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
PolicyLossMode = Literal["vanilla", "geo_mean", "gspo", "cispo"]
KLControlType = Literal["fixed", "adaptive"]
LRSchedule = Literal["constant", "cosine"]
ISLevel = Literal["token", "sequence", "geometric"]
ISMode = Literal["truncate", "mask"]
BypassLossType = Literal["ppo_clip", "reinforce"]
LoggerBackend = Literal["console", "jsonl", "tensorboard", "wandb"]
ResumeMode = Literal["auto", "disable", "resume_path"]
Device = Literal["auto", "cpu", "cuda"]
RolloutEngine = Literal["vllm"]
RolloutDtype = Literal["auto", "bfloat16", "float16", "float32"]
ModelDtype = Literal["fp32", "bf16", "fp16", "float32", "bfloat16", "float16"]
ParamDtype = Literal["auto", "bf16", "fp32"]  # the learner's compute dtype; auto = bf16 on CUDA, fp32 on CPU
Strategy = Literal["fsdp", "fsdp2"]
Truncation = Literal["error", "left", "right", "middle"]
UpdateMode = Literal["inflight", "drain"]
StalePolicy = Literal["drop", "regrant"]
WeightSyncBackend = Literal["auto", "nccl", "gloo"]
LogprobsMode = Literal["processed", "raw"]
ActorFailurePolicy = Literal["stop", "continue"]
TruncateSide = Literal["left", "middle", "right"]
ToolFormat = Literal["hermes"]
SanityCheckMode = Literal["disable", "strict", "ignore_strippable"]
CpuAllocator = Literal["auto", "tcmalloc", "system"]
RewardModelPlacement = Literal["server", "inline"]
RewardModelDtype = Literal["auto", "bfloat16", "float32"]

ADV_ESTIMATORS: tuple[str, ...] = get_args(AdvEstimator)
KL_KINDS: tuple[str, ...] = get_args(KLKind)
LOSS_AGG_MODES: tuple[str, ...] = get_args(LossAggMode)
POLICY_LOSS_MODES: tuple[str, ...] = get_args(PolicyLossMode)
LOGGER_BACKENDS: tuple[str, ...] = get_args(LoggerBackend)

# Estimators that need a value model (critic); every other estimator ignores the `critic` section.
CRITIC_ESTIMATORS: frozenset[str] = frozenset({"gae"})
# Estimators whose baseline is computed from the other samples of the same prompt: with rollout.n == 1 the baseline is
# the sample itself (or undefined), so every advantage is 0 or the estimator degenerates. Config rejects n == 1.
GROUP_ESTIMATORS: frozenset[str] = frozenset(
    {"grpo", "grpo_passk", "opo", "rloo", "rloo_vectorized", "reinforce_plus_plus_baseline"}
)


def needs_critic(estimator: str) -> bool:
    """True when ``estimator`` needs a value model (the ``critic`` section is used)."""
    return estimator in CRITIC_ESTIMATORS


__all__ = [
    "ADV_ESTIMATORS",
    "CRITIC_ESTIMATORS",
    "GROUP_ESTIMATORS",
    "KL_KINDS",
    "LOGGER_BACKENDS",
    "LOSS_AGG_MODES",
    "POLICY_LOSS_MODES",
    "ActorFailurePolicy",
    "AdvEstimator",
    "BypassLossType",
    "CpuAllocator",
    "Device",
    "ISLevel",
    "ISMode",
    "KLControlType",
    "KLKind",
    "LRSchedule",
    "LoggerBackend",
    "LogprobsMode",
    "LossAggMode",
    "ModelDtype",
    "ParamDtype",
    "PolicyLossMode",
    "ResumeMode",
    "RewardModelDtype",
    "RewardModelPlacement",
    "RolloutDtype",
    "RolloutEngine",
    "SanityCheckMode",
    "StalePolicy",
    "Strategy",
    "ToolFormat",
    "TruncateSide",
    "Truncation",
    "UpdateMode",
    "WeightSyncBackend",
    "needs_critic",
]


# Limits shared by the config checks, the wire schema (transport.protocol) and the actor's engine: written once here.
MAX_NAME_LENGTH = 128
"""The longest actor id, reward-component name or timing key the rollout plane's wire format carries."""
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""vLLM 0.32's allowed ``max_lora_rank`` values (the actor rounds a LoRA rank up to one of them)."""
VLLM_MAX_LORA_RANK = VLLM_LORA_RANKS[-1]
