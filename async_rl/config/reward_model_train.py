"""The config tree of reward-model training (``async_rl.entrypoints.train_reward_model``).

A Bradley-Terry reward model is trained on preference pairs (TRL's layout: ``prompt``, ``chosen``, ``rejected``,
optional ``margin``) by the same FSDP2 learner code as RL. Key names follow verl's SFT/RM trainers where they have one
(``data.train_files``, ``data.micro_batch_size_per_gpu``, ``data.max_length``, ``model.path``, ``optim.lr``,
``trainer.total_epochs``, ``trainer.default_local_dir``, the checkpoint keys ``trainer.save_freq``,
``trainer.max_ckpt_to_keep``, ``trainer.resume_mode``, ``trainer.resume_from_path``) and TRL's for the loss
(``loss.center_rewards_coefficient``).
The tree loads through the same YAML loader, ``defaults:`` includes and ``key=value`` overrides as the RL config
(:func:`load_reward_model_config`); defaults live here only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal

import msgspec

from async_rl.config.fields import NonNegFloat, PosInt, doc
from async_rl.config.loader import load_tree_with_warnings
from async_rl.config.supervised import (
    SupervisedModelConfig,
    SupervisedOptimConfig,
    SupervisedTrainerConfig,
    finish_supervised,
    supervised_errors,
)

BUILTIN_PREFERENCES = "builtin:arith-prefs"
"""The generated toy preference pairs (a correct sum chosen over a wrong one): train split for ``data.train_files``,
eval split for ``data.val_files``; :mod:`async_rl.data.toy_preferences`."""

BUILTIN_PREFERENCES_CHAT = "builtin:arith-prefs-chat"
"""The same pairs as chat messages (a user question, one assistant answer each), for instruct models."""

PairTruncation = Literal["error", "left", "drop"]


class RewardDataConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Preference pairs and batch geometry."""

    train_files: Annotated[
        str | list[str],
        doc(
            f"Training pairs (jsonl/parquet, TRL's layout); '{BUILTIN_PREFERENCES}' = the toy arithmetic preferences"
            f" (plain text), '{BUILTIN_PREFERENCES_CHAT}' = the same as chat messages."
        ),
    ] = BUILTIN_PREFERENCES
    val_files: Annotated[
        str | list[str] | None,
        doc(
            f"Held-out pairs for evaluation and the exported reward statistics; '{BUILTIN_PREFERENCES}' = the toy"
            " eval split; null = no evaluation (the statistics then come from the training pairs)."
        ),
    ] = BUILTIN_PREFERENCES
    prompt_key: Annotated[str, doc("Record field of the prompt (a string or a list of chat messages).")] = "prompt"
    chosen_key: Annotated[
        str, doc("Record field of the preferred response (a string or a list of assistant messages).")
    ] = "chosen"
    rejected_key: Annotated[str, doc("Record field of the dispreferred response (same forms as chosen).")] = "rejected"
    margin_key: Annotated[
        str,
        doc(
            "Optional record field of a pair's margin m (loss -log sigmoid(r_c - r_r - m)); a pair without it has"
            " m = 0."
        ),
    ] = "margin"
    train_batch_size: Annotated[PosInt, doc("PAIRS per optimizer step over all ranks (divisible by the ranks).")] = 32
    micro_batch_size_per_gpu: Annotated[
        PosInt, doc("Pairs per forward/backward on one rank (gradient accumulation up to the rank's share).")
    ] = 8
    max_length: Annotated[PosInt, doc("Max tokens of one rendered prompt + response sequence.")] = 512
    truncation: Annotated[
        PairTruncation,
        doc(
            "A sequence longer than max_length: 'left' = drop its first tokens (the prompt's start; the response's end,"
            " where the score is read, is kept), 'drop' = leave the pair out (counted in a warning), 'error' = stop"
            " with an error naming the file and row."
        ),
    ] = "left"
    shuffle: Annotated[bool, doc("Shuffle the training pairs every epoch.")] = True
    seed: Annotated[int, doc("Seed of the shuffle.")] = 1


