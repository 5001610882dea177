"""The ``distillation`` section: on-policy distillation from a frozen teacher, alone or with the task rewards.

verl's key names and defaults (``distillation.enabled``, ``distillation.teacher_model.model_path``,
``distillation.distillation_loss.*``). The student samples as usual; the teacher scores the exact tokens sampled, at
temperature 1: with ``teacher_model.placement: learner`` (the default) a frozen copy on the learner computes them in
one no-grad pass per step, as the reference model does; with ``actor`` a vLLM engine next to each actor's prefills
them (prompt log-probs) and the teacher's log-prob of each sampled token rides on the group like the behaviour
log-probs. The
learner's loss then adds, per token, a divergence between the student and the teacher on the student's own samples
(see :mod:`async_rl.algorithms.distillation`):

- ``use_policy_gradient=true`` (Thinking Machines' on-policy distillation, prime-rl's ``opd``): the signal
  ``log pi_teacher(y_t) - log pi_student(y_t)`` (the negative k1 estimate, no gradient through it) is each token's
  advantage in a clipped PPO term of its own;
- ``use_policy_gradient=false``: the estimator (``k3`` and others) is back-propagated as a loss (GKD).

``use_task_rewards=true`` adds that term to the task's policy loss (``task_loss_coef`` x task +
``distillation_loss_coef`` x distillation); false trains on the teacher's signal alone.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from async_rl.config.fields import PosFloat, UnitInterval, doc, noop

# verl's single-sample estimators of KL(student || teacher) on the sampled token (algorithms.kl's names)
DISTILL_ESTIMATORS: tuple[str, ...] = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
# verl's top-k modes: they need the teacher's top-k distribution at every position, which is not transported here
DISTILL_TOPK_MODES: tuple[str, ...] = ("forward_kl_topk", "reverse_kl_topk", "jsd_topk")


class TeacherInferenceConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The teacher's vLLM engine with ``placement: actor`` (it shares each actor's device; every other engine setting is
    the rollout's)."""

    gpu_memory_utilization: Annotated[
        UnitInterval,
        doc(
            "Fraction of device memory the teacher engine may use on a GPU actor, next to the policy engine's"
            " actor_rollout_ref.rollout.gpu_memory_utilization (the two must leave room for each other). Not read on"
            " CPU actors, whose KV cache is VLLM_CPU_KVCACHE_SPACE per engine."
        ),
    ] = 0.3


TeacherPlacement = Literal["actor", "learner"]


class TeacherModelConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The frozen teacher."""

    model_path: Annotated[
        str | None,
        doc("The teacher: a Hugging Face directory or a builtin: model with the student's tokenizer."),
    ] = None
    placement: Annotated[
        TeacherPlacement,
        doc(
            "Where the teacher scores the samples. 'learner': a frozen FSDP2 copy on the learner, one no-grad pass"
            " per step like the reference model's (shared prompts, the learner's precision). 'actor': each actor"
            " serves it in a second vLLM engine (dtype, max_model_len and the rest as actor_rollout_ref.rollout;"
            " prompt log-probs of every completion) and the scores ride on the groups. Not a verl key (verl serves"
            " teachers in a pool of their own); docs/distillation.md has the numbers behind the default."
        ),
    ] = "learner"
    inference: Annotated[TeacherInferenceConfig, doc("The teacher engine.")] = msgspec.field(
        default_factory=TeacherInferenceConfig
    )


class DistillationLossConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How the teacher's log-probs enter the actor's loss (verl's names and defaults)."""

    loss_mode: Annotated[
        str,
        doc(
            "Per-token estimator of KL(student || teacher) on the sampled token, as kl_loss_type: k1 (= kl), abs,"
            " k2 (= mse), k3 (= low_var_kl). With use_policy_gradient k1 gives the on-policy-distillation signal."
        ),
    ] = "k3"
    topk: Annotated[
        int | None,
        noop("verl's top-k losses are not built here: the teacher reports the sampled token's log-prob only."),
    ] = 128
    use_task_rewards: Annotated[
        bool,
        doc(
            "Keep the task's policy loss (rewards, advantages) and add the distillation term to it; false: the"
            " distillation term alone (entropy and KL-loss terms still apply when configured)."
        ),
    ] = True
    distillation_loss_coef: Annotated[
        float, doc("Weight of the distillation term when use_task_rewards is true (1 without task rewards).")
    ] = 1.0
    task_loss_coef: Annotated[float, doc("Weight of the task's policy loss when use_task_rewards is true.")] = 1.0
    loss_max_clamp: Annotated[
        PosFloat | None, doc("Each token's estimate is clamped to [-this, this] (null: no clamp).")
    ] = 10.0
    log_prob_min_clamp: Annotated[
        float | None, doc("Student and teacher log-probs are floored at this before the estimate (null: no floor).")
    ] = -10.0
    use_policy_gradient: Annotated[
        bool,
        doc(
            "The estimate, negated and detached, is each token's advantage in a clipped PPO term (on-policy"
            " distillation as Thinking Machines and prime-rl run it; use loss_mode=k1). False: the estimate is"
            " back-propagated directly as a loss (use k3, k2 or abs; k1 is refused: its gradient ignores the teacher)."
        ),
    ] = True
    policy_loss_mode: Annotated[str, doc("The distillation term's policy loss with use_policy_gradient: vanilla.")] = (
        "vanilla"
    )
    clip_ratio: Annotated[float, doc("PPO clip range of the distillation term (use_policy_gradient).")] = 0.2
    clip_ratio_low: Annotated[float | None, doc("Lower clip of the distillation term (null: clip_ratio).")] = 0.2
    clip_ratio_high: Annotated[float | None, doc("Upper clip of the distillation term (null: clip_ratio).")] = 0.2


class DistillationConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """On-policy distillation from a frozen teacher."""

    enabled: Annotated[
        bool,
        doc(
            "Score every training completion with the teacher (teacher_model.model_path) and add the distillation"
            " term to the actor's loss. Validation rounds are not scored."
        ),
    ] = False
    teacher_model: Annotated[TeacherModelConfig, doc("The teacher.")] = msgspec.field(
        default_factory=TeacherModelConfig
    )
    distillation_loss: Annotated[DistillationLossConfig, doc("The distillation term.")] = msgspec.field(
        default_factory=DistillationLossConfig
    )


def teacher_at(cfg: DistillationConfig, placement: TeacherPlacement) -> bool:
    """Whether distillation is on with its teacher at ``placement`` (``learner`` or ``actor``)."""
    return cfg.enabled and cfg.teacher_model.placement == placement


def distillation_errors(cfg: DistillationConfig, *, rollout_gpu_memory_utilization: float) -> list[str]:
    """The section's own rules (each error names its key); nothing when distillation is off."""
    if not cfg.enabled:
        return []
    errors: list[str] = []
    key, loss = "distillation", cfg.distillation_loss
    if not cfg.teacher_model.model_path:
        errors.append(f"{key}.enabled=true needs {key}.teacher_model.model_path (the teacher's directory)")
    if loss.loss_mode in DISTILL_TOPK_MODES:
        errors.append(
            f"{key}.distillation_loss.loss_mode={loss.loss_mode!r} needs the teacher's top-k distribution at every"
            " position, which is not transported here; use k1 (with use_policy_gradient) or k3"
        )
    elif loss.loss_mode not in DISTILL_ESTIMATORS:
        errors.append(
            f"{key}.distillation_loss.loss_mode must be one of {', '.join(DISTILL_ESTIMATORS)}, got {loss.loss_mode!r}"
        )
    elif not loss.use_policy_gradient and loss.loss_mode in ("k1", "kl"):
        errors.append(
            f"{key}.distillation_loss.loss_mode={loss.loss_mode!r} with use_policy_gradient=false: the gradient of k1"
            " does not depend on the teacher; use k3, k2 or abs, or use_policy_gradient=true"
        )
    if loss.policy_loss_mode != "vanilla":
        errors.append(f"{key}.distillation_loss.policy_loss_mode must be 'vanilla', got {loss.policy_loss_mode!r}")
    for name in ("clip_ratio", "clip_ratio_low", "clip_ratio_high"):
        value = getattr(loss, name)
        if value is not None and not 0 < value < 1:
            errors.append(f"{key}.distillation_loss.{name} must be in (0, 1), got {value}")
    total = rollout_gpu_memory_utilization + cfg.teacher_model.inference.gpu_memory_utilization
    if teacher_at(cfg, "actor") and total > 0.95:
        errors.append(
            f"actor_rollout_ref.rollout.gpu_memory_utilization + {key}.teacher_model.inference.gpu_memory_utilization"
            f" = {total:.2f} > 0.95: both engines share each actor's device"
        )
    return errors


__all__ = [
    "TeacherPlacement",
    "DISTILL_ESTIMATORS",
    "DISTILL_TOPK_MODES",
    "DistillationConfig",
    "DistillationLossConfig",
    "TeacherInferenceConfig",
    "TeacherModelConfig",
    "distillation_errors",
    "teacher_at",
]
