"""The learner's own view of the configuration: small frozen dataclasses with verl's field names.

The learner needs a few dozen knobs out of the full config tree (``actor_rollout_ref.actor.*``, ``critic.*``,
``algorithm.*``). Keeping them in a flat, frozen, validated dataclass makes every knob the learner honours visible in
one place. :meth:`LearnerSettings.from_config` reads them from a validated :class:`~async_rl.config.Config` by typed
attribute access and is the single place that maps config keys to learner fields.

The dataclasses declare no defaults of their own: the config sections are the one place defaults live. Tests and tools
that want "the defaults with a few changes" call :meth:`LearnerSettings.defaults` (likewise ``OptimSettings`` and
``CriticSettings``), which derive from :func:`async_rl.config.default_config`. ``__post_init__`` re-checks the rules a
hand-built or ``replace``-d instance could break.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, get_args

import torch

from async_rl.algorithms.objective import ObjectiveSpec
from async_rl.algorithms.rollout_correction import RSBounds
from async_rl.config import Config, default_config
from async_rl.config.common import OptimConfig
from async_rl.config.correction import parse_is_threshold, parse_rs_spec
from async_rl.config.critic import CriticConfig
from async_rl.config.names import LOSS_AGG_MODES, BypassLossType, ISLevel, LRSchedule, ParamDtype, needs_critic
from async_rl.config.precision import CPUINFO, cpu_bf16_flags, learner_precision
from async_rl.learner.partition import Layout
from async_rl.peft_format import LoRASpec

__all__ = [
    "ADAMW_EPS",
    "CriticSettings",
    "LearnerSettings",
    "OptimSettings",
    "cpu_native_bf16",
    "lora_spec",
    "resolve_compute_dtype",
]

logger = logging.getLogger(__name__)

_LOSS_AGG_MODES = LOSS_AGG_MODES
_IS_LEVELS = get_args(ISLevel)
_BYPASS_LOSS_TYPES = get_args(BypassLossType)
_LR_SCHEDULES = get_args(LRSchedule)
_PARAM_DTYPES = get_args(ParamDtype)

ADAMW_EPS = 1e-8  # torch's AdamW default; verl has no key for it either

T = TypeVar("T")


def cpu_native_bf16(cpuinfo: str | Path = CPUINFO) -> bool | None:
    """Whether this CPU multiplies bf16 matrices natively (the ``avx512_bf16`` or ``amx_bf16`` flag in ``cpuinfo``);
    None when unknown (no such file, e.g. not Linux). Without either flag torch emulates bf16 matmuls, which is far
    slower than fp32 (measured on an AVX2-only EPYC: 0.9 vs 72.6 GFLOP/s for a 1024^3 matmul on 2 threads)."""
    flags = cpu_bf16_flags(cpuinfo)
    return None if flags is None else bool(flags)


_warned_slow_bf16 = False


def resolve_compute_dtype(
    param_dtype: str, device: torch.device, *, warn: bool = True, cpuinfo: str | Path = CPUINFO
) -> torch.dtype:
    """The dtype the learner computes in for ``actor.fsdp_config.mixed_precision.param_dtype`` on ``device``.

    ``auto``: bf16 on CUDA and on CPUs with native bf16 (:mod:`async_rl.config.precision`), fp32 elsewhere;
    ``bf16``: bf16 on any device (mixed precision: the master weights stay fp32); ``fp32``: fp32. An explicit bf16 on
    a CPU without native bf16 matmuls (:func:`cpu_native_bf16` False) logs a warning when ``warn`` (the learner
    passes rank 0's flag), once per process."""
    global _warned_slow_bf16
    if param_dtype not in _PARAM_DTYPES:
        raise ValueError(f"param_dtype must be one of {_PARAM_DTYPES}, got {param_dtype!r}")
    chosen, _ = learner_precision(param_dtype, device.type, cpuinfo)
    if chosen == "fp32":
        return torch.float32
    if warn and device.type == "cpu" and not _warned_slow_bf16 and cpu_native_bf16(cpuinfo) is False:
        _warned_slow_bf16 = True
        logger.warning(
            "param_dtype=bf16 on a CPU without native bf16 matmuls (no avx512_bf16/amx_bf16 flag in %s): torch emulates"
            " them, typically many times slower than fp32; param_dtype=auto (or fp32) computes in fp32 on this CPU",
            cpuinfo,
        )
    return torch.bfloat16


def _derived(value: T | None, key: str) -> T:
    """A "null = derived" config value, which validation fills in; None means the config was never validated."""
    if value is None:
        raise ValueError(
            f"{key} is null: the learner settings need a validated config (load_config and validate_config fill in"
            " the derived keys)"
        )
    return value


@dataclass(frozen=True)
class OptimSettings:
    """AdamW and learning-rate schedule (verl ``*.optim.*``)."""

    lr: float
    weight_decay: float
    betas: tuple[float, float]
    eps: float
    lr_warmup_steps: int
    lr_scheduler_type: str
    min_lr_ratio: float
    num_cycles: float  # cosine half-periods: 0.5 decays once to the floor
    total_training_steps: int

    def __post_init__(self) -> None:
        if self.lr < 0:
            raise ValueError(f"optim.lr must be >= 0, got {self.lr}")
        if self.lr_scheduler_type not in _LR_SCHEDULES:
            raise ValueError(f"optim.lr_scheduler_type must be one of {_LR_SCHEDULES}, got {self.lr_scheduler_type!r}")
        if self.lr_warmup_steps < 0:
            raise ValueError(f"optim.lr_warmup_steps must be >= 0, got {self.lr_warmup_steps}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"optim.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.lr_scheduler_type == "cosine" and self.total_training_steps <= 0:
            raise ValueError("optim.total_training_steps must be > 0 for the cosine schedule")

    @classmethod
    def from_config(cls, optim: OptimConfig, total_training_steps: int) -> OptimSettings:
        """From a validated ``optim`` section; ``total_training_steps`` is the run length, used as the horizon when
        the section leaves it at -1 (and to turn ``lr_warmup_steps_ratio`` into steps when lr_warmup_steps is -1)."""
        if optim.warmup_style is not None:
            raise ValueError("optim.warmup_style is set: validate the config first (it becomes lr_scheduler_type)")
        total = optim.total_training_steps if optim.total_training_steps >= 0 else total_training_steps
        warmup = optim.lr_warmup_steps if optim.lr_warmup_steps >= 0 else int(optim.lr_warmup_steps_ratio * total)
        return cls(
            lr=optim.lr,
            weight_decay=optim.weight_decay,
            betas=(optim.betas[0], optim.betas[1]),
            eps=ADAMW_EPS,
            lr_warmup_steps=warmup,
            lr_scheduler_type=optim.lr_scheduler_type,
            min_lr_ratio=optim.min_lr_ratio,
            num_cycles=optim.num_cycles,
            total_training_steps=total,
        )

    @classmethod
    def defaults(cls, **overrides: Any) -> OptimSettings:
        """The actor optimizer's config defaults (horizon 0: no run length), with ``overrides`` replaced."""
        return dataclasses.replace(_default_learner().optim, **overrides)


@dataclass(frozen=True)
class CriticSettings:
    """Value model (verl ``critic.*``); only used by the ``gae`` estimator."""

    ppo_mini_batch_size: int
    ppo_micro_batch_size_per_gpu: int
    ppo_epochs: int
    shuffle: bool
    cliprange_value: float
    loss_agg_mode: str
    loss_scale_factor: float | None  # critic.loss_scale_factor (None: the padded response length)
    grad_clip: float
    model_path: str
    optim: OptimSettings

    def __post_init__(self) -> None:
        for name in ("ppo_mini_batch_size", "ppo_micro_batch_size_per_gpu", "ppo_epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"critic.{name} must be >= 1, got {getattr(self, name)}")
        if self.loss_agg_mode not in _LOSS_AGG_MODES:
            raise ValueError(f"critic.loss_agg_mode must be one of {_LOSS_AGG_MODES}, got {self.loss_agg_mode!r}")

    @classmethod
    def from_config(cls, critic: CriticConfig, total_training_steps: int) -> CriticSettings:
        """From a validated ``critic`` section (its null keys then hold the actor's values)."""
        if _derived(critic.use_dynamic_bsz, "critic.use_dynamic_bsz"):
            raise ValueError("critic.use_dynamic_bsz=true is not supported by the learner yet")
        return cls(
            ppo_mini_batch_size=_derived(critic.ppo_mini_batch_size, "critic.ppo_mini_batch_size"),
            ppo_micro_batch_size_per_gpu=_derived(
                critic.ppo_micro_batch_size_per_gpu, "critic.ppo_micro_batch_size_per_gpu"
            ),
            ppo_epochs=_derived(critic.ppo_epochs, "critic.ppo_epochs"),
            shuffle=_derived(critic.shuffle, "critic.shuffle"),
            cliprange_value=critic.cliprange_value,
            loss_agg_mode=_derived(critic.loss_agg_mode, "critic.loss_agg_mode"),
            loss_scale_factor=critic.loss_scale_factor,
            grad_clip=critic.grad_clip,
            model_path=critic.model.path or "",
            optim=OptimSettings.from_config(critic.optim, total_training_steps),
        )

    @classmethod
    def defaults(cls, **overrides: Any) -> CriticSettings:
        """The critic's config defaults (those of the default, GAE, config), with ``overrides`` replaced."""
        critic = _default_learner().critic
        assert critic is not None  # the default estimator is gae
        return dataclasses.replace(critic, **overrides)


@dataclass(frozen=True)
class LearnerSettings:
    """Everything the learner step reads. Field names follow verl (``actor_rollout_ref.actor.*`` unless noted)."""

    # batch geometry
    ppo_mini_batch_size: int  # prompts per optimizer step (x rollout_n sequences)
    ppo_micro_batch_size_per_gpu: int  # sequences per forward/backward
    log_prob_micro_batch_size_per_gpu: int  # rollout.*: sequences per no-grad forward (old/ref log-probs, values)
    ppo_epochs: int
    shuffle: bool
    rollout_n: int  # actor_rollout_ref.rollout.n
    temperature: float  # actor_rollout_ref.rollout.temperature: logits are divided by it, as at sampling
    pad_token_id: int  # the tokenizer's (not a config key)
    max_prompt_length: int | None  # data.max_prompt_length: fixed P (None: the longest prompt of the step)
    max_response_length: int | None  # data.max_response_length: fixed T (seq-mean-token-sum-norm needs it)
    use_remove_padding: bool  # actor_rollout_ref.model.use_remove_padding: sequence packing
    use_shared_prompt: bool  # actor_rollout_ref.model.use_shared_prompt: each group's prompt computed once
    enable_gradient_checkpointing: bool  # actor_rollout_ref.model.enable_gradient_checkpointing
    # policy loss
    clip_ratio: float
    clip_ratio_low: float | None
    clip_ratio_high: float | None
    clip_ratio_c: float
    loss_agg_mode: str
    loss_mode: str  # actor.policy_loss.loss_mode
    mask_truncated_responses: bool  # rows that hit the length limit leave the loss (after advantages)
    entropy_coeff: float
    use_kl_loss: bool
    kl_loss_coef: float
    kl_loss_type: str
    grad_clip: float
    optim: OptimSettings
    # algorithm.*
    adv_estimator: str
    gamma: float
    lam: float
    norm_adv_by_std_in_grpo: bool
    use_kl_in_reward: bool
    kl_penalty: str
    kl_ctrl_type: str
    kl_coef: float
    kl_target: float
    kl_horizon: int
    loss_scale_factor: float | None  # actor.loss_scale_factor: Dr. GRPO's constant (None: max_response_length)
    # algorithm.rollout_correction.*: behaviour-policy (vLLM) vs proximal-policy importance weights
    rollout_is: str | None  # 'token' | 'sequence' | 'geometric'; None: no IS weights
    rollout_is_threshold: float | str  # a number = TIS cap; 'lower_upper' = IcePop bounds
    is_batch_normalize: bool  # rollout_is_batch_normalize
    rollout_rs: str | None  # rejection-sampling options (comma list), see async_rl.config.correction
    rollout_rs_threshold: float | str | None
    bypass_mode: bool  # old log-probs = the actor's; no proximal pass
    bypass_loss_type: str  # rollout_correction.loss_type: 'ppo_clip' or 'reinforce'
    # robustness / system
    max_consecutive_nonfinite: int  # actor.max_consecutive_nonfinite
    param_dtype: str  # actor.fsdp_config.mixed_precision.param_dtype: 'auto' | 'bf16' | 'fp32', see compute_dtype
    seed: int  # trainer.seed
    critic: CriticSettings | None  # None unless the estimator needs a critic
    lora: LoRASpec | None  # actor_rollout_ref.model.lora_*: adapters on the frozen policy; None = full fine-tuning

    def __post_init__(self) -> None:
        for name in (
            "ppo_mini_batch_size",
            "ppo_micro_batch_size_per_gpu",
            "log_prob_micro_batch_size_per_gpu",
            "ppo_epochs",
            "rollout_n",
            "max_consecutive_nonfinite",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.loss_agg_mode not in _LOSS_AGG_MODES:
            raise ValueError(f"loss_agg_mode must be one of {_LOSS_AGG_MODES}, got {self.loss_agg_mode!r}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.grad_clip <= 0:
            raise ValueError(f"grad_clip must be > 0, got {self.grad_clip}")
        if self.adv_estimator == "gae" and self.critic is None:
            raise ValueError("adv_estimator 'gae' needs critic settings (critic=CriticSettings(...))")
        if self.rollout_is is not None and self.rollout_is not in _IS_LEVELS:
            raise ValueError(f"rollout_is must be one of {_IS_LEVELS} or None, got {self.rollout_is!r}")
        if self.param_dtype not in _PARAM_DTYPES:
            raise ValueError(f"param_dtype must be one of {_PARAM_DTYPES}, got {self.param_dtype!r}")
        if self.bypass_loss_type not in _BYPASS_LOSS_TYPES:
            raise ValueError(f"bypass_loss_type must be one of {_BYPASS_LOSS_TYPES}, got {self.bypass_loss_type!r}")
        self.is_bounds  # noqa: B018  (parsed here, so a bad threshold fails at construction, by the config's rules)
        self.rs_bounds  # noqa: B018

    @functools.cached_property
    def is_bounds(self) -> tuple[float, float | None]:
        """``(upper, lower)`` of ``rollout_is_threshold``, parsed once (``lower`` None: truncation)."""
        return parse_is_threshold(self.rollout_is_threshold)

    @functools.cached_property
    def objective(self) -> ObjectiveSpec:
        """The actor's loss as a spec for :func:`async_rl.algorithms.objective.actor_objective`."""
        upper, lower = self.is_bounds
        return ObjectiveSpec(
            loss_mode=self.loss_mode,
            clip_ratio=self.clip_ratio,
            clip_ratio_low=self.clip_ratio_low,
            clip_ratio_high=self.clip_ratio_high,
            clip_ratio_c=self.clip_ratio_c,
            loss_agg_mode=self.loss_agg_mode,
            loss_scale_factor=self.loss_scale_factor,
            entropy_coeff=self.entropy_coeff,
            kl_loss_coef=self.kl_loss_coef if self.use_kl_loss else None,
            kl_loss_type=self.kl_loss_type,
            rollout_is=self.rollout_is,
            is_upper=upper,
            is_lower=lower,
            is_batch_normalize=self.is_batch_normalize,
            rs_bounds=self.rs_bounds,
            bypass_loss_type=self.bypass_loss_type if self.bypass_mode else None,
        )

    @functools.cached_property
    def rs_bounds(self) -> RSBounds | None:
        """``rollout_rs`` / ``rollout_rs_threshold`` parsed once into options and bounds; None without rejection."""
        if self.rollout_rs is None:
            return None
        return parse_rs_spec(self.rollout_rs, self.rollout_rs_threshold)

    @property
    def needs_ref(self) -> bool:
        """A frozen reference model is built only when some KL term needs its log-probs."""
        return self.use_kl_loss or self.use_kl_in_reward

    @property
    def needs_critic(self) -> bool:
        return self.adv_estimator == "gae"

    @property
    def requested_layout(self) -> Layout:
        """The micro-batch layout the config asks for (the learner falls back from ``shared`` for a model that
        cannot take it, see :func:`~async_rl.learner.shared_prompt.use_shared_prompt_attention`)."""
        if self.use_shared_prompt:
            return "shared"
        return "packed" if self.use_remove_padding else "padded"

    def compute_dtype(self, device: torch.device, *, warn: bool = True) -> torch.dtype:
        """The dtype the actor, reference and critic compute in on ``device`` (:func:`resolve_compute_dtype`); the
        learner resolves it once, at construction."""
        return resolve_compute_dtype(self.param_dtype, device, warn=warn)

    def replace(self, **changes: Any) -> LearnerSettings:
        return dataclasses.replace(self, **changes)

    @classmethod
    def defaults(cls, **overrides: Any) -> LearnerSettings:
        """``from_config(default_config())`` with ``overrides`` replaced: the config's defaults, for tests and tools.

        The default estimator is verl's ``gae``; overriding ``adv_estimator`` with a critic-free one also drops the
        critic settings (unless ``critic`` is given), as :meth:`from_config` would. Overriding ``clip_ratio`` moves
        both clip bounds with it unless they are given (the config's null ``clip_ratio_low``/``high``).
        """
        if "adv_estimator" in overrides and "critic" not in overrides and not needs_critic(overrides["adv_estimator"]):
            overrides = {**overrides, "critic": None}
        if "clip_ratio" in overrides:
            overrides = {"clip_ratio_low": None, "clip_ratio_high": None, **overrides}
        return _default_learner().replace(**overrides)

    @classmethod
    def from_config(cls, cfg: Config, *, total_training_steps: int | None, pad_token_id: int = 0) -> LearnerSettings:
        """Build from a validated config (derived keys filled in; ``load_config`` and ``validate_config`` do that).

        ``total_training_steps`` is the run length when the config leaves it to the data (``trainer.total_epochs``,
        see ``async_rl.runtime.run_length``); it sets the optimizer schedules' horizon unless an ``optim`` section
        sets its own. By default it is ``trainer.total_training_steps``. ``pad_token_id`` is the tokenizer's.
        """
        arr, algo = cfg.actor_rollout_ref, cfg.algorithm
        actor, rollout, model, ref = arr.actor, arr.rollout, arr.model, arr.ref
        corr, kl_ctrl = algo.rollout_correction, algo.kl_ctrl
        if total_training_steps is None:
            total_training_steps = cfg.trainer.total_training_steps
        total = int(total_training_steps or 0)
        for key, dynamic in (
            ("actor_rollout_ref.actor.use_dynamic_bsz", actor.use_dynamic_bsz),
            ("actor_rollout_ref.rollout.log_prob_use_dynamic_bsz", rollout.log_prob_use_dynamic_bsz),
            ("actor_rollout_ref.ref.log_prob_use_dynamic_bsz", ref.log_prob_use_dynamic_bsz),
        ):
            if dynamic:
                raise ValueError(f"{key}=true is not supported by the learner yet")
        critic = CriticSettings.from_config(cfg.critic, total) if needs_critic(algo.adv_estimator) else None
        return cls(
            ppo_mini_batch_size=actor.ppo_mini_batch_size,
            ppo_micro_batch_size_per_gpu=_derived(
                actor.ppo_micro_batch_size_per_gpu, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
            ),
            log_prob_micro_batch_size_per_gpu=_derived(
                rollout.log_prob_micro_batch_size_per_gpu, "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"
            ),
            ppo_epochs=actor.ppo_epochs,
            shuffle=actor.shuffle,
            rollout_n=rollout.n,
            temperature=rollout.temperature,
            pad_token_id=pad_token_id,
            max_prompt_length=cfg.data.max_prompt_length,
            max_response_length=cfg.data.max_response_length,
            use_remove_padding=model.use_remove_padding,
            use_shared_prompt=model.use_shared_prompt,
            enable_gradient_checkpointing=model.enable_gradient_checkpointing,
            clip_ratio=actor.clip_ratio,
            clip_ratio_low=actor.clip_ratio_low,
            clip_ratio_high=actor.clip_ratio_high,
            clip_ratio_c=actor.clip_ratio_c,
            loss_agg_mode=actor.loss_agg_mode,
            loss_mode=actor.policy_loss.loss_mode,
            mask_truncated_responses=actor.mask_truncated_responses,
            entropy_coeff=actor.entropy_coeff,
            use_kl_loss=actor.use_kl_loss,
            kl_loss_coef=actor.kl_loss_coef,
            kl_loss_type=actor.kl_loss_type,
            grad_clip=actor.grad_clip,
            optim=OptimSettings.from_config(actor.optim, total),
            adv_estimator=algo.adv_estimator,
            gamma=algo.gamma,
            lam=algo.lam,
            norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo,
            use_kl_in_reward=algo.use_kl_in_reward,
            kl_penalty=algo.kl_penalty,
            kl_ctrl_type=kl_ctrl.type,
            kl_coef=kl_ctrl.kl_coef,
            kl_target=kl_ctrl.target_kl,
            kl_horizon=kl_ctrl.horizon,
            loss_scale_factor=actor.loss_scale_factor,
            rollout_is=corr.rollout_is,
            rollout_is_threshold=corr.rollout_is_threshold,
            is_batch_normalize=corr.rollout_is_batch_normalize,
            rollout_rs=corr.rollout_rs,
            rollout_rs_threshold=corr.rollout_rs_threshold,
            bypass_mode=corr.bypass_mode,
            bypass_loss_type=corr.loss_type,
            max_consecutive_nonfinite=actor.max_consecutive_nonfinite,
            param_dtype=actor.fsdp_config.mixed_precision.param_dtype,
            seed=cfg.trainer.seed,
            critic=critic,
            lora=lora_spec(cfg),
        )


def lora_spec(cfg: Config) -> LoRASpec | None:
    """The policy's LoRA adapter from ``actor_rollout_ref.model``; None when ``lora_rank`` is 0."""
    model = cfg.actor_rollout_ref.model
    if model.lora_rank == 0:
        return None
    targets = model.target_modules
    return LoRASpec(
        rank=model.lora_rank,
        alpha=float(model.lora_alpha),
        target_modules=targets if isinstance(targets, str) else tuple(targets),
        exclude_modules=tuple(model.exclude_modules or ()),
    )


@functools.cache
def _default_learner() -> LearnerSettings:
    return LearnerSettings.from_config(default_config(), total_training_steps=None)
