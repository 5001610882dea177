"""The ``actor_rollout_ref`` section: policy model, its training (actor), generation (rollout) and reference model.

Names and meanings are verl's. Batch-size units follow verl: ``ppo_mini_batch_size`` counts PROMPTS (it is multiplied
by ``rollout.n``), the ``*_per_gpu`` micro-batch sizes count SEQUENCES per learner rank. The deprecated global micro
batch sizes (without ``_per_gpu``) are converted to per-rank sizes during validation.
"""

from typing import Annotated, Any, Literal

import msgspec

from async_rl.config.common import ActorFsdpConfig, FsdpConfig, OptimConfig
from async_rl.config.fields import NonNegFloat, NonNegInt, PosFloat, PosInt, UnitInterval, doc, noop
from async_rl.config.names import (
    KLKind,
    LossAggMode,
    PolicyLossMode,
    RolloutDtype,
    RolloutEngine,
    SanityCheckMode,
    Strategy,
    ToolFormat,
    TruncateSide,
)

_MICRO = "null = derived"


class ModelConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The policy model (shared by actor, rollout and reference)."""

    path: Annotated[
        str,
        doc("HF hub id or local directory of the policy; 'builtin:tiny-arith' = the demo model built in code."),
    ] = "builtin:tiny-arith"
    enable_gradient_checkpointing: Annotated[bool, doc("Recompute activations in backward to save memory.")] = True
    gradient_checkpointing_interval: Annotated[
        PosInt | Literal["auto"],
        doc(
            "With enable_gradient_checkpointing: checkpoint every k-th decoder layer of the policy (layers 0, k, 2k,"
            " ...), keeping the other layers' activations for the backward: less recomputation for more memory"
            " (this project's key; verl has none). 1 = every layer, as verl does. auto = every third layer where the"
            " learner computes in bf16 (its activations take half the bytes), every layer in fp32"
            " (async_rl.config.precision.checkpoint_interval)."
        ),
    ] = 1
    use_remove_padding: Annotated[bool, doc("Pack sequences without padding in the learner forward (varlen).")] = False
    use_shared_prompt: Annotated[
        bool,
        doc(
            "Compute each group's prompt once in the learner (this project's key; verl has none): a micro-batch is one"
            " padding-free row [prompt | completion 1 | ... | completion m] per group, each completion attending to"
            " the prompt and its own earlier tokens, with position ids continuing from the prompt, so log-probs,"
            " values and gradients equal those of separate sequences. Applies to the policy, proximal, reference and"
            " critic passes and supersedes use_remove_padding; a model whose attention does not go through"
            " transformers' attention interface keeps the separate layout (start-up warning)."
        ),
    ] = True
    trust_remote_code: Annotated[
        bool, noop("Custom model code from the hub is never run here: a model that needs it fails to load.")
    ] = False
    external_lib: Annotated[str | None, noop("Python module imported to register custom models.")] = None
    override_config: Annotated[dict[str, Any], noop("HF config overrides.")] = msgspec.field(default_factory=dict)
    enable_activation_offload: Annotated[bool, noop("Activation offload.")] = False
    use_shm: Annotated[bool, noop("Copy the model to shared memory first.")] = False
    lora_rank: Annotated[
        NonNegInt,
        doc(
            "LoRA rank: > 0 trains low-rank adapters on the frozen model and syncs only them, as versioned vLLM"
            " adapters; 0 = full fine-tuning."
        ),
    ] = 0
    lora_alpha: Annotated[PosFloat, doc("LoRA alpha: the adapter's update is scaled by lora_alpha / lora_rank.")] = 16
    target_modules: Annotated[
        str | list[str],
        doc("Linear layers that get adapters: 'all-linear' (every one but the output layer) or module names."),
    ] = "all-linear"
    exclude_modules: Annotated[
        list[str] | None, doc("Module names left without adapters (matched like target_modules); null = none.")
    ] = None
    use_liger: Annotated[bool, noop("Liger kernels.")] = False
    use_fused_kernels: Annotated[
        bool,
        doc(
            "Fused output layer: the policy and reference compute log-probs (and entropy) from the final hidden states"
            " a chunk of rows at a time, forward and backward, so no [tokens, vocab] logits are kept (one more"
            " product of the output layer's size in the backward). Exact up to rounding; warns and does nothing on"
            " a model whose output layer is not a bias-free linear layer returned as is."
        ),
    ] = False
    custom_chat_template: Annotated[
        str | None,
        doc("Jinja chat template that replaces the tokenizer's own (prompts, multi-turn rendering); null = its own."),
    ] = None


class PolicyLossConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Which clipped policy-gradient objective the actor minimises."""

    loss_mode: Annotated[
        PolicyLossMode, doc("'vanilla' = PPO clipped objective (with dual clip); 'geo_mean' = GMPO geometric-mean PPO.")
    ] = "vanilla"


class ActorConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Policy training: PPO mini/micro batching, clipping, entropy and KL-loss terms, optimizer, FSDP."""

    strategy: Annotated[Strategy, doc("Data-parallel strategy; 'fsdp' and 'fsdp2' both mean FSDP2 here.")] = "fsdp"
    ppo_mini_batch_size: Annotated[
        PosInt, doc("PROMPTS per optimizer step (x rollout.n sequences); must divide data.train_batch_size.")
    ] = 8
    ppo_micro_batch_size: Annotated[
        PosInt | None, doc("Deprecated: GLOBAL micro-batch in sequences (split over learner ranks); use _per_gpu.")
    ] = None
    ppo_micro_batch_size_per_gpu: Annotated[
        PosInt | None,
        doc(
            f"Sequences per forward/backward on each learner rank (gradient accumulation); {_MICRO}: the rank's share."
        ),
    ] = None
    use_dynamic_bsz: Annotated[
        bool,
        doc(
            "verl's token-budget micro-batches (instead of a sequence count); not supported by this learner yet, so"
            " true is rejected at start-up."
        ),
    ] = False
    ppo_max_token_len_per_gpu: Annotated[
        PosInt, noop("Token budget of a dynamic micro-batch (use_dynamic_bsz, which is not supported).")
    ] = 16384
    ppo_epochs: Annotated[PosInt, doc("Passes over each training batch.")] = 1
    shuffle: Annotated[bool, doc("Shuffle sequences between mini-batches within a step.")] = False
    clip_ratio: Annotated[PosFloat, doc("PPO clip epsilon (used for both sides unless the low/high ones are set).")] = (
        0.2
    )
    clip_ratio_low: Annotated[
        PosFloat | None, doc("Lower clip epsilon: ratio >= 1 - clip_ratio_low; null = clip_ratio.")
    ] = None
    clip_ratio_high: Annotated[
        PosFloat | None, doc("Upper clip epsilon: ratio <= 1 + clip_ratio_high; null = clip_ratio.")
    ] = None
    clip_ratio_c: Annotated[float, doc("Dual-clip constant for negative advantages (must be > 1).")] = 3.0
    loss_agg_mode: Annotated[LossAggMode, doc("How token losses are aggregated into the batch loss.")] = "token-mean"
    loss_scale_factor: Annotated[
        PosFloat | None,
        doc("seq-mean-token-sum-norm (Dr. GRPO) divides by this constant; null = data.max_response_length."),
    ] = None
    entropy_coeff: Annotated[float, doc("Entropy bonus coefficient (0 = off).")] = 0.0
    skip_zero_advantage: Annotated[
        bool,
        doc(
            "Leave sequences whose advantages are all exactly zero (a GRPO group whose rewards are all equal) out of"
            " the update's forward and backward, where their loss and gradient are exactly zero: no entropy bonus,"
            " KL loss or distillation term, and no batch-normalised importance weights or rejection sampling. The"
            " loss is still normalised over the whole mini-batch, so the update is the same (this project's key;"
            " verl has none). Metrics over the update's tokens (entropy, clip fractions, the off-policy ESS when the"
            " proximal pass is skipped) then cover the sequences computed."
        ),
    ] = True
    step_kl_freq: Annotated[
        NonNegInt,
        doc(
            "Every N steps, measure how far the step moved the policy: after the optimizer updates, one no-grad"
            " forward over the sequences the update computed gives learner/actor/step_kl (KL from the policy before"
            " the step to the policy after it) and learner/actor/step_abs_log_ratio. With one optimizer step per"
            " batch the PPO ratio is exactly 1 at the update, so ppo_kl and the clip fractions are 0 and this is the"
            " only view of the step's size. 0 = off (the forward is a no-grad pass over the trained sequences;"
            " this project's key, verl has none)."
        ),
    ] = 0
    use_kl_loss: Annotated[bool, doc("Add a KL(policy || reference) term to the actor loss (GRPO style).")] = False
    kl_loss_coef: Annotated[NonNegFloat, doc("Coefficient of the KL loss term.")] = 0.001
    kl_loss_type: Annotated[KLKind, doc("KL estimator of the KL loss ('+' suffix: straight-through k2 gradient).")] = (
        "low_var_kl"
    )
    grad_clip: Annotated[PosFloat, doc("Global gradient-norm clip.")] = 1.0
    mask_truncated_responses: Annotated[
        bool,
        doc(
            "DAPO's overlong filtering: responses whose finish_reason is 'length' (cut at data.max_response_length)"
            " keep their place in their group's advantage statistics but contribute nothing to the policy loss, the"
            " entropy and KL terms, the critic's value loss, or the loss denominators (metric"
            " learner/batch/truncated_masked counts them)."
        ),
    ] = False
    policy_loss: Annotated[PolicyLossConfig, doc("Policy objective.")] = msgspec.field(default_factory=PolicyLossConfig)
    optim: Annotated[OptimConfig, doc("Actor optimizer.")] = msgspec.field(default_factory=OptimConfig)
    fsdp_config: Annotated[ActorFsdpConfig, doc("Actor FSDP options and the learner's precision.")] = msgspec.field(
        default_factory=ActorFsdpConfig
    )
    max_consecutive_nonfinite: Annotated[
        PosInt,
        doc(
            "Stop the run after this many optimizer steps in a row skipped for a non-finite loss or gradient norm"
            " (the actor and the critic each count their own)."
        ),
    ] = 5
    use_torch_compile: Annotated[bool, noop("torch.compile of the loss helpers.")] = True
    ulysses_sequence_parallel_size: Annotated[int, noop("Ulysses sequence parallelism (not supported).")] = 1
    data_loader_seed: Annotated[int | None, noop("Seed of verl's actor data loader.")] = None
    checkpoint: Annotated[dict[str, Any], noop("verl checkpoint contents.")] = msgspec.field(default_factory=dict)


class ValKwargs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Sampling used for validation generations."""

    temperature: Annotated[NonNegFloat, doc("Validation sampling temperature (0 = greedy).")] = 0.0
    top_p: Annotated[UnitInterval, doc("Validation nucleus sampling mass, in (0, 1].")] = 1.0
    top_k: Annotated[int, doc("Validation top-k (-1 = off).")] = -1
    n: Annotated[PosInt, doc("Samples per validation prompt (with do_sample; greedy decoding makes one).")] = 1
    do_sample: Annotated[
        bool, doc("Sample with these settings (true) or decode greedily (false: temperature/top_p/top_k/n ignored).")
    ] = False


class MultiTurnConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Multi-turn episodes: the model talks with an environment (tool calls, games) over several turns.

    verl's keys where verl has them; ``environment`` and the two timeouts are this system's. The episode's whole
    response (model tokens plus observation tokens) is bounded by ``data.max_response_length``; each turn generates
    at most what is left of it."""

    enable: Annotated[bool, doc("Run multi-turn episodes with `environment` instead of single completions.")] = False
    environment: Annotated[
        str | None,
        doc(
            "'module:Class' of the environment (async_rl.envs.base.Environment); built in:"
            " async_rl.envs.calculator:CalculatorEnv, async_rl.envs.guessing:GuessingEnv. Required when enabled."
        ),
    ] = None
    environment_kwargs: Annotated[
        dict[str, Any], doc("Keyword arguments for the environment class (msgpack-able values).")
    ] = msgspec.field(default_factory=dict)
    max_assistant_turns: Annotated[
        PosInt | None, doc("Most model turns per episode; null = bounded only by the response length.")
    ] = None
    max_user_turns: Annotated[
        PosInt | None, doc("Most environment (observation) turns per episode; null = bounded only by the length.")
    ] = None
    max_parallel_calls: Annotated[PosInt, doc("Tool calls executed per model turn; further calls are ignored.")] = 1
    max_tool_response_length: Annotated[
        PosInt, doc("Characters of one tool response kept (longer ones truncated).")
    ] = 256
    tool_response_truncate_side: Annotated[
        TruncateSide, doc("Which part of an over-long tool response is kept: left (start), right (end), middle (both).")
    ] = "middle"
    format: Annotated[ToolFormat, doc("Tool-call format: 'hermes' = <tool_call>{json}</tool_call>.")] = "hermes"
    tokenization_sanity_check_mode: Annotated[
        SanityCheckMode,
        doc(
            "Check each episode's tokens against the chat template rendering the whole conversation: 'strict' counts"
            " every mismatch (metric rollout/template_mismatches), 'ignore_strippable' ignores whitespace-only tokens,"
            " 'disable' skips the check."
        ),
    ] = "strict"
    call_timeout_s: Annotated[PosFloat, doc("Wall-clock limit of one environment call (a tool run, a reset).")] = 10.0
    episode_timeout_s: Annotated[PosFloat, doc("Wall-clock limit of one episode, generation included.")] = 600.0
    tool_config_path: Annotated[
        str | None, noop("verl's tool yaml is not read: tools belong to the `environment` class.")
    ] = None
    interaction_config_path: Annotated[
        str | None, noop("verl's interaction yaml is not read: the `environment` class answers the model.")
    ] = None
    use_inference_chat_template: Annotated[
        bool, noop("The model's own sampled tokens are always what is trained (verl's false).")
    ] = False
    num_repeat_rollouts: Annotated[int | None, noop("Episodes per prompt are rollout.n.")] = None


class RolloutConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Generation on the vLLM actors."""

    name: Annotated[RolloutEngine, doc("Inference engine of the actors (only 'vllm').")] = "vllm"
    n: Annotated[PosInt, doc("Completions sampled per prompt (group size).")] = 1
    temperature: Annotated[NonNegFloat, doc("Sampling temperature of training rollouts.")] = 1.0
    top_p: Annotated[UnitInterval, doc("Nucleus sampling mass, in (0, 1].")] = 1.0
    top_k: Annotated[int, doc("Top-k sampling (-1 = off; otherwise > 0).")] = -1
    prompt_length: Annotated[PosInt | None, doc("Max prompt tokens; null = data.max_prompt_length.")] = None
    response_length: Annotated[PosInt | None, doc("Max generated tokens; null = data.max_response_length.")] = None
    dtype: Annotated[
        RolloutDtype,
        doc(
            "vLLM weight/activation dtype; 'auto' = bfloat16 on CUDA, on CPUs with amx_bf16 and on AMD CPUs with"
            " avx512_bf16, float32 on other CPUs (resolved by each actor on its own host, by the learner's rule)."
        ),
    ] = "bfloat16"
    gpu_memory_utilization: Annotated[UnitInterval, doc("Fraction of device memory vLLM may use, in (0, 1].")] = 0.5
    tensor_model_parallel_size: Annotated[PosInt, doc("Tensor-parallel degree of each vLLM actor.")] = 1
    max_num_seqs: Annotated[PosInt, doc("vLLM max concurrent sequences per actor.")] = 1024
    max_num_batched_tokens: Annotated[
        PosInt, doc("vLLM max tokens per scheduler step (raised to max_model_len when chunked prefill is off).")
    ] = 8192
    max_model_len: Annotated[PosInt | None, doc("vLLM context length; null = prompt_length + response_length.")] = None
    enforce_eager: Annotated[bool, doc("Disable CUDA graphs in vLLM.")] = True
    enable_chunked_prefill: Annotated[
        bool, doc("vLLM chunked prefill (always off on CPU: vLLM's CPU build crashes on chunked seeded requests).")
    ] = True
    enable_prefix_caching: Annotated[bool, doc("vLLM prefix caching (entries are salted per policy version).")] = True
    log_prob_micro_batch_size: Annotated[
        PosInt | None, doc("Deprecated: GLOBAL micro-batch for learner log-prob recomputation; use _per_gpu.")
    ] = None
    log_prob_micro_batch_size_per_gpu: Annotated[
        PosInt | None,
        doc(f"Sequences per rank per forward when the learner recomputes old log-probs; {_MICRO} from the actor's."),
    ] = None
    log_prob_use_dynamic_bsz: Annotated[
        bool | None,
        noop(
            "Token-budget micro-batches for log-prob recomputation are not supported (true is rejected): the passes"
            " use log_prob_micro_batch_size_per_gpu."
        ),
    ] = None
    log_prob_max_token_len_per_gpu: Annotated[
        PosInt | None, noop("Token budget of a dynamic log-prob micro-batch (dynamic batching is not supported).")
    ] = None
    val_kwargs: Annotated[ValKwargs, doc("Validation sampling.")] = msgspec.field(default_factory=ValKwargs)
    mode: Annotated[str, noop("verl rollout mode (sync/async); always asynchronous here.")] = "sync"
    do_sample: Annotated[bool, noop("Training rollouts always sample.")] = True
    ignore_eos: Annotated[bool, noop("Ignore EOS while generating.")] = False
    free_cache_engine: Annotated[bool, noop("Free the KV cache between phases.")] = True
    load_format: Annotated[str, noop("vLLM weight load format.")] = "dummy_dtensor"
    layered_summon: Annotated[bool, noop("Layered FSDP summon.")] = False
    disable_log_stats: Annotated[bool, noop("vLLM stats logging.")] = True
    calculate_log_probs: Annotated[bool, noop("Behaviour log-probs are always returned here.")] = False
    engine_kwargs: Annotated[
        dict[str, Any],
        doc(
            "Extra engine arguments by engine (verl's): engine_kwargs.vllm.<name> is passed to each actor's vLLM"
            " engine (an AsyncEngineArgs field not set by another key, e.g. block_size; CPU engines default to"
            " block_size 32 so that a group's samples share their prompt's cache); other engines' entries do nothing."
        ),
    ] = msgspec.field(default_factory=dict)
    multi_turn: Annotated[MultiTurnConfig, doc("Multi-turn episodes with an environment.")] = msgspec.field(
        default_factory=MultiTurnConfig
    )
    agent: Annotated[dict[str, Any], noop("Agent loop.")] = msgspec.field(default_factory=dict)


class RefConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The frozen reference policy (used for the KL loss or KL-in-reward)."""

    strategy: Annotated[Strategy, doc("Data-parallel strategy ('fsdp' and 'fsdp2' both mean FSDP2).")] = "fsdp"
    fsdp_config: Annotated[FsdpConfig, doc("Reference-model FSDP options.")] = msgspec.field(default_factory=FsdpConfig)
    log_prob_micro_batch_size: Annotated[
        PosInt | None,
        noop(
            "Deprecated GLOBAL reference micro-batch; the reference runs with"
            " rollout.log_prob_micro_batch_size_per_gpu."
        ),
    ] = None
    log_prob_micro_batch_size_per_gpu: Annotated[
        PosInt | None,
        doc(
            "Sequences per rank per reference forward. The reference runs with"
            " rollout.log_prob_micro_batch_size_per_gpu: null = that value; a different one is ignored with a"
            " start-up warning."
        ),
    ] = None
    log_prob_use_dynamic_bsz: Annotated[
        bool | None,
        noop(
            "Token-budget micro-batches for the reference are not supported (true is rejected): it uses the"
            " rollout's log_prob_micro_batch_size_per_gpu."
        ),
    ] = None
    log_prob_max_token_len_per_gpu: Annotated[
        PosInt | None, noop("Token budget of a dynamic reference micro-batch (dynamic batching is not supported).")
    ] = None
    use_torch_compile: Annotated[bool, noop("torch.compile.")] = True
    ulysses_sequence_parallel_size: Annotated[int, noop("Ulysses sequence parallelism (not supported).")] = 1


class ActorRolloutRefConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Policy model plus its actor (training), rollout (generation) and ref (reference) roles."""

    model: Annotated[ModelConfig, doc("Policy model.")] = msgspec.field(default_factory=ModelConfig)
    actor: Annotated[ActorConfig, doc("Policy training.")] = msgspec.field(default_factory=ActorConfig)
    rollout: Annotated[RolloutConfig, doc("Generation on the actors.")] = msgspec.field(default_factory=RolloutConfig)
    ref: Annotated[RefConfig, doc("Reference policy.")] = msgspec.field(default_factory=RefConfig)
    hybrid_engine: Annotated[bool, noop("Colocated actor/rollout engine; actors are always separate here.")] = True


__all__ = [
    "ActorConfig",
    "ActorRolloutRefConfig",
    "ModelConfig",
    "PolicyLossConfig",
    "RefConfig",
    "RolloutConfig",
    "ValKwargs",
]
