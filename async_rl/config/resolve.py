"""Fill in derived config values after validation, so consumers never see the "null = derived" placeholders.

What is resolved (in place, idempotent; run by :func:`async_rl.config.validate.validate_config`):
rollout prompt/response/model lengths from ``data``; clip_ratio_low/high from clip_ratio; the deprecated verl global
micro-batch sizes into per-rank ones (global // learner world size); unset per-rank micro-batches (the rank's whole
mini-batch share for the actor/critic, the actor's value for log-prob passes, the rollout's for the reference);
critic keys inheriting the actor's (only when the estimator uses a critic; the critic model's packing and checkpointing
are always the policy's); ``warmup_style`` into ``lr_scheduler_type``; the optimizer horizon from
``trainer.total_training_steps``; the rollout-correction aliases into verl's keys; checkpoint dir/period/retention
from their verl aliases; ``reward.reward_kwargs`` from its older verl spellings (``reward_model.reward_kwargs.*``,
``reward_model.overlong_buffer.*``, which are then cleared) and ``max_resp_len`` from ``data.max_response_length``;
``reward.reward_model.{enable, model_path}`` from verl's older ``reward_model.{enable, model.path}`` (then cleared) and
its ``max_length`` from the data lengths.
``transport.max_inflight_groups`` stays null here: the coordinator derives it.

What the config alone cannot give the learner (the tokenizer's pad id, a run length counted from the data) is derived
once at start-up into :class:`LearnerStart` (:func:`learner_start`); the learner reads everything else from the config
sections themselves (the precision ``auto`` means on its device: ``async_rl.config.precision``). Likewise an actor's
vLLM engine gets :class:`EngineStart` (:func:`engine_start`: the resolved model directory, ``rollout.dtype`` resolved
on the actor's device, :func:`max_loras`), and the learner's served-weights check :func:`served_check_tolerance`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

from async_rl.config.common import OptimConfig
from async_rl.config.correction import resolve_rollout_correction
from async_rl.config.data_reward import OverlongBufferAlias, RewardKwargsAlias
from async_rl.config.names import needs_critic
from async_rl.config.precision import learner_precision, rollout_precision
from async_rl.config.schema import Config

T = TypeVar("T")


def _per_rank(per_gpu: int | None, global_micro: int | None, world: int) -> int | None:
    if per_gpu is None and global_micro is not None:
        return global_micro // world
    return per_gpu


def resolve_optim(optim: OptimConfig, total_steps: int | None) -> None:
    if optim.warmup_style is not None:
        optim.lr_scheduler_type = optim.warmup_style
        optim.warmup_style = None
    if optim.total_training_steps == -1 and total_steps is not None:
        optim.total_training_steps = total_steps


OVERLONG_KEYS = ("enable", "len", "penalty_factor", "log")
_REWARD_KWARGS = "reward.reward_kwargs"


def reward_kwargs_aliases(cfg: Config) -> list[tuple[str, str, Any]]:
    """``(key, alias key, alias value)`` for every older spelling of a ``reward.reward_kwargs`` key that is set."""
    rm = cfg.reward_model
    spellings = (
        ("reward_model.reward_kwargs.overlong_buffer_cfg", rm.reward_kwargs.overlong_buffer_cfg),
        ("reward_model.overlong_buffer", rm.overlong_buffer),
    )
    out = [
        (f"{_REWARD_KWARGS}.overlong_buffer_cfg.{name}", f"{prefix}.{name}", getattr(alias, name))
        for prefix, alias in spellings
        for name in OVERLONG_KEYS
        if getattr(alias, name) is not None
    ]
    if rm.reward_kwargs.max_resp_len is not None:
        out.append(
            (f"{_REWARD_KWARGS}.max_resp_len", "reward_model.reward_kwargs.max_resp_len", rm.reward_kwargs.max_resp_len)
        )
    return out


def _resolve_reward_kwargs(cfg: Config) -> None:
    kwargs = cfg.reward.reward_kwargs
    for key, _, value in reward_kwargs_aliases(cfg):  # validation checked that they agree
        name = key.rsplit(".", 1)[-1]
        setattr(kwargs if name == "max_resp_len" else kwargs.overlong_buffer_cfg, name, value)
    cfg.reward_model.reward_kwargs = RewardKwargsAlias()
    cfg.reward_model.overlong_buffer = OverlongBufferAlias()
    if kwargs.max_resp_len is None:
        kwargs.max_resp_len = cfg.data.max_response_length


def reward_model_aliases(cfg: Config) -> list[tuple[str, str, Any]]:
    """``(key, alias key, alias value)`` for verl's older ``reward_model.enable`` / ``reward_model.model.path`` when
    set."""
    rm = cfg.reward_model
    out: list[tuple[str, str, Any]] = []
    if rm.enable is not None:
        out.append(("reward.reward_model.enable", "reward_model.enable", rm.enable))
    if rm.model.path is not None:
        out.append(("reward.reward_model.model_path", "reward_model.model.path", rm.model.path))
    return out


def _resolve_reward_model(cfg: Config) -> None:
    served = cfg.reward.reward_model
    for key, _, value in reward_model_aliases(cfg):  # validation checked that they agree
        setattr(served, key.rsplit(".", 1)[-1], value)
    cfg.reward_model.enable = None
    cfg.reward_model.model.path = None
    if served.max_length is None:
        served.max_length = cfg.data.max_prompt_length + cfg.data.max_response_length


def resolve_config(cfg: Config) -> None:
    """Replace derived placeholders in ``cfg`` (assumes :func:`validate_config`'s checks passed)."""
    world = cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes
    arr, data, tr = cfg.actor_rollout_ref, cfg.data, cfg.trainer
    actor, ro, ref = arr.actor, arr.rollout, arr.ref
    n = ro.n

    ro.prompt_length = data.max_prompt_length
    ro.response_length = data.max_response_length
    if ro.max_model_len is None:
        ro.max_model_len = data.max_prompt_length + data.max_response_length

    if actor.clip_ratio_low is None:
        actor.clip_ratio_low = actor.clip_ratio
    if actor.clip_ratio_high is None:
        actor.clip_ratio_high = actor.clip_ratio

    actor.ppo_micro_batch_size_per_gpu = _per_rank(
        actor.ppo_micro_batch_size_per_gpu, actor.ppo_micro_batch_size, world
    )
    actor.ppo_micro_batch_size = None
    if actor.ppo_micro_batch_size_per_gpu is None and not actor.use_dynamic_bsz:
        actor.ppo_micro_batch_size_per_gpu = actor.ppo_mini_batch_size * n // world

    ro.log_prob_micro_batch_size_per_gpu = _per_rank(
        ro.log_prob_micro_batch_size_per_gpu, ro.log_prob_micro_batch_size, world
    )
    ro.log_prob_micro_batch_size = None
    if ro.log_prob_micro_batch_size_per_gpu is None:
        ro.log_prob_micro_batch_size_per_gpu = actor.ppo_micro_batch_size_per_gpu
    # the reference forward runs with the rollout's micro-batch (validation warns when these said otherwise)
    ref.log_prob_micro_batch_size_per_gpu = ro.log_prob_micro_batch_size_per_gpu
    ref.log_prob_micro_batch_size = None
    for sec in (ro, ref):
        if sec.log_prob_use_dynamic_bsz is None:
            sec.log_prob_use_dynamic_bsz = actor.use_dynamic_bsz

    resolve_optim(actor.optim, tr.total_training_steps)
    if needs_critic(cfg.algorithm.adv_estimator):
        crit = cfg.critic
        if crit.ppo_mini_batch_size is None:
            crit.ppo_mini_batch_size = actor.ppo_mini_batch_size
        if crit.ppo_epochs is None:
            crit.ppo_epochs = actor.ppo_epochs
        if crit.shuffle is None:
            crit.shuffle = actor.shuffle
        if crit.loss_agg_mode is None:
            crit.loss_agg_mode = actor.loss_agg_mode
        if crit.use_dynamic_bsz is None:
            crit.use_dynamic_bsz = actor.use_dynamic_bsz
        # the critic is built with the policy model's settings (validation warns when these said otherwise)
        crit.model.enable_gradient_checkpointing = arr.model.enable_gradient_checkpointing
        crit.model.use_remove_padding = arr.model.use_remove_padding
        crit.ppo_micro_batch_size_per_gpu = _per_rank(
            crit.ppo_micro_batch_size_per_gpu, crit.ppo_micro_batch_size, world
        )
        crit.ppo_micro_batch_size = None
        if crit.ppo_micro_batch_size_per_gpu is None and not crit.use_dynamic_bsz:
            crit.ppo_micro_batch_size_per_gpu = crit.ppo_mini_batch_size * n // world
        resolve_optim(crit.optim, tr.total_training_steps)

    resolve_rollout_correction(cfg.algorithm.rollout_correction)

    _resolve_reward_kwargs(cfg)
    _resolve_reward_model(cfg)

    ck = cfg.async_training.checkpoint
    ck.dir = ck.dir or tr.default_local_dir or f"checkpoints/{tr.project_name}/{tr.experiment_name}"
    tr.default_local_dir = ck.dir
    if ck.save_every_n_steps is None and tr.save_freq > 0:
        ck.save_every_n_steps = tr.save_freq
    if ck.save_every_n_steps is not None:
        tr.save_freq = ck.save_every_n_steps
    if ck.keep_last is None:
        ck.keep_last = tr.max_actor_ckpt_to_keep
    tr.max_actor_ckpt_to_keep = ck.keep_last


@dataclass(frozen=True)
class LearnerStart:
    """The learner's start-up values that are not config keys, derived once by :func:`learner_start`."""

    pad_token_id: int  # the tokenizer's
    total_training_steps: int  # the run length: the optimizers' schedule horizon unless an optim section sets one


def learner_start(
    cfg: Config,
    *,
    pad_token_id: int,
    total_training_steps: int | None,
) -> LearnerStart:
    """The learner's start-up values. ``total_training_steps`` is the run length when the config leaves it to the
    data (``trainer.total_epochs``, see ``async_rl.runtime.run_length``); None takes ``trainer.total_training_steps``
    (0 when that is null too: no horizon, which only a constant schedule accepts)."""
    if total_training_steps is None:
        total_training_steps = cfg.trainer.total_training_steps
    return LearnerStart(
        pad_token_id=pad_token_id,
        total_training_steps=int(total_training_steps or 0),
    )


@dataclass(frozen=True)
class EngineStart:
    """An actor's vLLM engine's start-up values that are not config keys, derived once by :func:`engine_start`."""

    model_path: str  # the policy's directory, resolved (async_rl.runtime.resources.resolve_model_path)
    dtype: str  # rollout.dtype as vLLM takes it, ``auto`` resolved on the actor's device
    max_loras: int  # LoRA adapters vLLM holds at once (:func:`max_loras`)


def engine_start(cfg: Config, *, model_path: str, device_type: str) -> EngineStart:
    """The engine's start-up values on a ``device_type`` ("cuda" or "cpu") actor, for the policy at ``model_path``."""
    dtype, _ = rollout_precision(cfg.actor_rollout_ref.rollout.dtype, device_type)
    return EngineStart(model_path=model_path, dtype=dtype, max_loras=max_loras(cfg.async_training.max_staleness))


def max_loras(max_staleness: int) -> int:
    """LoRA adapters vLLM holds at once: the current one, the ``max_staleness`` older ones a running request may still
    use, and the one being added."""
    return max_staleness + 2


def max_concurrent_eval(cfg: Config) -> int:
    """Validation prompts one actor generates concurrently: as many samples as its training groups may hold
    (``async_training.actor.max_concurrent_groups x rollout.n / rollout.val_kwargs.n``, at least 1). Counted as
    groups, a round of 200 one-sample prompts ran 32 sequences at a time in the SmolLM2 recipe, where a training
    step's 16 groups run 128."""
    rollout = cfg.actor_rollout_ref.rollout
    return max(1, cfg.async_training.actor.max_concurrent_groups * rollout.n // rollout.val_kwargs.n)


def served_check_tolerance(
    configured: float | None, *, rollout_dtype: str, device_type: str, param_dtype: str, learner_device_type: str
) -> float:
    """``async_training.weight_sync.served_check_tolerance`` as used: ``configured``, or when that is null 1e-3 when
    both the rollout and the learner compute in fp32, 3e-2 when one of them computes in bf16, and 0.15 when both do
    (each side rounds its own way: at version 0 of the SmolLM2 LoRA recipe, an unchanged adapter, a bf16 learner and
    bf16 vLLM on a Zen 4 CPU differed by 0.065 on the probe, where 3e-2 stopped the actor for good).
    ``rollout_dtype`` is ``rollout.dtype``, its ``auto`` resolved for the actors' ``device_type``; ``param_dtype`` is
    the learner's ``actor.fsdp_config.mixed_precision.param_dtype``, its ``auto`` resolved for ``learner_device_type``
    (where ``auto`` is bf16 on a CPU, both are, so a float32 rollout still meets a bf16 learner)."""
    if configured is not None:
        return configured
    rollout, _ = rollout_precision(rollout_dtype, device_type)
    learner, _ = learner_precision(param_dtype, learner_device_type)
    bf16_sides = (rollout != "float32") + (learner != "fp32")
    return (1e-3, 3e-2, 0.15)[bf16_sides]


def resolved(value: T | None, key: str) -> T:
    """A "null = derived" config value, which :func:`resolve_config` fills in; None means the config was never
    validated."""
    if value is None:
        raise ValueError(
            f"{key} is null: this needs a validated config (load_config and validate_config fill in the derived keys)"
        )
    return value


__all__ = [
    "OVERLONG_KEYS",
    "EngineStart",
    "LearnerStart",
    "engine_start",
    "learner_start",
    "max_loras",
    "resolve_config",
    "resolved",
    "reward_kwargs_aliases",
    "served_check_tolerance",
]
