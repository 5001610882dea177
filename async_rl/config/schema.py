"""The root of the typed config tree, :class:`Config`.

Every section has defaults, so an empty YAML is a valid config: the defaults are the small CPU demo settings (builtin
tiny model and arithmetic task) with verl's default algorithm settings. Section and key names are verl's, except
``reward`` and ``async_training`` (this system's own). ``reward_model`` and ``ray_init`` exist only so verl command
lines parse; setting anything in them produces a start-up warning, except ``reward_model``'s two older spellings of
``reward.reward_kwargs`` (see :mod:`async_rl.config.data_reward`).
"""

from typing import Annotated

import msgspec

from async_rl.config.actor_rollout_ref import ActorRolloutRefConfig
from async_rl.config.algorithm import AlgorithmConfig
from async_rl.config.async_training import AsyncTrainingConfig
from async_rl.config.critic import CriticConfig
from async_rl.config.data_reward import CustomRewardFunctionConfig, DataConfig, RewardConfig, RewardModelConfig
from async_rl.config.distillation import DistillationConfig
from async_rl.config.fields import doc, noop
from async_rl.config.rejection_sampling import RejectionSamplingConfig
from async_rl.config.trainer import RayInitConfig, TrainerConfig


class Config(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Complete configuration of a training run."""

    data: Annotated[DataConfig, doc("Prompt data and batch size.")] = msgspec.field(default_factory=DataConfig)
    actor_rollout_ref: Annotated[ActorRolloutRefConfig, doc("Policy model: training, generation, reference.")] = (
        msgspec.field(default_factory=ActorRolloutRefConfig)
    )
    critic: Annotated[CriticConfig, doc("Value model (used by critic-based estimators only).")] = msgspec.field(
        default_factory=CriticConfig
    )
    algorithm: Annotated[AlgorithmConfig, doc("Advantage estimation, KL in reward, off-policy correction.")] = (
        msgspec.field(default_factory=AlgorithmConfig)
    )
    reward: Annotated[RewardConfig, doc("Reward function.")] = msgspec.field(default_factory=RewardConfig)
    custom_reward_function: Annotated[CustomRewardFunctionConfig, doc("verl reward function from a file.")] = (
        msgspec.field(default_factory=CustomRewardFunctionConfig)
    )
    trainer: Annotated[TrainerConfig, doc("Run length, logging, checkpoints, placement.")] = msgspec.field(
        default_factory=TrainerConfig
    )
    async_training: Annotated[AsyncTrainingConfig, doc("Asynchronous actor-learner settings.")] = msgspec.field(
        default_factory=AsyncTrainingConfig
    )
    distillation: Annotated[DistillationConfig, doc("On-policy distillation from a frozen teacher.")] = msgspec.field(
        default_factory=DistillationConfig
    )
    rejection_sampling: Annotated[
        RejectionSamplingConfig, doc("A generation job that writes the best samples as an SFT dataset.")
    ] = msgspec.field(default_factory=RejectionSamplingConfig)
    reward_model: Annotated[
        RewardModelConfig, doc("Learned reward model (not supported); older spellings of reward.reward_kwargs.")
    ] = msgspec.field(default_factory=RewardModelConfig)
    ray_init: Annotated[RayInitConfig, noop("Ray start-up (no Ray here).")] = msgspec.field(
        default_factory=RayInitConfig
    )


__all__ = ["Config"]
