"""The fused output layer (``actor_rollout_ref.model.use_fused_kernels``): log-probs straight from hidden states.

A causal LM's last step, ``lm_head``, turns each kept position's hidden state into ``[V]`` logits; the learner then
gathers one row per response token and takes a chunked log-softmax. At SmolLM2's 49,152 ids that is ~84 MB of bf16
logits per 850 rows, a same-sized copy with one row per response token, and the gradients of both: buffers that grow
with the micro-batch's response tokens times the vocabulary (at Qwen's 151,936 ids, 8k response tokens hold 2.5 GB
of bf16 logits).

:func:`use_fused_output_layer` switches the model's ``lm_head`` so that, while :func:`fused_log_probs` holds a
request for it, its forward takes the hidden states of the response tokens' predicting positions and returns their
log-probs (and entropy) through :func:`~async_rl.algorithms.linear_token_log_probs_and_entropy`: logits exist a
chunk of rows at a time, forward and backward (where each chunk's logits are made again: one more product of the
output layer's size). Without a request the layer computes its logits as before (reference logits, distillation).

The call stays inside the model's forward, so FSDP2 handles the output layer's (tied) weight as it always does. A
model is switched only where a probe shows that its forward returns ``lm_head``'s output untouched (no soft-capping
or scaling after it) and ``lm_head`` is a bias-free ``nn.Linear``.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from async_rl.algorithms import linear_token_log_probs_and_entropy

__all__ = ["FusedRequest", "fused_log_probs", "fused_output_layer", "use_fused_output_layer"]

_REQUEST = "_async_rl_fused_request"


@dataclass
class FusedRequest:
    """What the switched ``lm_head`` computes on its next call (it returns the result as the model's logits)."""

    index: torch.Tensor | None  # rows of the flattened [.., K, H] hidden states, one per label; None: all, in order
    labels: torch.Tensor  # [n] (or the hidden states' leading shape when index is None)
    temperature: float
    entropy: str


def _fused_forward(self: Any, hidden: torch.Tensor) -> torch.Tensor:
    request: FusedRequest | None = getattr(self, _REQUEST, None)
    if request is None:
        return torch.nn.functional.linear(hidden, self.weight)
    rows = hidden if request.index is None else hidden.reshape(-1, hidden.shape[-1])[request.index]
    log_probs, entropy = linear_token_log_probs_and_entropy(
        rows, self.weight, request.labels, temperature=request.temperature, entropy=request.entropy
    )
    # returned as the model's output, so that FSDP2's pre-backward hook on it gathers the (root) weight again
    return torch.stack([log_probs, torch.zeros_like(log_probs) if entropy is None else entropy], dim=-1)


def fused_output_layer(model: nn.Module) -> nn.Module | None:
    """The model's switched output layer, or None when :func:`use_fused_output_layer` did not switch it."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    return head if isinstance(head, nn.Module) and hasattr(head, _REQUEST) else None


@contextmanager
def fused_log_probs(head: nn.Module, request: FusedRequest) -> Iterator[FusedRequest]:
    """Within the block, the model's forward returns ``[*labels.shape, 2]`` as its logits: each label's log-prob
    and (0 unless ``request.entropy`` asks for it) its row's entropy, fp32."""
    setattr(head, _REQUEST, request)
    try:
        yield request
    finally:
        setattr(head, _REQUEST, None)


def _returns_head_output(model: nn.Module, head: nn.Linear) -> bool:
    """Whether ``model``'s forward hands back ``head``'s output as its logits, untouched (a probe on 3 tokens)."""
    seen: list[torch.Tensor] = []
    hook = head.register_forward_hook(lambda _m, _i, out: seen.append(out))
    ids = torch.tensor([[1, 2, 3]], device=head.weight.device)
    try:
        with torch.no_grad():
            out = model(input_ids=ids, use_cache=False)
    except Exception:  # a model that cannot run this probe keeps its own output layer
        return False
    finally:
        hook.remove()
    logits = getattr(out, "logits", None)
    return len(seen) == 1 and isinstance(logits, torch.Tensor) and torch.equal(logits, seen[0])


def use_fused_output_layer(model: nn.Module) -> bool:
    """Switch ``model``'s output layer to the fused log-prob path (before sharding); False where it does not apply:
    no ``get_output_embeddings``, an output layer that is not a bias-free ``nn.Linear`` (an adapter, a bias), or a
    forward that changes its output."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if type(head) is not nn.Linear or head.bias is not None or not _returns_head_output(model, head):
        return False
    head.forward = types.MethodType(_fused_forward, head)  # type: ignore[method-assign]
    setattr(head, _REQUEST, None)
    return True
