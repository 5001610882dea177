"""The learner's own view of the configuration: small frozen dataclasses with verl's field names.

The learner needs a few dozen knobs out of the full config tree (``actor_rollout_ref.actor.*``, ``critic.*``,
``algorithm.*``). Keeping them in a flat, frozen, validated dataclass lets the learner and its tests run without the
config package and makes every knob the learner honours visible in one place. ``LearnerSettings.from_config`` reads
the verl dotted names from a config object (attribute access, guarded with ``getattr`` so missing sections fall back
to the defaults here) and is the single place that maps config keys to learner fields.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, get_args

from async_rl.config.correction import parse_is_threshold, parse_rs_spec
from async_rl.config.names import LOSS_AGG_MODES, BypassLossType, ISLevel

__all__ = ["CriticSettings", "LearnerSettings", "OptimSettings"]

_LOSS_AGG_MODES = LOSS_AGG_MODES
_IS_LEVELS = get_args(ISLevel)
_BYPASS_LOSS_TYPES = get_args(BypassLossType)
_LR_SCHEDULES = ("constant", "cosine")


def _get(obj: Any, dotted: str, default: Any) -> Any:
    """Follow ``dotted`` attribute (or mapping key) names from ``obj``; return ``default`` when any link is missing."""
    cur = obj
    for part in dotted.split("."):
        if cur is None:
            return default
        if isinstance(cur, dict):
            cur = cur.get(part, None)
        else:
            cur = getattr(cur, part, None)
    return default if cur is None else cur


@dataclass(frozen=True)
class OptimSettings:
    """AdamW and learning-rate schedule (verl ``*.optim.*``)."""

    lr: float = 1e-6
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    lr_warmup_steps: int = 0
    lr_scheduler_type: str = "constant"
    min_lr_ratio: float = 0.0
    num_cycles: float = 0.5  # cosine half-periods: 0.5 decays once to the floor
    total_training_steps: int = 0

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
    def from_config(cls, optim: Any, total_training_steps: int = 0) -> OptimSettings:
        d = cls()
        betas = _get(optim, "betas", d.betas)
        warmup = int(_get(optim, "lr_warmup_steps", -1))
        ratio = float(_get(optim, "lr_warmup_steps_ratio", 0.0))
        total = int(_get(optim, "total_training_steps", -1))
        if total < 0:
            total = total_training_steps
        if warmup < 0:
            warmup = int(ratio * total)
        schedule = _get(optim, "lr_scheduler_type", None) or _get(optim, "warmup_style", d.lr_scheduler_type)
        return cls(
            lr=float(_get(optim, "lr", d.lr)),
            weight_decay=float(_get(optim, "weight_decay", d.weight_decay)),
            betas=(float(betas[0]), float(betas[1])),
            eps=float(_get(optim, "eps", d.eps)),
            lr_warmup_steps=warmup,
            lr_scheduler_type=str(schedule),
            min_lr_ratio=float(_get(optim, "min_lr_ratio", d.min_lr_ratio)),
            num_cycles=float(_get(optim, "num_cycles", d.num_cycles)),
            total_training_steps=total,
        )


@dataclass(frozen=True)
class CriticSettings:
    """Value model (verl ``critic.*``); only used by the ``gae`` estimator."""

    ppo_mini_batch_size: int = 1
    ppo_micro_batch_size_per_gpu: int = 1
    ppo_epochs: int = 1
    cliprange_value: float = 0.5
    loss_agg_mode: str = "token-mean"
    loss_scale_factor: float | None = None  # critic.loss_scale_factor (None: the padded response length)
    grad_clip: float = 1.0
    model_path: str = ""
    optim: OptimSettings = field(default_factory=lambda: OptimSettings(lr=1e-5))

    def __post_init__(self) -> None:
        for name in ("ppo_mini_batch_size", "ppo_micro_batch_size_per_gpu", "ppo_epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"critic.{name} must be >= 1, got {getattr(self, name)}")
        if self.loss_agg_mode not in _LOSS_AGG_MODES:
            raise ValueError(f"critic.loss_agg_mode must be one of {_LOSS_AGG_MODES}, got {self.loss_agg_mode!r}")


@dataclass(frozen=True)
class LearnerSettings:
    """Everything the learner step reads. Field names follow verl (``actor_rollout_ref.actor.*`` unless noted)."""

    # batch geometry
    ppo_mini_batch_size: int = 1  # prompts per optimizer step (x rollout_n sequences)
    ppo_micro_batch_size_per_gpu: int = 1  # sequences per forward/backward
    log_prob_micro_batch_size_per_gpu: int = 4  # sequences per no-grad forward (old/ref log-probs, values)
    ppo_epochs: int = 1
    shuffle: bool = False
    rollout_n: int = 1  # actor_rollout_ref.rollout.n
    temperature: float = 1.0  # actor_rollout_ref.rollout.temperature: logits are divided by it, as at sampling
    pad_token_id: int = 0
    max_prompt_length: int | None = None  # data.max_prompt_length: fixed P (default: longest prompt of the step)
    max_response_length: int | None = None  # data.max_response_length: fixed T (seq-mean-token-sum-norm needs it)
    use_remove_padding: bool = False  # actor_rollout_ref.model.use_remove_padding: sequence packing
    enable_gradient_checkpointing: bool = False  # actor_rollout_ref.model.enable_gradient_checkpointing
    # policy loss
    clip_ratio: float = 0.2
    clip_ratio_low: float | None = None
    clip_ratio_high: float | None = None
    clip_ratio_c: float = 3.0
    loss_agg_mode: str = "token-mean"
    loss_mode: str = "vanilla"  # actor.policy_loss.loss_mode
    mask_truncated_responses: bool = False  # rows that hit the length limit leave the loss (after advantages)
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    grad_clip: float = 1.0
    optim: OptimSettings = field(default_factory=OptimSettings)
    # algorithm.*
    adv_estimator: str = "grpo"
    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std_in_grpo: bool = True
    use_kl_in_reward: bool = False
    kl_penalty: str = "kl"
    kl_ctrl_type: str = "fixed"
    kl_coef: float = 0.001
    kl_target: float = 0.1
    kl_horizon: int = 10000
    loss_scale_factor: float | None = None  # actor.loss_scale_factor: Dr. GRPO's constant (None: max_response_length)
    # algorithm.rollout_correction.*: behaviour-policy (vLLM) vs proximal-policy importance weights
    rollout_is: str | None = None  # 'token' | 'sequence' | 'geometric'; None: no IS weights
    rollout_is_threshold: float | str = 2.0  # a number = TIS cap; 'lower_upper' = IcePop bounds
    is_batch_normalize: bool = False  # rollout_is_batch_normalize
    rollout_rs: str | None = None  # rejection-sampling options (comma list), see async_rl.config.correction
    rollout_rs_threshold: float | str | None = None
    bypass_mode: bool = False  # old log-probs = the actor's; no proximal pass
    bypass_loss_type: str = "ppo_clip"  # rollout_correction.loss_type: 'ppo_clip' or 'reinforce'
    # robustness / system
    max_consecutive_nonfinite: int = 5
    mixed_precision: bool = True  # bf16 params / fp32 reduce on GPU; always fp32 on CPU
    seed: int = 0
    critic: CriticSettings | None = None

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
        if self.bypass_loss_type not in _BYPASS_LOSS_TYPES:
            raise ValueError(f"bypass_loss_type must be one of {_BYPASS_LOSS_TYPES}, got {self.bypass_loss_type!r}")
        parse_is_threshold(self.rollout_is_threshold)  # the same rules as the config's, at construction
        if self.rollout_rs is not None:
            parse_rs_spec(self.rollout_rs, self.rollout_rs_threshold)

    @property
    def needs_ref(self) -> bool:
        """A frozen reference model is built only when some KL term needs its log-probs."""
        return self.use_kl_loss or self.use_kl_in_reward

    @property
    def needs_critic(self) -> bool:
        return self.adv_estimator == "gae"

    def replace(self, **changes: Any) -> LearnerSettings:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_config(cls, cfg: Any, total_training_steps: int | None = None) -> LearnerSettings:
        """Build from the full config tree using verl's dotted names; missing keys keep the defaults above.

        ``total_training_steps`` is the run length when the config leaves it to the data (``trainer.total_epochs``,
        see ``async_rl.runtime.run_length``); it sets the optimizer schedules' horizon unless an ``optim`` section
        sets its own. By default it is ``trainer.total_training_steps``.
        """
        d = cls()
        actor = _get(cfg, "actor_rollout_ref.actor", None)
        rollout = _get(cfg, "actor_rollout_ref.rollout", None)
        model = _get(cfg, "actor_rollout_ref.model", None)
        algo = _get(cfg, "algorithm", None)
        corr = _get(algo, "rollout_correction", None)
        if total_training_steps is None:
            total_training_steps = _get(cfg, "trainer.total_training_steps", 0)
        total = int(total_training_steps or 0)
        estimator = str(_get(algo, "adv_estimator", d.adv_estimator))
        critic: CriticSettings | None = None
        if estimator == "gae":
            c = _get(cfg, "critic", None)
            cd = CriticSettings()
            critic = CriticSettings(
                ppo_mini_batch_size=int(_get(c, "ppo_mini_batch_size", cd.ppo_mini_batch_size)),
                ppo_micro_batch_size_per_gpu=int(
                    _get(c, "ppo_micro_batch_size_per_gpu", cd.ppo_micro_batch_size_per_gpu)
                ),
                ppo_epochs=int(_get(c, "ppo_epochs", cd.ppo_epochs)),
                cliprange_value=float(_get(c, "cliprange_value", cd.cliprange_value)),
                loss_agg_mode=str(_get(c, "loss_agg_mode", cd.loss_agg_mode)),
                loss_scale_factor=_get(c, "loss_scale_factor", None),
                grad_clip=float(_get(c, "grad_clip", cd.grad_clip)),
                model_path=str(_get(c, "model.path", "")),
                optim=OptimSettings.from_config(_get(c, "optim", None), total),
            )
        micro = int(_get(actor, "ppo_micro_batch_size_per_gpu", d.ppo_micro_batch_size_per_gpu))
        if bool(_get(actor, "use_dynamic_bsz", False)):
            raise ValueError("actor_rollout_ref.actor.use_dynamic_bsz=true is not supported by the learner yet")
        level = getattr(corr, "rollout_is", None) if corr is not None else None
        threshold = _get(corr, "rollout_is_threshold", d.rollout_is_threshold)
        scale = _get(actor, "loss_scale_factor", None)
        return cls(
            ppo_mini_batch_size=int(_get(actor, "ppo_mini_batch_size", d.ppo_mini_batch_size)),
            ppo_micro_batch_size_per_gpu=micro,
            log_prob_micro_batch_size_per_gpu=int(
                _get(rollout, "log_prob_micro_batch_size_per_gpu", d.log_prob_micro_batch_size_per_gpu)
            ),
            ppo_epochs=int(_get(actor, "ppo_epochs", d.ppo_epochs)),
            shuffle=bool(_get(actor, "shuffle", d.shuffle)),
            rollout_n=int(_get(rollout, "n", d.rollout_n)),
            temperature=float(_get(rollout, "temperature", d.temperature)),
            pad_token_id=int(_get(model, "pad_token_id", d.pad_token_id)),
            max_prompt_length=_get(cfg, "data.max_prompt_length", None),
            max_response_length=_get(cfg, "data.max_response_length", None),
            use_remove_padding=bool(_get(model, "use_remove_padding", d.use_remove_padding)),
            enable_gradient_checkpointing=bool(
                _get(model, "enable_gradient_checkpointing", d.enable_gradient_checkpointing)
            ),
            clip_ratio=float(_get(actor, "clip_ratio", d.clip_ratio)),
            clip_ratio_low=_get(actor, "clip_ratio_low", None),
            clip_ratio_high=_get(actor, "clip_ratio_high", None),
            clip_ratio_c=float(_get(actor, "clip_ratio_c", d.clip_ratio_c)),
            loss_agg_mode=str(_get(actor, "loss_agg_mode", d.loss_agg_mode)),
            loss_mode=str(_get(actor, "policy_loss.loss_mode", d.loss_mode)),
            mask_truncated_responses=bool(_get(actor, "mask_truncated_responses", d.mask_truncated_responses)),
            entropy_coeff=float(_get(actor, "entropy_coeff", d.entropy_coeff)),
            use_kl_loss=bool(_get(actor, "use_kl_loss", d.use_kl_loss)),
            kl_loss_coef=float(_get(actor, "kl_loss_coef", d.kl_loss_coef)),
            kl_loss_type=str(_get(actor, "kl_loss_type", d.kl_loss_type)),
            grad_clip=float(_get(actor, "grad_clip", d.grad_clip)),
            optim=OptimSettings.from_config(_get(actor, "optim", None), total),
            adv_estimator=estimator,
            gamma=float(_get(algo, "gamma", d.gamma)),
            lam=float(_get(algo, "lam", d.lam)),
            norm_adv_by_std_in_grpo=bool(_get(algo, "norm_adv_by_std_in_grpo", d.norm_adv_by_std_in_grpo)),
            use_kl_in_reward=bool(_get(algo, "use_kl_in_reward", d.use_kl_in_reward)),
            kl_penalty=str(_get(algo, "kl_penalty", d.kl_penalty)),
            kl_ctrl_type=str(_get(algo, "kl_ctrl.type", d.kl_ctrl_type)),
            kl_coef=float(_get(algo, "kl_ctrl.kl_coef", d.kl_coef)),
            kl_target=float(_get(algo, "kl_ctrl.target_kl", d.kl_target)),
            kl_horizon=int(_get(algo, "kl_ctrl.horizon", d.kl_horizon)),
            loss_scale_factor=None if scale is None else float(scale),
            rollout_is=None if level is None else str(level),
            rollout_is_threshold=threshold,
            is_batch_normalize=bool(_get(corr, "rollout_is_batch_normalize", False)),
            rollout_rs=_get(corr, "rollout_rs", None),
            rollout_rs_threshold=_get(corr, "rollout_rs_threshold", None),
            bypass_mode=bool(_get(corr, "bypass_mode", False)),
            bypass_loss_type=str(_get(corr, "loss_type", d.bypass_loss_type)),
            max_consecutive_nonfinite=int(_get(cfg, "learner.max_consecutive_nonfinite", d.max_consecutive_nonfinite)),
            mixed_precision=bool(_get(cfg, "learner.mixed_precision", d.mixed_precision)),
            seed=int(_get(cfg, "trainer.seed", d.seed)),
            critic=critic,
        )