class RewardModelModelConfig(SupervisedModelConfig, kw_only=True, forbid_unknown_fields=True):
    """The reward model: a causal-LM checkpoint's trunk plus a fresh one-output score head."""

    path: Annotated[
        str,
        doc(
            "HF directory (or builtin name) of the causal LM the reward model starts from; 'builtin:tiny-arith' ="
            " the tiny model built in code, 'builtin:smollm2-135m-instruct' = SmolLM2-135M-Instruct."
        ),
    ] = "builtin:tiny-arith"


class RewardModelOptimConfig(SupervisedOptimConfig, kw_only=True, forbid_unknown_fields=True):
    """AdamW and schedule (the RL learner's ``optim`` keys) plus gradient clipping."""


class RewardLossConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The Bradley-Terry pairwise loss."""

    center_rewards_coefficient: Annotated[
        NonNegFloat,
        doc("Weight c of the centring term c * mean((r_chosen + r_rejected)^2), which keeps rewards near 0 (TRL's)."),
    ] = 0.0


class RewardTrainerConfig(SupervisedTrainerConfig, kw_only=True, forbid_unknown_fields=True):
    """Run length, evaluation, output, logging."""

    experiment_name: Annotated[str, doc("Run name (logger run name, output path).")] = "reward_model"
    seed: Annotated[int, doc("Seed of the score head's initialisation (the same on every rank).")] = 1


class RewardModelTrainConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Complete configuration of a reward-model training run."""

    data: Annotated[RewardDataConfig, doc("Preference pairs and batch geometry.")] = msgspec.field(
        default_factory=RewardDataConfig
    )
    model: Annotated[RewardModelModelConfig, doc("The model the reward model starts from.")] = msgspec.field(
        default_factory=RewardModelModelConfig
    )
    optim: Annotated[RewardModelOptimConfig, doc("Optimizer and learning-rate schedule.")] = msgspec.field(
        default_factory=RewardModelOptimConfig
    )
    loss: Annotated[RewardLossConfig, doc("Pairwise loss.")] = msgspec.field(default_factory=RewardLossConfig)
    trainer: Annotated[RewardTrainerConfig, doc("Run length, evaluation, output, logging.")] = msgspec.field(
        default_factory=RewardTrainerConfig
    )


def validate_reward_model_config(cfg: RewardModelTrainConfig) -> list[str]:
    """Check cross-field rules (ConfigError naming the keys) and resolve aliases in place; returns warnings."""
    d = cfg.data
    errors = supervised_errors(
        cfg.optim,
        cfg.trainer,
        model_key="model.path",
        model_path=cfg.model.path,
        train_batch_size=d.train_batch_size,
        micro_batch_size_per_gpu=d.micro_batch_size_per_gpu,
    )
    keys = {"prompt_key": d.prompt_key, "chosen_key": d.chosen_key, "rejected_key": d.rejected_key}
    if len(set(keys.values())) < 3:
        errors.append(f"data.prompt_key, data.chosen_key and data.rejected_key must differ, got {keys}")
    if d.margin_key in keys.values():
        errors.append(f"data.margin_key={d.margin_key!r} is also the field of the prompt or a response")
    return finish_supervised(errors, cfg.optim, cfg.trainer, has_held_out=d.val_files is not None)


def load_reward_model_config(
    paths: Sequence[str] | str | None, overrides: Sequence[str]
) -> tuple[RewardModelTrainConfig, list[str]]:
    """YAML files plus ``key=value`` overrides into a validated tree, and its start-up warnings (not logged)."""
    return load_tree_with_warnings(RewardModelTrainConfig, validate_reward_model_config, paths, overrides)


__all__ = [
    "BUILTIN_PREFERENCES",
    "BUILTIN_PREFERENCES_CHAT",
    "RewardDataConfig",
    "RewardLossConfig",
    "RewardModelModelConfig",
    "RewardModelOptimConfig",
    "RewardModelTrainConfig",
    "RewardTrainerConfig",
    "load_reward_model_config",
    "validate_reward_model_config",
]
