"""Config sections shared by several parts of the tree: optimizer/scheduler settings and FSDP settings.

``OptimConfig`` appears under ``actor_rollout_ref.actor.optim`` and ``critic.optim``; ``FsdpConfig`` under the
reference and critic, and ``ActorFsdpConfig`` (the same plus verl's ``mixed_precision``) under the actor. Names and
meanings follow verl so its command lines port unchanged.
"""

from typing import Annotated, Literal

import msgspec

from async_rl.config.fields import NonNegFloat, NonNegInt, Prob, doc, noop
from async_rl.config.names import LRSchedule, ModelDtype, ParamDtype


class OptimConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """AdamW optimizer and learning-rate schedule (verl's ``optim`` section)."""

    lr: Annotated[NonNegFloat, doc("Peak learning rate of AdamW.")] = 1e-6
    lr_warmup_steps: Annotated[
        int, doc("Linear warm-up length in optimizer steps; -1 = use lr_warmup_steps_ratio instead.", ge=-1)
    ] = -1
    lr_warmup_steps_ratio: Annotated[
        Prob, doc("Warm-up length as a fraction of total_training_steps (used when lr_warmup_steps is -1).")
    ] = 0.0
    lr_scheduler_type: Annotated[
        LRSchedule, doc("Learning-rate schedule after warm-up: 'constant' or 'cosine' decay to min_lr_ratio * lr.")
    ] = "constant"
    warmup_style: Annotated[
        LRSchedule | None,
        doc("Deprecated verl alias of lr_scheduler_type; when set it replaces lr_scheduler_type (null = unset)."),
    ] = None
    min_lr_ratio: Annotated[Prob, doc("Cosine schedule floor as a fraction of lr.")] = 0.0
    num_cycles: Annotated[
        NonNegFloat, doc("Cosine schedule: number of half-periods (0.5 = decay once to the floor).")
    ] = 0.5
    weight_decay: Annotated[NonNegFloat, doc("AdamW decoupled weight decay.")] = 0.01
    betas: Annotated[tuple[Prob, Prob], doc("AdamW (beta1, beta2).")] = (0.9, 0.999)
    total_training_steps: Annotated[
        int, doc("Scheduler horizon in optimizer steps; -1 = filled in from the trainer's run length.", ge=-1)
    ] = -1


def critic_optim_default() -> OptimConfig:
    """Critic optimizer defaults: verl uses a 10x larger learning rate for the value model."""
    return OptimConfig(lr=1e-5)


class WrapPolicyConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """verl's ``fsdp_config.wrap_policy``: how the model is cut into FSDP2 units (each gathered and reduced as one)."""

    min_num_params: Annotated[
        NonNegInt,
        doc(
            "0 = one FSDP2 unit per decoder layer (verl's default); N > 0 = consecutive decoder layers grouped into"
            " units of at least N parameters each (the last unit takes what is left): fewer, larger gathers and"
            " reductions, so ranks wait on each other less often, for one unit's gathered parameters and gradients"
            " more per rank (SmolLM2 learner beside a one-core load, 3 units of 10 layers: about 10% faster steps for"
            " 150-200 MiB more per rank)."
        ),
    ] = 0
    transformer_layer_cls_to_wrap: Annotated[
        list[str] | None, noop("The decoder-layer classes are the model's own (_no_split_modules).")
    ] = None


class FsdpConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """FSDP2 sharding options for one model (verl's ``fsdp_config``)."""

    param_offload: Annotated[bool, noop("CPU offload of the sharded parameters; they always stay on the device.")] = (
        False
    )
    optimizer_offload: Annotated[bool, noop("CPU offload of the optimizer state; it always stays on the device.")] = (
        False
    )
    model_dtype: Annotated[ModelDtype, noop("Dtype of the master parameters; they are always fp32 here.")] = "fp32"
    offload_policy: Annotated[bool, noop("FSDP2 CPUOffloadPolicy switch.")] = False
    reshard_after_forward: Annotated[
        bool,
        doc(
            "FSDP2: free each layer's gathered parameters after its forward and gather them again for its backward"
            " (true); false keeps them until the backward: fewer gathers, more memory (SmolLM2 recipe, learner alone:"
            " 5% faster for 165 MiB more per rank)."
        ),
    ] = True
    fsdp_size: Annotated[int, noop("FSDP group size (-1 = world).")] = -1
    forward_prefetch: Annotated[bool, noop("FSDP forward prefetch.")] = False
    wrap_policy: Annotated[
        WrapPolicyConfig, doc("Which modules become FSDP2 units (verl's key; only min_num_params acts here).")
    ] = msgspec.field(default_factory=WrapPolicyConfig)


class MixedPrecisionConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """verl's ``fsdp_config.mixed_precision``: the dtypes FSDP2 computes and reduces in (verl's null = these).

    verl's spelling ``param_dtype: bf16`` keeps its meaning (mixed precision); the default ``auto`` differs from verl's
    ``bf16`` only on CPUs where bf16 is slower than fp32, where it computes in fp32 (:mod:`async_rl.config.precision`).
    """

    param_dtype: Annotated[
        ParamDtype,
        doc(
            "Dtype the learner computes in (FSDP2 all-gathers the parameters in it for forward and backward; a single"
            " process without torchrun uses torch.autocast): 'bf16' ="
            " mixed precision wherever the learner runs, CPU included (master weights, gradients, gradient reduction"
            " and optimizer state stay fp32; log-probs are computed in fp32 from the bf16 logits), 'fp32' = full"
            " precision, 'auto' = 'bf16' on CUDA, on CPUs with amx_bf16 and on AMD CPUs with avx512_bf16 (flags in"
            " /proc/cpuinfo), 'fp32' on other CPUs, where bf16 matmuls are emulated (AVX2 only) or slower than fp32"
            " (Intel avx512_bf16 without AMX); an explicit 'bf16' there gets a start-up warning. The actor, the critic"
            " and the frozen reference model all follow it."
        ),
    ] = "auto"
    reduce_dtype: Annotated[Literal["fp32"], doc("Dtype of the gradient reduction (always fp32).")] = "fp32"
    buffer_dtype: Annotated[Literal["fp32"], doc("Dtype of the model buffers (always fp32).")] = "fp32"


class ActorFsdpConfig(FsdpConfig, kw_only=True, forbid_unknown_fields=True):
    """The policy's FSDP2 options: :class:`FsdpConfig` plus the learner's precision."""

    mixed_precision: Annotated[MixedPrecisionConfig, doc("Learner compute precision (verl's key).")] = msgspec.field(
        default_factory=MixedPrecisionConfig
    )


__all__ = ["ActorFsdpConfig", "FsdpConfig", "MixedPrecisionConfig", "OptimConfig", "critic_optim_default"]
