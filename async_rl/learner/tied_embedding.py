"""A tied input embedding whose gradient is added into the output layer's, row by row, in place.

When the input embedding and the output layer share one weight (SmolLM2, Qwen2.5-0.5B), autograd gives that weight
two gradients: the output layer's, a dense ``[vocab, hidden]`` product made first in the backward, and the input
embedding's, which ``embedding_dense_backward`` also makes dense, although only the rows of the tokens in the batch
are not zero. Autograd then adds the two into a third dense tensor. At the end of the backward, where the
activations just freed are interleaved with the gradients the step keeps, those are two fresh vocabulary-sized
allocations (54 MiB each in bf16 for SmolLM2, 272 MiB for Qwen2.5-0.5B's 151,936 ids): on a CPU learner rank the C
allocator found no hole for them and took new memory step after step.

:func:`use_tied_embedding_rows` switches such an embedding to :class:`TiedEmbeddingFunction`: the forward is the
module's own ``F.embedding``; the backward sums the batch's rows per distinct token id with the same kernel on a
compacted index (the same bits as the dense kernel's rows) and adds them into the weight's ``.grad`` in place,
through a gradient hook on the weight: the output layer's gradient takes the rows on its way into ``.grad`` (the
function returns no gradient for the weight, but its edge to it makes autograd accumulate the weight's gradient
after the embedding's backward). The weight's gradient is then the same bits as before, over several backwards too,
with no dense embedding gradient and no third tensor. A backward in which no output-layer gradient arrives raises
instead of dropping the rows. Made for ``.backward()`` into ``.grad``, what the learner runs; ``torch.autograd.grad``
with respect to the weight is not what it was built or tested for.
"""

from __future__ import annotations

import functools
import types
from typing import Any

import torch
from torch import nn
from torch.autograd.function import once_differentiable

__all__ = ["TiedEmbeddingFunction", "use_tied_embedding_rows"]


class TiedEmbeddingFunction(torch.autograd.Function):
    """``F.embedding(ids, weight, padding_idx)`` whose weight gradient joins the weight's other gradient (the output
    layer's) one row per distinct id, in place. The backward returns no gradient for the weight, but its edge to the
    weight makes autograd accumulate the weight's gradient only after it, through the hook that adds the rows."""

    @staticmethod
    def forward(ctx: Any, ids: torch.Tensor, weight: torch.Tensor, padding_idx: int | None) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(ids)
        ctx.weight = weight  # the parameter itself (FSDP2: the unsharded one this forward used)
        ctx.padding_idx = padding_idx
        return nn.functional.embedding(ids, weight, padding_idx)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[None, None, None]:  # type: ignore[override]
        (ids,) = ctx.saved_tensors
        weight: torch.Tensor = ctx.weight
        ids_used, where = torch.unique(ids.reshape(-1), return_inverse=True)
        pad = -1
        if ctx.padding_idx is not None:  # the dense kernel leaves the padding row's gradient at zero
            hit = (ids_used == ctx.padding_idx).nonzero()
            pad = int(hit[0, 0]) if hit.numel() else -1
        grad_rows = grad_out.reshape(-1, grad_out.shape[-1]).to(weight.dtype)
        rows = torch.ops.aten.embedding_dense_backward(grad_rows, where, ids_used.numel(), pad, False)
        # the rows join the output layer's gradient on its way into .grad (see _add_pending)
        pending: list[tuple[torch.Tensor, torch.Tensor]] | None = getattr(weight, _PENDING, None)
        if pending is None:
            pending = []
            setattr(weight, _PENDING, pending)
            weight.register_hook(functools.partial(_add_pending, pending))
        pending.append((ids_used, rows))
        torch.autograd.Variable._execution_engine.queue_callback(functools.partial(_check_added, pending))
        return None, None, None


_PENDING = "_async_rl_tied_rows"


def _add_pending(pending: list[tuple[torch.Tensor, torch.Tensor]], grad: torch.Tensor | None) -> torch.Tensor | None:
    """The weight's gradient hook: the output layer's gradient, about to be accumulated into ``.grad``, takes the
    embedding's rows first, so ``.grad`` gets their sum exactly as autograd's dense sum would give it. ``None``: no
    other gradient reached the weight (left to :func:`_check_added`)."""
    if grad is None:
        return None
    # in place into the output layer's fresh product (a new [vocab, hidden] tensor is what this module avoids); a
    # broadcast gradient (stride 0) is read-only and gets a new tensor
    in_place = grad.is_contiguous()
    while pending:
        ids_used, rows = pending.pop()
        grad = grad.index_add_(0, ids_used, rows) if in_place else grad.index_add(0, ids_used, rows)
    return grad


def _check_added(pending: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """At the end of the backward: rows still waiting mean that no other gradient reached the weight (the output
    layer had no part in the loss, never so in the learner's), so they were not added: fail rather than drop them."""
    if pending:
        pending.clear()
        raise RuntimeError(
            "tied input embedding: the output layer's gradient never reached the shared weight in this backward,"
            " so the embedding's gradient rows could not be added (learner/tied_embedding.py)"
        )


def _forward(self: nn.Embedding, input_ids: torch.Tensor) -> torch.Tensor:
    weight = self.weight
    if not (torch.is_grad_enabled() and weight.requires_grad):
        return nn.functional.embedding(input_ids, weight, self.padding_idx)
    out: torch.Tensor = TiedEmbeddingFunction.apply(input_ids, weight, self.padding_idx)
    return out


def use_tied_embedding_rows(model: nn.Module) -> bool:
    """Switch ``model``'s input embedding to :class:`TiedEmbeddingFunction` where it is a plain ``nn.Embedding``
    (no max-norm, no frequency scaling, dense gradients) that shares its weight with the output layer. Call before
    sharding (the tie is read from the parameters). Returns whether it was switched."""
    get_in = getattr(model, "get_input_embeddings", None)
    get_out = getattr(model, "get_output_embeddings", None)
    if get_in is None or get_out is None:
        return False
    embedding, output = get_in(), get_out()
    if type(embedding) is not nn.Embedding or output is None or getattr(output, "weight", None) is not embedding.weight:
        return False
    if embedding.max_norm is not None or embedding.scale_grad_by_freq or embedding.sparse:
        return False
    embedding.forward = types.MethodType(_forward, embedding)  # type: ignore[method-assign]
    return True
