"""The config tree of supervised fine-tuning (``async_rl.entrypoints.sft``).

SFT trains a causal LM on demonstrations, with the loss on the assistant's tokens only, by the same FSDP2 learner
code as RL (model builder, optimizer, packing, checkpoints, export, LoRA). Key names follow verl's SFT trainer:
``data.train_files``, ``data.val_files``, ``data.prompt_key``, ``data.response_key``,
``data.multiturn.{enable,messages_key}``, ``data.max_length``, ``data.truncation``, ``data.train_batch_size``,
``data.micro_batch_size_per_gpu``, ``model.partial_pretrain``, ``model.lora_rank``, ``optim.lr``,
``trainer.total_epochs``. The tree loads through the same YAML loader, ``defaults:`` includes and ``key=value``
overrides as the RL config (:func:`load_sft_config`); defaults live here only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal

import msgspec

from async_rl.config.fields import NonNegFloat, NonNegInt, PosFloat, PosInt, Prob, doc
from async_rl.config.loader import load_tree_with_warnings
from async_rl.config.names import LRSchedule
from async_rl.config.supervised import (
    SupervisedModelConfig,
    SupervisedOptimConfig,
    SupervisedTrainerConfig,
    finish_supervised,
    supervised_errors,
)

BUILTIN_ARITH_SFT = "builtin:arith-sft"
"""The tiny model's arithmetic task as demonstrations (``"23+48="`` -> ``"71"``): train split for
``data.train_files``, eval split for ``data.val_files`` (:func:`async_rl.data.arith.make_arith_problems`)."""

BUILTIN_ARITH_SFT_CHAT = "builtin:arith-sft-chat"
"""The same problems asked in chat (the GRPO recipe's prompts), answered with just the number, for instruct models."""

BUILTIN_CALCULATOR_SFT = "builtin:calculator-sft"
"""The calculator-tool word problems (the RL recipe's prompts, one-shot demonstration included), each solved by the
environment itself: a calculator call, its tool response, the answer
(:func:`async_rl.envs.calculator.make_calculator_transcripts`; set ``data.multiturn.enable=true``)."""

SFTTruncation = Literal["error", "left", "right"]


class MultiturnConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Whole conversations instead of prompt/response pairs (verl's ``data.multiturn``)."""

    enable: Annotated[
        bool,
        doc(
            "Read each record's conversation from messages_key (tool calls and results included) and train every"
            " assistant turn; false = prompt_key / response_key pairs."
        ),
    ] = False
    messages_key: Annotated[str, doc("Record field of the conversation: a list of {role, content} messages.")] = (
        "messages"
    )


class SFTDataConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Demonstrations and batch geometry."""

    train_files: Annotated[
        str | list[str],
        doc(
            f"Training records (jsonl/parquet); '{BUILTIN_ARITH_SFT}' = the tiny model's arithmetic (plain text),"
            f" '{BUILTIN_ARITH_SFT_CHAT}' = the same in chat, '{BUILTIN_CALCULATOR_SFT}' = solved calculator-tool"
            " conversations (multi-turn)."
        ),
    ] = BUILTIN_ARITH_SFT
    val_files: Annotated[
        str | list[str] | None,
        doc("Held-out records for the validation loss (the builtin sets' eval split); null = no validation."),
    ] = BUILTIN_ARITH_SFT
    prompt_key: Annotated[str, doc("Record field of the prompt: a string (plain text) or a list of chat messages.")] = (
        "prompt"
    )
    response_key: Annotated[str, doc("Record field of the response: the text the model is taught to write.")] = (
        "response"
    )
    multiturn: Annotated[MultiturnConfig, doc("Whole conversations (verl's data.multiturn).")] = msgspec.field(
        default_factory=MultiturnConfig
    )
    max_length: Annotated[PosInt, doc("Max tokens of one rendered row (prompt + response).")] = 1024
    truncation: Annotated[
        SFTTruncation,
        doc(
            "A row longer than max_length: 'error' = stop with an error naming the file and row, 'left' = cut the"
            " prompt's first tokens, 'right' = cut the row's end (verl's values)."
        ),
    ] = "error"
    train_batch_size: Annotated[PosInt, doc("ROWS per optimizer step over all ranks (divisible by the ranks).")] = 256
    micro_batch_size_per_gpu: Annotated[
        PosInt, doc("Rows per forward/backward on one rank, packed without padding (gradient accumulation).")
    ] = 4
    shuffle: Annotated[bool, doc("Shuffle the training rows every epoch.")] = True
    seed: Annotated[int, doc("Seed of the shuffle and of the builtin sets.")] = 1


class SFTModelConfig(SupervisedModelConfig, kw_only=True, forbid_unknown_fields=True):
    """The model to fine-tune, and how."""

    partial_pretrain: Annotated[
        str,
        doc(
            "HF directory (or builtin name) of the causal LM to fine-tune (verl's key); 'builtin:tiny-arith' = the"
            " tiny model built in code, 'builtin:smollm2-135m-instruct' = SmolLM2-135M-Instruct."
        ),
    ] = "builtin:tiny-arith"
    lora_rank: Annotated[
        NonNegInt, doc("LoRA rank: > 0 trains low-rank adapters on the frozen model; 0 = full fine-tuning.")
    ] = 0
    lora_alpha: Annotated[PosFloat, doc("LoRA alpha: the adapter's update is scaled by lora_alpha / lora_rank.")] = 16
    target_modules: Annotated[
        str | list[str],
        doc("Linear layers that get adapters: 'all-linear' (every one but the output layer) or module names."),
    ] = "all-linear"


class SFTOptimConfig(SupervisedOptimConfig, kw_only=True, forbid_unknown_fields=True):
    """AdamW and schedule plus gradient clipping; verl's SFT numbers (warm-up over 10% of the run, cosine decay)."""

    weight_decay: Annotated[NonNegFloat, doc("AdamW decoupled weight decay.")] = 0.01
    lr_warmup_steps_ratio: Annotated[
        Prob, doc("Warm-up length as a fraction of the run's steps (used when lr_warmup_steps is -1).")
    ] = 0.1
    lr_scheduler_type: Annotated[
        LRSchedule, doc("Learning-rate schedule after warm-up: 'constant' or 'cosine' decay to min_lr_ratio * lr.")
    ] = "cosine"


class SFTTrainerConfig(SupervisedTrainerConfig, kw_only=True, forbid_unknown_fields=True):
    """Run length, validation, output, checkpoints, logging."""

    experiment_name: Annotated[str, doc("Run name (logger run name, output path).")] = "sft"
    seed: Annotated[int, doc("Seed of the LoRA adapters' initialisation (the same on every rank).")] = 1
    label_smoothing_factor: Annotated[
        Prob,
        doc(
            "Label smoothing eps in [0, 1) (the transformers Trainer's name): the training target is"
            " (1 - eps) * the demonstrated token + eps * uniform over the tokenizer's ordinary tokens (its special"
            " tokens and any spare embedding rows get none, so sampling never learns to emit them). The training"
            " loss reported includes it; the validation loss is the plain NLL. 0 = off."
        ),
    ] = 0.0


class SFTConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Complete configuration of a supervised fine-tuning run."""

    data: Annotated[SFTDataConfig, doc("Demonstrations and batch geometry.")] = msgspec.field(
        default_factory=SFTDataConfig
    )
    model: Annotated[SFTModelConfig, doc("The model to fine-tune.")] = msgspec.field(default_factory=SFTModelConfig)
    optim: Annotated[SFTOptimConfig, doc("Optimizer and learning-rate schedule.")] = msgspec.field(
        default_factory=SFTOptimConfig
    )
    trainer: Annotated[SFTTrainerConfig, doc("Run length, validation, output, logging.")] = msgspec.field(
        default_factory=SFTTrainerConfig
    )


def validate_sft_config(cfg: SFTConfig) -> list[str]:
    """Check cross-field rules (ConfigError naming the keys) and resolve the schedule in place; returns warnings."""
    d = cfg.data
    errors = supervised_errors(
        cfg.optim,
        cfg.trainer,
        model_key="model.partial_pretrain",
        model_path=cfg.model.partial_pretrain,
        train_batch_size=d.train_batch_size,
        micro_batch_size_per_gpu=d.micro_batch_size_per_gpu,
    )
    if cfg.trainer.label_smoothing_factor >= 1.0:
        errors.append(f"trainer.label_smoothing_factor must be below 1, got {cfg.trainer.label_smoothing_factor}")
    if not d.multiturn.enable and d.prompt_key == d.response_key:
        errors.append(f"data.prompt_key and data.response_key must differ, both are {d.prompt_key!r}")
    return finish_supervised(errors, cfg.optim, cfg.trainer, has_held_out=d.val_files is not None)


def load_sft_config(paths: Sequence[str] | str | None, overrides: Sequence[str]) -> tuple[SFTConfig, list[str]]:
    """YAML files plus ``key=value`` overrides into a validated tree, and its start-up warnings (not logged)."""
    return load_tree_with_warnings(SFTConfig, validate_sft_config, paths, overrides)


__all__ = [
    "BUILTIN_ARITH_SFT",
    "BUILTIN_ARITH_SFT_CHAT",
    "BUILTIN_CALCULATOR_SFT",
    "MultiturnConfig",
    "SFTConfig",
    "SFTDataConfig",
    "SFTModelConfig",
    "SFTOptimConfig",
    "SFTTrainerConfig",
    "load_sft_config",
    "validate_sft_config",
]
