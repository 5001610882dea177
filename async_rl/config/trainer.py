"""The ``trainer`` section: run length, logging, checkpoint/resume, learner placement and seed (verl names).

``n_gpus_per_node`` x ``nnodes`` is the LEARNER world size here (the torchrun processes; on CPU these are gloo
processes); vLLM actors use their own devices (``async_training.num_actors`` x ``rollout.tensor_model_parallel_size``).
"""

from typing import Annotated

import msgspec

from async_rl.config.fields import NonNegInt, PosInt, doc, noop
from async_rl.config.names import Device, LoggerBackend, ResumeMode


def _console_only() -> list[LoggerBackend]:
    return ["console"]


class TrainerConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Run-level settings."""

    project_name: Annotated[str, doc("Project name (logger grouping, checkpoint path).")] = "async_rl"
    experiment_name: Annotated[str, doc("Run name (logger run name, checkpoint path).")] = "demo"
    total_epochs: Annotated[PosInt | None, doc("Passes over the training prompts; null = bounded by steps only.")] = 1
    total_training_steps: Annotated[
        PosInt | None, doc("Training steps to run; overrides total_epochs when set (null = from epochs).")
    ] = None
    logger: Annotated[list[LoggerBackend], doc("Metric sinks: any of 'console', 'jsonl', 'tensorboard', 'wandb'.")] = (
        msgspec.field(default_factory=_console_only)
    )
    save_freq: Annotated[int, doc("Checkpoint every this many steps (and at the last step); -1 = never.", ge=-1)] = -1
    test_freq: Annotated[
        int,
        doc(
            "Validate the policy of every step that is a multiple of this, and the final one (<= 0: never during or"
            " after training, as verl); needs data.val_files.",
            ge=-1,
        ),
    ] = -1
    default_local_dir: Annotated[
        str | None, doc("Checkpoint directory; null = checkpoints/<project_name>/<experiment_name>.")
    ] = None
    resume_mode: Annotated[
        ResumeMode, doc("'auto' = resume from the latest checkpoint in the dir if any; 'disable'; 'resume_path'.")
    ] = "auto"
    resume_from_path: Annotated[str | None, doc("Checkpoint to resume from (required by resume_mode=resume_path).")] = (
        None
    )
    n_gpus_per_node: Annotated[PosInt, doc("Learner ranks per node (torchrun --nproc_per_node).")] = 1
    nnodes: Annotated[PosInt, doc("Learner nodes (learner world size = n_gpus_per_node * nnodes).")] = 1
    val_before_train: Annotated[
        bool, doc("Validate the starting policy (version 0, or the resumed one) before the first step.")
    ] = True
    critic_warmup: Annotated[
        NonNegInt, noop("Critic-only steps before the actor updates; the actor updates from the first step here.")
    ] = 0
    seed: Annotated[int, doc("Global seed (model init, sampling seeds, learner shuffles).")] = 1
    device: Annotated[
        Device,
        doc(
            "'cuda' = launchers/local.py gives the learner and each actor their own GPUs (CUDA_VISIBLE_DEVICES);"
            " 'auto' and 'cpu' pin nothing. The learner and vLLM use CUDA whenever it is visible (hide it with"
            " CUDA_VISIBLE_DEVICES= to run on CPU); 'cpu' with weight_sync.backend='nccl' is an error."
        ),
    ] = "auto"
    max_actor_ckpt_to_keep: Annotated[
        PosInt | None, doc("verl name for async_training.checkpoint.keep_last (null = keep all).")
    ] = None
    max_critic_ckpt_to_keep: Annotated[PosInt | None, noop("Critic checkpoints are kept with the actor's.")] = None
    balance_batch: Annotated[bool, noop("Sequences are always balanced across learner ranks here.")] = True
    val_only: Annotated[bool, noop("Validation-only run.")] = False
    log_val_generations: Annotated[int, noop("Validation samples to log.")] = 0
    rollout_data_dir: Annotated[str | None, noop("Dump rollouts to this dir.")] = None
    validation_data_dir: Annotated[str | None, noop("Dump validation generations to this dir.")] = None
    profile_steps: Annotated[list[int] | None, noop("Profiled steps.")] = None
    default_hdfs_dir: Annotated[str | None, noop("HDFS checkpoint copy.")] = None
    del_local_ckpt_after_load: Annotated[bool, noop("Delete local checkpoint after loading.")] = False
    ray_wait_register_center_timeout: Annotated[int, noop("Ray start-up timeout (no Ray here).")] = 300


class RayInitConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """verl's Ray start-up options (there is no Ray here)."""

    num_cpus: Annotated[int | None, doc("Ray CPUs.")] = None
    timeline_json_file: Annotated[str | None, doc("Ray timeline file.")] = None


__all__ = ["RayInitConfig", "TrainerConfig"]
