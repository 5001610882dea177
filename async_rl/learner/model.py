"""Build Hugging Face models for the learner and shard them with FSDP2 (``fully_shard``).

One builder for every model role, chosen by its head (:data:`ModelHead`): the trained policy and the frozen reference
policy (``causal_lm``), the critic (``token_value``: the causal-LM backbone + a one-output linear head read at every
token, ``AutoModelForTokenClassification``, only for GAE) and a reward model (``sequence_score``: the same backbone +
a one-output head read at each sequence's last non-pad token, ``AutoModelForSequenceClassification``). Each rank builds
the full model on CPU (``from_pretrained`` memory-maps safetensors; tests pass a factory that builds a tiny model from
a fixed seed), then every decoder layer (the classes in the model's ``_no_split_modules``) and finally the root
become FSDP2 units over the 1-D mesh, which moves the shards to the rank's device. Tied input/output embeddings stay
in the root unit, so the tie survives sharding. On gloo a trained model's units reduce their gradients through
:class:`~async_rl.learner.grad_reduce.InPlaceReduceScatter` (gloo's arithmetic without its full-size copies).

Precision: ``compute_dtype`` is the learner's resolved ``param_dtype`` (bf16 or fp32 on any device, see
:func:`~async_rl.learner.precision.resolve_compute_dtype`). With bf16 a sharded model all-gathers its parameters in
bf16 for compute while the sharded master copy, the gradients, their reduction and the optimizer state stay fp32
(``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``). A single process (no process group, so no FSDP2)
gets the same split another way: the model keeps fp32 parameters and runs its forward under ``torch.autocast(bf16)``
(matmuls and attention in bf16, the rest in fp32: close to, not bit-identical with, the sharded path); the frozen
reference does the same, so it computes exactly as the actor would at the same weights. Dropout is switched off
(log-probs must be deterministic functions of the weights) and HF gradient checkpointing (non-reentrant) is the
activation-checkpointing option; it keeps parameter names unchanged, which export and weight sync rely on.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from async_rl.learner.dist import DistContext, log_rank0
from async_rl.learner.grad_reduce import use_in_place_reduce_scatter
from async_rl.learner.lean_layers import use_lean_layers
from async_rl.learner.lora import apply_lora
from async_rl.learner.output_layer import use_fused_output_layer
from async_rl.learner.shared_prompt import use_shared_prompt_attention
from async_rl.learner.tied_embedding import use_tied_embedding_rows
from async_rl.peft_format import LoRASpec

__all__ = [
    "COMPUTE_DTYPES",
    "ModelHead",
    "ModelSource",
    "build_model",
    "checkpoint_every",
    "disable_dropout",
    "load_causal_lm",
    "load_head_model",
]

logger = logging.getLogger(__name__)

ModelSource = str | Path | Callable[[], nn.Module]
"""A Hugging Face model directory, or a zero-argument factory returning a freshly built model."""

ModelHead = Literal["causal_lm", "token_value", "sequence_score"]
"""What a model outputs: next-token logits (policy, reference), one value per token (critic), one score per sequence
(reward model). The last two put a fresh one-output linear head on a causal-LM checkpoint's trunk."""

COMPUTE_DTYPES = (torch.float32, torch.bfloat16)
"""The dtypes a learner model can compute in (master weights are fp32 either way)."""


def load_causal_lm(path: str | Path) -> nn.Module:
    """``AutoModelForCausalLM.from_pretrained(path)`` in fp32 with sdpa attention."""
    return load_head_model(path, "causal_lm", pad_token_id=None)


def load_head_model(path: str | Path, head: ModelHead, *, pad_token_id: int | None) -> nn.Module:
    """A model with ``head`` from a checkpoint directory, fp32, sdpa attention. The scalar heads (``num_labels=1``) are
    freshly initialised from the global RNG (seed it the same on every rank); ``sequence_score`` needs the
    ``pad_token_id`` it finds each sequence's last token by (it is written into the model's config)."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoModelForTokenClassification

    kwargs: dict[str, Any] = {"dtype": torch.float32, "attn_implementation": "sdpa"}
    if head == "causal_lm":
        return AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
    if head == "token_value":
        return AutoModelForTokenClassification.from_pretrained(str(path), num_labels=1, **kwargs)
    if head == "sequence_score":
        if pad_token_id is None:
            raise ValueError("a sequence_score model needs the tokenizer's pad_token_id")
        return AutoModelForSequenceClassification.from_pretrained(
            str(path), num_labels=1, pad_token_id=pad_token_id, **kwargs
        )
    raise ValueError(f"unknown model head {head!r}; expected one of causal_lm, token_value, sequence_score")


def disable_dropout(model: nn.Module) -> None:
    """Set every dropout probability to 0 (RL log-probs must not depend on a dropout mask)."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    config = getattr(model, "config", None)
    if config is not None:
        for key in ("attention_dropout", "hidden_dropout", "classifier_dropout"):
            if getattr(config, key, None):
                setattr(config, key, 0.0)


