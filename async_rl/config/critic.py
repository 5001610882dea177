"""The ``critic`` section: the value model used by critic-based estimators (``gae``).

verl names and meanings. Keys whose default is null inherit the actor's value during validation (as verl's
``${actor_rollout_ref.actor....}`` interpolations do). With a critic-less estimator (grpo, rloo, ...) this whole section
is unused, and validation rejects non-default values in it rather than ignoring them silently.
"""

from typing import Annotated, Any

import msgspec

from async_rl.config.common import FsdpConfig, OptimConfig, critic_optim_default
from async_rl.config.fields import NonNegFloat, PosFloat, PosInt, doc, noop
from async_rl.config.names import LossAggMode, Strategy


class CriticModelConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The value model: a causal LM backbone with a scalar value head."""

    path: Annotated[
        str | None,
        doc("HF hub id or directory of the value-model backbone; 'builtin:tiny-arith' = the demo model built in code."),
    ] = "builtin:tiny-arith"
    enable_gradient_checkpointing: Annotated[
        bool | None,
        doc(
            "Recompute activations in backward. The critic is built with"
            " actor_rollout_ref.model.enable_gradient_checkpointing: null = that value; a different one is ignored"
            " with a start-up warning."
        ),
    ] = None
    use_remove_padding: Annotated[
        bool | None,
        doc(
            "Pack sequences without padding. The critic packs as actor_rollout_ref.model.use_remove_padding says:"
            " null = that value; a different one is ignored with a start-up warning."
        ),
    ] = None
    trust_remote_code: Annotated[
        bool, noop("Custom model code from the hub is never run here: a model that needs it fails to load.")
    ] = False
    fsdp_config: Annotated[FsdpConfig, doc("Critic FSDP options.")] = msgspec.field(default_factory=FsdpConfig)
    tokenizer_path: Annotated[str | None, noop("Critic tokenizer (the policy's tokenizer is used).")] = None
    override_config: Annotated[dict[str, Any], noop("HF config overrides.")] = msgspec.field(default_factory=dict)
    external_lib: Annotated[str | None, noop("Custom model module.")] = None
    enable_activation_offload: Annotated[bool, noop("Activation offload.")] = False
    use_shm: Annotated[bool, noop("Shared-memory model copy.")] = False
    lora_rank: Annotated[int, noop("LoRA for the critic is not supported: the critic trains all its weights.")] = 0
    lora_alpha: Annotated[int, noop("LoRA alpha.")] = 16
    target_modules: Annotated[str | list[str], noop("LoRA targets.")] = "all-linear"


class CriticConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Value-model training (PPO value loss with clipping)."""

    strategy: Annotated[Strategy, doc("Data-parallel strategy ('fsdp' and 'fsdp2' both mean FSDP2).")] = "fsdp"
    model: Annotated[CriticModelConfig, doc("Value model.")] = msgspec.field(default_factory=CriticModelConfig)
    optim: Annotated[OptimConfig, doc("Critic optimizer (default lr 1e-5).")] = msgspec.field(
        default_factory=critic_optim_default
    )
    ppo_mini_batch_size: Annotated[
        PosInt | None, doc("PROMPTS per critic optimizer step (x rollout.n); null = actor.ppo_mini_batch_size.")
    ] = None
    ppo_micro_batch_size: Annotated[
        PosInt | None, doc("Deprecated: GLOBAL critic micro-batch in sequences; use _per_gpu.")
    ] = None
    ppo_micro_batch_size_per_gpu: Annotated[
        PosInt | None, doc("Sequences per critic forward/backward per rank; null = the rank's mini-batch share.")
    ] = None
    use_dynamic_bsz: Annotated[
        bool | None, doc("Token-budget micro-batches (not supported: true is rejected); null = actor.use_dynamic_bsz.")
    ] = None
    ppo_max_token_len_per_gpu: Annotated[
        PosInt, noop("Token budget of a dynamic critic micro-batch (dynamic batching is not supported).")
    ] = 32768
    ppo_epochs: Annotated[PosInt | None, doc("Critic passes per batch; null = actor.ppo_epochs.")] = None
    shuffle: Annotated[bool | None, doc("Shuffle between critic mini-batches; null = actor.shuffle.")] = None
    grad_clip: Annotated[PosFloat, doc("Critic gradient-norm clip.")] = 1.0
    cliprange_value: Annotated[NonNegFloat, doc("Value clipping range around the old values.")] = 0.5
    loss_agg_mode: Annotated[LossAggMode | None, doc("Value-loss aggregation; null = actor.loss_agg_mode.")] = None
    loss_scale_factor: Annotated[
        PosFloat | None, doc("seq-mean-token-sum-norm divisor of the value loss; null = data.max_response_length.")
    ] = None
    rollout_n: Annotated[int | None, noop("verl copy of rollout.n.")] = None
    forward_micro_batch_size: Annotated[int | None, noop("Critic forward micro-batch.")] = None
    forward_micro_batch_size_per_gpu: Annotated[int | None, noop("Critic forward micro-batch per GPU.")] = None
    forward_max_token_len_per_gpu: Annotated[int | None, noop("Critic forward token budget.")] = None
    ulysses_sequence_parallel_size: Annotated[int, noop("Ulysses sequence parallelism (not supported).")] = 1
    checkpoint: Annotated[dict[str, Any], noop("verl checkpoint contents.")] = msgspec.field(default_factory=dict)


__all__ = ["CriticConfig", "CriticModelConfig"]
