"""LoRA adapters for the learner: low-rank updates on frozen linear layers, in PEFT's layout and naming.

A targeted ``nn.Linear`` (weight ``W`` [out, in], bias ``b``) becomes a :class:`LoRALinear` computing

    y = x W^T + b + (alpha / r) * (x A^T) B^T,      A [r, in] (Kaiming-uniform), B [out, r] (zeros)

so a fresh adapter leaves the model exactly as it was. ``W`` and ``b`` keep their names (``...q_proj.weight``), so the
base model's state dict, export and checkpoints are unchanged; the adapter adds ``...q_proj.lora_A`` and
``...q_proj.lora_B``. Only the adapter is trainable: every other parameter is frozen (and therefore not in the
optimizer). The adapter can be switched off for a forward pass (:func:`adapters_disabled`), which makes the frozen base
model the reference policy without a second copy of it.

Targets follow PEFT's rules: ``"all-linear"`` is every ``nn.Linear`` except the output layer (``lm_head``); a list of
names matches a module whose full name equals the entry or ends with ``"." + entry``; ``exclude_modules`` removes
matches the same way. Adapters are initialised from a generator seeded by ``seed`` in module order, so every rank of
an FSDP2 group builds the same adapter before sharding.

Outside this module the adapter travels under PEFT's names (``base_model.model.<module>.lora_A.weight``): the
weight sync sends those, vLLM loads them as a PEFT adapter directory, and :func:`save_adapter` writes one
(``adapter_config.json`` + ``adapter_model.safetensors``) that ``peft.PeftModel.from_pretrained`` loads.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from async_rl.config.actor_rollout_ref import ModelConfig
from async_rl.peft_format import (
    LoRASpec,
    is_adapter_name,
)

__all__ = [
    "LoRALinear",
    "adapters_disabled",
    "apply_lora",
    "lora_modules",
    "lora_spec",
    "merge_adapters",
    "merged_weight",
]


def lora_spec(model: ModelConfig) -> LoRASpec | None:
    """The policy's adapter from ``actor_rollout_ref.model.lora_*``; None (full fine-tuning) when ``lora_rank`` is 0."""
    if model.lora_rank == 0:
        return None
    targets = model.target_modules
    return LoRASpec(
        rank=model.lora_rank,
        alpha=float(model.lora_alpha),
        target_modules=targets if isinstance(targets, str) else tuple(targets),
        exclude_modules=tuple(model.exclude_modules or ()),
    )


class LoRALinear(nn.Module):
    """A frozen ``nn.Linear`` plus a trainable low-rank update (see the module docstring)."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, *, generator: torch.Generator) -> None:
        super().__init__()
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.bias = base.bias
        self.weight.requires_grad_(False)
        if self.bias is not None:
            self.bias.requires_grad_(False)
        self.rank, self.scaling = rank, alpha / rank
        a = torch.empty(rank, self.in_features, dtype=torch.float32)
        bound = 1.0 / math.sqrt(self.in_features)  # kaiming_uniform_(a=sqrt(5)), as nn.Linear and PEFT initialise A
        a.uniform_(-bound, bound, generator=generator)
        self.lora_A = nn.Parameter(a.to(base.weight.device))
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, rank, device=base.weight.device))
        self.adapter_enabled = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        if not self.adapter_enabled:
            return y
        return y + F.linear(F.linear(x, self.lora_A), self.lora_B) * self.scaling

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, rank={self.rank}, scaling={self.scaling:g}"


def _matches(name: str, patterns: Sequence[str]) -> bool:
    return any(name == p or name.endswith("." + p) for p in patterns)


def _output_layer(model: nn.Module) -> nn.Module | None:
    get = getattr(model, "get_output_embeddings", None)
    return get() if callable(get) else None


def apply_lora(model: nn.Module, spec: LoRASpec, *, seed: int) -> list[str]:
    """Replace the targeted linear layers of ``model`` in place and freeze everything but the adapters.

    Returns the adapted module names, in order. Raises ``ValueError`` naming ``target_modules`` when nothing matches.
    """
    output = _output_layer(model)
    chosen: list[str] = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear) or isinstance(module, LoRALinear):
            continue
        if spec.target_modules == "all-linear":
            hit = module is not output
        else:
            hit = _matches(name, spec.target_modules)
        if hit and not _matches(name, spec.exclude_modules):
            chosen.append(name)
    if not chosen:
        raise ValueError(
            f"actor_rollout_ref.model.target_modules={spec.target_modules!r} (exclude_modules="
            f"{list(spec.exclude_modules)}) matches no linear layer of {type(model).__name__}"
        )
    model.requires_grad_(False)
    generator = torch.Generator().manual_seed(seed)
    for name in chosen:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        base = getattr(parent, child)
        setattr(parent, child, LoRALinear(base, spec.rank, spec.alpha, generator=generator))
    return chosen


def lora_modules(model: nn.Module) -> Iterator[tuple[str, LoRALinear]]:
    for name, module in model.named_modules():
        if isinstance(module, LoRALinear):
            yield name, module


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """Within the block ``model`` computes as its frozen base (the adapters add nothing)."""
    modules = [m for _, m in lora_modules(model)]
    previous = [m.adapter_enabled for m in modules]
    for m in modules:
        m.adapter_enabled = False
    try:
        yield
    finally:
        for m, was in zip(modules, previous, strict=True):
            m.adapter_enabled = was


def merge_adapters(state: dict[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
    """A base model's state dict with every adapter folded in (``W + scaling * B @ A``) and the adapter tensors
    dropped: the names and shapes of the model before :func:`apply_lora`."""
    merged: dict[str, torch.Tensor] = {}
    for name, value in state.items():
        if is_adapter_name(name):
            continue
        module = name.removesuffix(".weight")
        a, b = state.get(f"{module}.lora_A"), state.get(f"{module}.lora_B")
        if name.endswith(".weight") and a is not None and b is not None:
            value = merged_weight(value, a, b, scaling)
        merged[name] = value
    return merged


def merged_weight(weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: float) -> torch.Tensor:
    """``W + scaling * B @ A``, computed in fp32, in ``W``'s dtype: one adapted weight folded into its base."""
    return (weight.float() + scaling * (b.float() @ a.float())).to(weight.dtype)