def checkpoint_every(model: nn.Module, interval: int) -> tuple[int, int]:
    """Leave HF activation checkpointing (already enabled) on decoder layers 0, ``interval``, 2 x ``interval``, ...
    only (transformers' ``GradientCheckpointingLayer`` reads its ``gradient_checkpointing`` flag at each call).
    Returns (layers checkpointed, decoder layers); raises where the layers have no such flag."""
    layers = _decoder_layers(model)
    if not layers or not all(hasattr(layer, "gradient_checkpointing") for layer in layers):
        raise ValueError(
            "actor_rollout_ref.model.gradient_checkpointing_interval > 1 needs decoder layers with transformers'"
            f" per-layer checkpointing flag; {type(model).__name__} has none"
        )
    for i, layer in enumerate(layers):
        setattr(layer, "gradient_checkpointing", i % interval == 0)  # noqa: B010 (a plain attribute of the layer)
    return sum(bool(layer.gradient_checkpointing) for layer in layers), len(layers)


def _decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The model's decoder layers: modules of the classes its ``_no_split_modules`` names, in model order."""
    classes = {str(n) for n in getattr(model, "_no_split_modules", None) or []}
    return [m for m in model.modules() if type(m).__name__ in classes]


def _autocast_forward(model: nn.Module, device_type: str, dtype: torch.dtype) -> None:
    """Run ``model``'s forward under ``torch.autocast(device_type, dtype)`` (the backward replays the forward's
    dtypes; parameters, gradients and names are untouched)."""
    forward = model.forward

    @functools.wraps(forward)
    def autocast_forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type=device_type, dtype=dtype):
            return forward(*args, **kwargs)

    model.forward = autocast_forward  # type: ignore[method-assign]


def layer_units(layers: Sequence[nn.Module], min_num_params: int) -> list[list[nn.Module]]:
    """``layers`` (in order) cut into runs of at least ``min_num_params`` parameters each, the last run taking what is
    left; ``min_num_params`` 0: one layer per run. Each run becomes one FSDP2 unit."""
    if min_num_params <= 0:
        return [[layer] for layer in layers]
    units: list[list[nn.Module]] = []
    current: list[nn.Module] = []
    count = 0
    for layer in layers:
        current.append(layer)
        count += sum(p.numel() for p in layer.parameters())
        if count >= min_num_params:
            units.append(current)
            current, count = [], 0
    if current:
        units.append(current)
    return units


