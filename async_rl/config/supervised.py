"""Config sections shared by the supervised jobs (reward-model training, SFT): run length, evaluation, output,
checkpoints and logging (``trainer.*``), and AdamW with gradient clipping (``optim.*``).

Key names follow verl's SFT trainer (``trainer.total_epochs``, ``trainer.save_freq``, ``trainer.max_ckpt_to_keep``,
``trainer.resume_mode``, ``optim.clip_grad``, ...). A job subclasses a section only to change a default (its
experiment name, its learning rate); the loop that reads them is :mod:`async_rl.runtime.supervised`.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from async_rl.config.common import MixedPrecisionConfig, OptimConfig
from async_rl.config.errors import ConfigError
from async_rl.config.fields import NonNegFloat, PosFloat, PosInt, doc
from async_rl.config.names import LoggerBackend, ResumeMode


class SupervisedModelConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How the model is run: its chat template, activation checkpointing and precision (a job adds which model)."""

    custom_chat_template: Annotated[
        str | None, doc("Jinja chat template replacing the tokenizer's (null = the tokenizer's own).")
    ] = None
    enable_gradient_checkpointing: Annotated[bool, doc("Recompute activations in backward (less memory).")] = False
    mixed_precision: Annotated[
        MixedPrecisionConfig, doc("Compute precision (param_dtype: 'auto', 'bf16' or 'fp32'; as the RL learner's).")
    ] = msgspec.field(default_factory=MixedPrecisionConfig)


class SupervisedOptimConfig(OptimConfig, kw_only=True, forbid_unknown_fields=True):
    """AdamW and schedule (the RL learner's ``optim`` keys) plus gradient clipping."""

    lr: Annotated[NonNegFloat, doc("Peak learning rate of AdamW.")] = 1e-5
    weight_decay: Annotated[NonNegFloat, doc("AdamW decoupled weight decay.")] = 0.0
    clip_grad: Annotated[PosFloat, doc("Gradient-norm clip (verl's SFT key).")] = 1.0


def _console_and_jsonl() -> list[LoggerBackend]:
    return ["console", "jsonl"]


class SupervisedTrainerConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Run length, evaluation, output, checkpoints, logging."""

    project_name: Annotated[str, doc("Project name (logger grouping, output path).")] = "async_rl"
    experiment_name: Annotated[str, doc("Run name (logger run name, output path).")] = "supervised"
    total_epochs: Annotated[PosInt, doc("Passes over the training data.")] = 1
    total_training_steps: Annotated[
        PosInt | None, doc("Optimizer steps to run; overrides total_epochs when set (null = from epochs).")
    ] = None
    test_freq: Annotated[
        int,
        doc(
            "Evaluate on data.val_files every this many steps (<= 0: only after the last step, which is always"
            " evaluated when data.val_files is set).",
            ge=-1,
        ),
    ] = 10
    default_local_dir: Annotated[
        str | None,
        doc(
            "Output directory (metrics.jsonl, checkpoints/, the exported model in hf/); null ="
            " outputs/<project>/<experiment>."
        ),
    ] = None
    save_freq: Annotated[
        int,
        doc(
            "Checkpoint every this many steps (and at the last step) into <default_local_dir>/checkpoints; -1 or 0 ="
            " never (as verl).",
            ge=-1,
        ),
    ] = -1
    max_ckpt_to_keep: Annotated[PosInt | None, doc("Keep the newest this many checkpoints (null = keep all).")] = None
    resume_mode: Annotated[
        ResumeMode,
        doc(
            "'auto' = resume from the newest committed checkpoint in <default_local_dir>/checkpoints if any;"
            " 'disable' = start fresh; 'resume_path' = from trainer.resume_from_path."
        ),
    ] = "auto"
    resume_from_path: Annotated[
        str | None, doc("Checkpoint directory (a step_<N>) to resume from (required by resume_mode=resume_path).")
    ] = None
    stop_s: Annotated[
        PosFloat,
        doc(
            "Seconds a rank has after SIGTERM to finish its step, write a checkpoint (when save_freq > 0) and exit"
            " 143; past it the rank exits at once without one."
        ),
    ] = 60.0
    logger: Annotated[
        list[LoggerBackend],
        doc("Metric sinks: 'console' (one line per step), 'jsonl', 'tensorboard', 'wandb'."),
    ] = msgspec.field(default_factory=_console_and_jsonl)
    seed: Annotated[int, doc("Seed of the freshly initialised weights (the same on every rank).")] = 1
    max_consecutive_nonfinite: Annotated[
        PosInt, doc("Stop after this many optimizer steps in a row skipped for a non-finite loss or gradient.")
    ] = 3
    collective_timeout_s: Annotated[PosFloat, doc("How long a collective may wait for the other ranks.")] = 600.0


def supervised_errors(
    optim: SupervisedOptimConfig,
    trainer: SupervisedTrainerConfig,
    *,
    model_key: str,
    model_path: str,
    train_batch_size: int,
    micro_batch_size_per_gpu: int,
) -> list[str]:
    """The rules every supervised job's tree keeps: the optimizer's, the model path (under ``model_key``), a
    micro-batch no larger than the batch, and the resume keys. A job adds its data's own rules."""
    from async_rl.config.validate import model_path_error, optim_errors, resume_error

    errors = optim_errors(optim, "optim")
    path_error = model_path_error(model_key, model_path)
    if path_error is not None:
        errors.append(path_error)
    if micro_batch_size_per_gpu > train_batch_size:
        errors.append(
            f"data.micro_batch_size_per_gpu ({micro_batch_size_per_gpu}) must be <= data.train_batch_size"
            f" ({train_batch_size})"
        )
    resume = resume_error(trainer.resume_mode, trainer.resume_from_path)
    if resume is not None:
        errors.append(resume)
    return errors


def finish_supervised(
    errors: list[str], optim: SupervisedOptimConfig, trainer: SupervisedTrainerConfig, *, has_held_out: bool
) -> list[str]:
    """Raise the errors (one ConfigError naming the keys), resolve the schedule in place, return the warnings."""
    from async_rl.config.resolve import resolve_optim

    if errors:
        raise ConfigError("\n".join(errors))
    resolve_optim(optim, trainer.total_training_steps)
    if trainer.test_freq > 0 and not has_held_out:
        return ["trainer.test_freq is set but data.val_files is null: nothing is evaluated"]
    return []


__all__ = [
    "SupervisedModelConfig",
    "SupervisedOptimConfig",
    "SupervisedTrainerConfig",
    "finish_supervised",
    "supervised_errors",
]