def build_model(
    source: ModelSource,
    ctx: DistContext,
    *,
    role: str,
    seed: int,
    trainable: bool = True,
    compute_dtype: torch.dtype,
    gradient_checkpointing: int,
    head: ModelHead = "causal_lm",
    pad_token_id: int | None = None,
    lora: LoRASpec | None = None,
    shared_prompt: bool,
    fused_output_layer: bool,
    reshard_after_forward: bool,
    min_num_params: int,
) -> nn.Module:
    """Build ``source`` and shard it over ``ctx.mesh`` (or move it to ``ctx.device`` when not distributed).

    ``role`` is only used in log lines. ``trainable=False`` freezes the parameters (reference model).
    ``compute_dtype`` (fp32 or bf16) is the forward/backward dtype, see the module docstring.
    ``gradient_checkpointing``: 0 (or False) = off; k = HF activation checkpointing on every k-th decoder layer
    (layers 0, k, 2k, ...; 1 or True = all), the others keeping their activations (:func:`checkpoint_every`).
    ``head`` says what a directory is loaded as (:func:`load_head_model`, with ``pad_token_id`` for
    ``sequence_score``); a factory is called as is.
    ``lora`` adds trainable adapters and freezes the rest (:func:`~async_rl.learner.lora.apply_lora`, initialised
    from ``seed``, the same on every rank) before sharding. ``shared_prompt`` switches the model's attention to
    :data:`~async_rl.learner.shared_prompt.SHARED_PROMPT_ATTENTION` (sdpa unless a call passes a shared layout);
    :func:`~async_rl.learner.shared_prompt.shared_prompt_enabled` tells whether that took.
    ``fused_output_layer`` switches the output layer to the fused log-prob path
    (:func:`~async_rl.learner.output_layer.use_fused_output_layer`; warns where it does not apply).
    ``reshard_after_forward``: FSDP2's switch for every unit (the config's ``fsdp_config.reshard_after_forward``).
    ``min_num_params``: the decoder layers form units of at least this many parameters (:func:`layer_units`; the
    config's ``fsdp_config.wrap_policy.min_num_params``; 0: one unit per layer).
    """
    if compute_dtype not in COMPUTE_DTYPES:
        raise ValueError(f"{role}: compute_dtype must be one of {COMPUTE_DTYPES}, got {compute_dtype}")
    bf16 = compute_dtype == torch.bfloat16
    model = source() if callable(source) else load_head_model(source, head, pad_token_id=pad_token_id)
    if not isinstance(model, nn.Module):
        raise ValueError(f"model source for {role!r} did not produce an nn.Module (got {type(model).__name__})")
    model = model.float()
    disable_dropout(model)
    if shared_prompt and not use_shared_prompt_attention(model):
        logger.warning(
            "%s: %s does not dispatch attention through transformers' attention interface: each group's prompt is"
            " computed once per completion (actor_rollout_ref.model.use_shared_prompt has no effect)",
            role,
            type(model).__name__,
        )
    if lora is not None and trainable:
        adapted = apply_lora(model, lora, seed=seed)
        log_rank0(ctx, logger, "%s: LoRA rank %d on %d linear layers", role, lora.rank, len(adapted))
    norms, mlps = use_lean_layers(model)  # after LoRA: an MLP whose projections are adapters keeps calling them
    log_rank0(ctx, logger, "%s: memory-lean forward for %d RMSNorm and %d SwiGLU-MLP modules", role, norms, mlps)
    if trainable and use_tied_embedding_rows(model):
        log_rank0(ctx, logger, "%s: tied input embedding: its gradient rows go into the output layer's in place", role)
    if fused_output_layer and not use_fused_output_layer(model):
        logger.warning(
            "%s: %s's output layer is not a bias-free linear layer whose output the model returns as is: logits are"
            " computed and kept as usual (actor_rollout_ref.model.use_fused_kernels has no effect)",
            role,
            type(model).__name__,
        )
    elif fused_output_layer:
        log_rank0(ctx, logger, "%s: fused output layer (log-probs from hidden states, logits a chunk at a time)", role)
    enable_ckpt = getattr(model, "gradient_checkpointing_enable", None)
    if gradient_checkpointing and trainable:
        if enable_ckpt is None:
            raise ValueError(f"{role}: enable_gradient_checkpointing is set but the model has no HF checkpointing")
        enable_ckpt(gradient_checkpointing_kwargs={"use_reentrant": False})
        if gradient_checkpointing > 1:
            done, total = checkpoint_every(model, int(gradient_checkpointing))
            log_rank0(ctx, logger, "%s: activation checkpointing on %d of %d decoder layers", role, done, total)
    model.train(trainable)
    if not trainable:
        model.requires_grad_(False)
    if ctx.is_distributed:
        assert ctx.mesh is not None
        mp = MixedPrecisionPolicy()
        if bf16:
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        layers = _decoder_layers(model)
        if not layers:
            logger.warning("%s: no decoder-layer classes found (_no_split_modules); sharding the root only", role)
        units = layer_units(layers, min_num_params)
        for unit in units:
            fully_shard(
                unit[0] if len(unit) == 1 else unit,
                mesh=ctx.mesh,
                mp_policy=mp,
                reshard_after_forward=reshard_after_forward,
            )
        fully_shard(model, mesh=ctx.mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
        if trainable and ctx.backend == "gloo" and ctx.world_size > 1:
            use_in_place_reduce_scatter(model, ctx.world_size)  # same bits as gloo's, without its full-size copies
        grouped = f" (decoder layers per unit: {','.join(str(len(u)) for u in units)})" if min_num_params > 0 else ""
        log_rank0(ctx, logger, "%s: %d FSDP2 units over %d ranks%s", role, len(units) + 1, ctx.world_size, grouped)
    else:
        model = model.to(ctx.device)
        if bf16:  # frozen models too: the reference then computes exactly as the actor did at its weights
            _autocast_forward(model, ctx.device.type, torch.bfloat16)
    n_params = sum(p.numel() for p in model.parameters())
    n_trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    log_rank0(
        ctx,
        logger,
        "%s: %.3fM parameters, %.3fM trained (compute %s)",
        role,
        n_params / 1e6,
        n_trained / 1e6,
        str(compute_dtype).removeprefix("torch."),
    )
    return model
