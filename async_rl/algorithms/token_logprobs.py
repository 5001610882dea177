"""Per-token log-probs and entropy over a large vocabulary, computed in row chunks, forward and backward.

The learner needs ``log softmax(z / T)[label]`` (and often the entropy of ``softmax(z / T)``) for every response
token. Done in one go on ``[N, V]`` logits that is an fp32 copy of the whole matrix plus the temporaries autograd
keeps for the backward pass: for Qwen's 151,936-token vocabulary and 16k response tokens each such copy is ~10 GB.

:func:`token_log_probs_and_entropy` processes ``chunk_size`` rows at a time. Its forward pass keeps only per-row
numbers (max, log-sum-exp, entropy) besides the input logits, which the model holds anyway; its backward pass
recomputes each chunk's softmax from the logits and writes that chunk's gradient straight into one gradient tensor
of the logits' dtype. Peak extra memory is therefore a few ``[chunk_size, V]`` fp32 buffers in both passes, instead
of several ``[N, V]`` ones. With ``x = z / T``, ``p = softmax(x)`` and ``H = -sum_j p_j log p_j`` per row:

* ``d log p_label / d x_j = 1[j = label] - p_j``
* ``d H / d x_j = -p_j (log p_j + H)``

and ``d / d z = (d / d x) / T``. :func:`token_log_probs_and_entropy_reference` is the direct computation (the fp32
cast, ``gather - logsumexp`` and :func:`~async_rl.algorithms.entropy_from_logits`) that tests and
``tools/bench_logprobs.py`` compare against.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from async_rl.algorithms._checks import check_choice
from async_rl.algorithms.losses import entropy_from_logits

__all__ = [
    "ENTROPY_MODES",
    "LOGPROB_CHUNK_BYTES",
    "default_chunk_rows",
    "linear_token_log_probs_and_entropy",
    "masked_logit_mean",
    "token_log_probs_and_entropy",
    "token_log_probs_and_entropy_reference",
]

ENTROPY_MODES: tuple[str, ...] = ("none", "detached", "grad")
"""``none``: no entropy (``None``); ``detached``: a metric, computed without grad; ``grad``: differentiable."""

LOGPROB_CHUNK_BYTES = 32 << 20
"""The default chunk's size: as many rows as fit one fp32 ``[rows, V]`` buffer of 32 MiB (170 rows at SmolLM2's
49,152-token vocabulary, 55 at Qwen's 151,936). A fixed 1,024 rows was 176 MiB per buffer at 49,152; on the SmolLM2
recipe's micro-batch (896 response rows, bf16, one learner rank without activation checkpointing) 128-row chunks held
350 MiB less resident memory at the same step time."""


def default_chunk_rows(vocab: int) -> int:
    """Rows per chunk when none is given: :data:`LOGPROB_CHUNK_BYTES` of fp32 ``[rows, vocab]``, at least one row."""
    return max(1, LOGPROB_CHUNK_BYTES // (4 * max(1, vocab)))


def _chunk_rows(chunk_size: int | None, vocab: int) -> int:
    if chunk_size is None:
        return default_chunk_rows(vocab)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    return chunk_size


def _check_args(logits: torch.Tensor, labels: torch.Tensor, temperature: float, entropy: str) -> None:
    if not isinstance(logits, torch.Tensor) or logits.ndim < 2 or not logits.is_floating_point():
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"logits must be a floating-point tensor of shape [..., V] (at least 2-D), got {shape}")
    _check_rest(labels, logits.shape[:-1], "logits", tuple(logits.shape), temperature, entropy)


def _check_rest(
    labels: torch.Tensor, rows: torch.Size, name: str, shape: tuple[int, ...], temperature: float, entropy: str
) -> None:
    """The labels (integer, shaped ``rows``: the leading dims of ``name``, whose shape is ``shape``), temperature
    and entropy mode."""
    if not isinstance(labels, torch.Tensor) or labels.is_floating_point() or labels.is_complex():
        raise ValueError(f"labels must be an integer tensor, got {getattr(labels, 'dtype', type(labels).__name__)}")
    if labels.shape != rows:
        raise ValueError(
            f"labels has shape {tuple(labels.shape)} but {name} has shape {shape}; labels must be {name}.shape[:-1]"
        )
    if not temperature > 0 or temperature == float("inf"):
        raise ValueError(f"temperature must be a positive finite number, got {temperature!r}")
    check_choice("entropy", entropy, ENTROPY_MODES)


def _compute_dtype(logits: torch.Tensor) -> torch.dtype:
    """fp32 for fp32 and narrower logits (bf16, fp16), fp64 for fp64 ones (gradcheck)."""
    return torch.promote_types(logits.dtype, torch.float32)


def _scaled(chunk: torch.Tensor, temperature: float) -> torch.Tensor:
    """A fresh compute-dtype copy of a chunk of logits divided by ``temperature``, safe to modify in place."""
    x = chunk.to(_compute_dtype(chunk), copy=True)
    if temperature != 1.0:
        x.div_(temperature)
    return x


ChunkLogits = Callable[[slice], torch.Tensor]
"""Rows ``rows`` of the logits, ``[rows, V]`` in their own dtype: a slice of a matrix, or computed on demand."""


def _forward_chunks(
    chunk_logits: ChunkLogits,
    labels: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    chunk_size: int,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Log-prob of each label ``[N]``, the row statistics ``[N, 2]`` (max, log-sum-exp of the max-shifted row) and,
    if asked, entropy ``[N]``, all in ``dtype``. Keeping the max apart keeps ``x - max`` exact where
    ``x - logsumexp(x)`` would round away digits of large logits (5e4 in fp32 has a spacing of 0.004)."""
    n = labels.shape[0]
    out_kw: dict[str, Any] = {"dtype": dtype, "device": labels.device}
    log_probs = torch.empty(n, **out_kw)
    stats = torch.empty(n, 2, **out_kw)
    ent = torch.empty(n, **out_kw) if with_entropy else None
    for start in range(0, n, chunk_size):
        rows = slice(start, start + chunk_size)
        x = _scaled(chunk_logits(rows), temperature)
        picked = x.gather(1, labels[rows].unsqueeze(1)).squeeze(1)
        row_max = x.amax(dim=1, keepdim=True)
        shifted = x.sub_(row_max)  # in place: x is no longer needed
        exp = shifted.exp()
        sum_exp = exp.sum(dim=1, keepdim=True)
        log_sum_exp = sum_exp.log()
        stats[rows] = torch.cat([row_max, log_sum_exp], dim=1)
        log_probs[rows] = (picked - row_max.squeeze(1)) - log_sum_exp.squeeze(1)
        if ent is not None:
            log_p = shifted.sub_(log_sum_exp)
            # p log p summed per row; p = exp / sum_exp; no cancellation since every term is <= 0
            ent[rows] = -exp.div_(sum_exp).mul_(log_p).sum(dim=1)
        del x, shifted, exp
    return log_probs, stats, ent


def _backward_chunks(
    chunk_logits: ChunkLogits,
    labels: torch.Tensor,
    stats: torch.Tensor,
    ent: torch.Tensor | None,
    grad_log_probs: torch.Tensor | None,
    grad_ent: torch.Tensor | None,
    temperature: float,
    chunk_size: int,
    sink: Callable[[slice, torch.Tensor], None],
) -> None:
    """Hand each chunk's gradient w.r.t. its logits (compute dtype, ``[rows, V]``) to ``sink(rows, grad)``, given
    upstream grads of log-probs and entropy ``[N]``."""
    for start in range(0, labels.shape[0], chunk_size):
        rows = slice(start, start + chunk_size)
        log_p = _scaled(chunk_logits(rows), temperature).sub_(stats[rows, :1]).sub_(stats[rows, 1:])
        p = log_p.exp()
        if grad_ent is not None:
            assert ent is not None
            # d H / d x_j = -p_j (log p_j + H), reusing log_p's buffer
            g = log_p.add_(ent[rows].unsqueeze(1)).mul_(p).mul_(-grad_ent[rows].unsqueeze(1))
            if grad_log_probs is not None:
                g.sub_(p.mul_(grad_log_probs[rows].unsqueeze(1)))
        else:
            assert grad_log_probs is not None
            del log_p
            g = p.mul_(-grad_log_probs[rows].unsqueeze(1))
        if grad_log_probs is not None:  # d log p_label / d x_j = 1[j = label] - p_j: the indicator part
            g.scatter_add_(1, labels[rows].unsqueeze(1), grad_log_probs[rows].unsqueeze(1))
        if temperature != 1.0:
            g.div_(temperature)
        sink(rows, g)
        del p, g


class _ChunkedTokenLogProbs(torch.autograd.Function):
    """Autograd wrapper: saves the logits and per-row statistics only; backward recomputes softmax per chunk."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, logits: torch.Tensor, labels: torch.Tensor, temperature: float, entropy: str, chunk_size: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = _compute_dtype(logits)
        log_probs, stats, ent = _forward_chunks(
            logits.__getitem__, labels, temperature, entropy != "none", chunk_size, dtype
        )
        if ent is None:
            ent = log_probs.new_empty(0)
        if entropy != "grad":
            ctx.mark_non_differentiable(ent)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(logits, labels, stats, ent)
        ctx.temperature, ctx.entropy, ctx.chunk_size = temperature, entropy, chunk_size
        return log_probs, ent

    @staticmethod
    @once_differentiable
    def backward(  # type: ignore[override]
        ctx: Any, grad_log_probs: torch.Tensor | None, grad_ent: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, None, None, None, None]:
        logits, labels, stats, ent = ctx.saved_tensors
        if ctx.entropy != "grad":
            grad_ent = None
        if not ctx.needs_input_grad[0] or (grad_log_probs is None and grad_ent is None):
            return None, None, None, None, None
        grad = torch.empty_like(logits)

        def sink(rows: slice, g: torch.Tensor) -> None:
            grad[rows] = g

        _backward_chunks(
            logits.__getitem__, labels, stats, ent, grad_log_probs, grad_ent, ctx.temperature, ctx.chunk_size, sink
        )
        return grad, None, None, None, None


def token_log_probs_and_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: float,
    entropy: str = "none",
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log softmax(logits / temperature)`` at ``labels``, and the entropy of each row, ``chunk_size`` rows at a time.

    ``logits [..., V]`` of any float dtype (e.g. bf16 straight from the model), ``labels [...]`` integer ids. Returns
    ``(log_probs [...], entropy [...] or None)`` in fp32 (fp64 for fp64 logits). ``entropy`` is one of
    :data:`ENTROPY_MODES`. Differentiable w.r.t. ``logits`` when grad is enabled; the gradient has the logits' dtype.
    Extra memory, forward and backward, is a few fp32 ``[chunk_size, V]`` buffers plus ``O(N)`` per-row numbers
    (``chunk_size`` None: :func:`default_chunk_rows`).
    Logits must be finite. Matches :func:`token_log_probs_and_entropy_reference` up to fp32 rounding, and is the
    closer of the two to fp64 at large vocabularies (no ``logsumexp - sum(p z)`` cancellation in the entropy).
    """
    _check_args(logits, labels, temperature, entropy)
    chunk_size = _chunk_rows(chunk_size, logits.shape[-1])
    flat_logits = logits.reshape(-1, logits.shape[-1])
    flat_labels = labels.reshape(-1).long()
    if torch.is_grad_enabled() and logits.requires_grad:
        log_probs, ent_out = _ChunkedTokenLogProbs.apply(flat_logits, flat_labels, temperature, entropy, chunk_size)
        ent: torch.Tensor | None = None if entropy == "none" else ent_out
    else:
        dtype = _compute_dtype(flat_logits)
        detached = flat_logits.detach()
        log_probs, _, ent = _forward_chunks(
            detached.__getitem__, flat_labels, temperature, entropy != "none", chunk_size, dtype
        )
    return log_probs.reshape(labels.shape), None if ent is None else ent.reshape(labels.shape)


def _linear_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype the output layer's product runs in: autocast's where it is on (as ``F.linear`` would), else the
    common dtype of the hidden states and the weight."""
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return torch.promote_types(hidden.dtype, weight.dtype)


def _linear_forward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """:func:`_forward_chunks` of the logits ``hidden @ weight.T``, each chunk's made in the product's dtype
    (:func:`_linear_dtype`) when it is read."""
    op_dtype = _linear_dtype(hidden, weight)
    with torch.autocast(hidden.device.type, enabled=False):
        h, w = hidden.to(op_dtype), weight.to(op_dtype)
        return _forward_chunks(
            lambda rows: torch.nn.functional.linear(h[rows], w),
            labels,
            temperature,
            with_entropy,
            chunk_size,
            _compute_dtype(h),
        )


class _ChunkedLinearTokenLogProbs(torch.autograd.Function):
    """The output layer and the log-softmax together: ``hidden @ weight.T`` is made a chunk of rows at a time and
    never kept; backward remakes each chunk's logits and turns its gradient into the hidden states' and the
    weight's at once. Saves the hidden states, the weight (both held anyway) and per-row statistics."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        labels: torch.Tensor,
        temperature: float,
        entropy: str,
        chunk_size: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        op_dtype = _linear_dtype(hidden, weight)
        log_probs, stats, ent = _linear_forward(hidden, weight, labels, temperature, entropy != "none", chunk_size)
        if ent is None:
            ent = log_probs.new_empty(0)
        if entropy != "grad":
            ctx.mark_non_differentiable(ent)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(hidden, weight, labels, stats, ent)
        ctx.op_dtype, ctx.temperature, ctx.entropy, ctx.chunk_size = op_dtype, temperature, entropy, chunk_size
        return log_probs, ent

    @staticmethod
    @once_differentiable
    def backward(  # type: ignore[override]
        ctx: Any, grad_log_probs: torch.Tensor | None, grad_ent: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None, None, None]:
        hidden, weight, labels, stats, ent = ctx.saved_tensors
        if ctx.entropy != "grad":
            grad_ent = None
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if not (want_h or want_w) or (grad_log_probs is None and grad_ent is None):
            return None, None, None, None, None, None
        h, w = hidden.to(ctx.op_dtype), weight.to(ctx.op_dtype)
        grad_h = torch.empty_like(h) if want_h else None
        grad_w = torch.zeros_like(w) if want_w else None  # summed over chunks in the product's dtype

        def sink(rows: slice, g: torch.Tensor) -> None:
            g = g.to(ctx.op_dtype)
            if grad_h is not None:
                torch.mm(g, w, out=grad_h[rows])
            if grad_w is not None:
                grad_w.addmm_(g.t(), h[rows])

        _backward_chunks(
            lambda rows: torch.nn.functional.linear(h[rows], w),
            labels,
            stats,
            ent,
            grad_log_probs,
            grad_ent,
            ctx.temperature,
            ctx.chunk_size,
            sink,
        )
        return (
            None if grad_h is None else grad_h.to(hidden.dtype),
            None if grad_w is None else grad_w.to(weight.dtype),
            None,
            None,
            None,
            None,
        )


def linear_token_log_probs_and_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: float,
    entropy: str = "none",
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`token_log_probs_and_entropy` of the logits ``hidden @ weight.T`` (a bias-free output layer), without
    ever holding them: ``chunk_size`` rows of logits exist at a time, forward and backward (None:
    :func:`default_chunk_rows`).

    ``hidden [..., H]`` (the final hidden states at the positions that predict ``labels [...]``), ``weight [V, H]``.
    The product runs in the operands' common dtype (autocast's where it is on), chunk by chunk as ``F.linear``;
    the log-softmax in fp32. Differentiable w.r.t. both: backward recomputes each chunk's logits (one more product
    of the output layer's size) and sums the weight's gradient over chunks in the product's dtype. Returns
    ``(log_probs [...], entropy [...] or None)`` in fp32 (fp64 for fp64 operands).
    """
    if not isinstance(weight, torch.Tensor) or weight.ndim != 2 or not weight.is_floating_point():
        shape = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise ValueError(f"weight must be a floating-point tensor of shape [V, H], got {shape}")
    ok = isinstance(hidden, torch.Tensor) and hidden.ndim >= 2 and hidden.is_floating_point()
    if not ok or hidden.shape[-1] != weight.shape[1]:
        shape = tuple(hidden.shape) if isinstance(hidden, torch.Tensor) else type(hidden).__name__
        raise ValueError(f"hidden must be a floating-point [..., {weight.shape[1]}] (weight is [V, H]), got {shape}")
    _check_rest(labels, hidden.shape[:-1], "hidden", tuple(hidden.shape), temperature, entropy)
    chunk_size = _chunk_rows(chunk_size, weight.shape[0])
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    flat_labels = labels.reshape(-1).long()
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        log_probs, ent_out = _ChunkedLinearTokenLogProbs.apply(
            flat_hidden, weight, flat_labels, temperature, entropy, chunk_size
        )
        ent: torch.Tensor | None = None if entropy == "none" else ent_out
    else:
        with torch.no_grad():
            log_probs, _, ent = _linear_forward(
                flat_hidden, weight, flat_labels, temperature, entropy != "none", chunk_size
            )
    return log_probs.reshape(labels.shape), None if ent is None else ent.reshape(labels.shape)


def _masked_mean_chunks(logits: torch.Tensor, weights: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """``logits [N, V] @ weights [V]`` in the weights' dtype, ``chunk_size`` rows at a time."""
    out = torch.empty(logits.shape[0], dtype=weights.dtype, device=logits.device)
    for start in range(0, logits.shape[0], chunk_size):
        rows = slice(start, start + chunk_size)
        out[rows] = logits[rows].to(weights.dtype) @ weights
    return out


class _MaskedLogitMean(torch.autograd.Function):
    """Row means of the logits over a fixed set of ids, a chunk of rows at a time; saves only the weights."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, weights: torch.Tensor, chunk_size: int) -> torch.Tensor:  # type: ignore[override]
        out = _masked_mean_chunks(logits, weights, chunk_size)
        ctx.save_for_backward(weights)
        ctx.logits_shape, ctx.logits_dtype, ctx.chunk_size = logits.shape, logits.dtype, chunk_size
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        (weights,) = ctx.saved_tensors
        grad = torch.empty(ctx.logits_shape, dtype=ctx.logits_dtype, device=grad_out.device)
        for start in range(0, grad.shape[0], ctx.chunk_size):
            rows = slice(start, start + ctx.chunk_size)
            grad[rows] = grad_out[rows].unsqueeze(1) * weights.unsqueeze(0)
        return grad, None, None


def masked_logit_mean(logits: torch.Tensor, mask: torch.Tensor, *, chunk_size: int | None = None) -> torch.Tensor:
    """Each row's mean logit over the ids where ``mask [V]`` (bool) is true: ``[...]`` in fp32 (fp64 for fp64 logits).

    Differentiable w.r.t. ``logits [..., V]``; both passes work ``chunk_size`` rows at a time (None:
    :func:`default_chunk_rows`), so no fp32 copy of the whole matrix is made. With the label's log-prob it gives the
    cross-entropy against a uniform target over the ids:
    ``-mean_c log p_c = logsumexp(z) - mean_c z_c`` (:func:`~async_rl.algorithms.label_smoothed_nll`).
    """
    chunk_size = _chunk_rows(chunk_size, logits.shape[-1])
    if mask.dtype != torch.bool or mask.shape != logits.shape[-1:]:
        raise ValueError(
            f"mask must be a bool tensor of shape [{logits.shape[-1]}], got {mask.dtype} {tuple(mask.shape)}"
        )
    count = int(mask.sum())
    if count == 0:
        raise ValueError("mask must select at least one id")
    weights = mask.to(device=logits.device, dtype=_compute_dtype(logits)) / count
    flat = logits.reshape(-1, logits.shape[-1])
    if torch.is_grad_enabled() and logits.requires_grad:
        out = _MaskedLogitMean.apply(flat, weights, chunk_size)
    else:
        out = _masked_mean_chunks(flat.detach(), weights, chunk_size)
    return out.reshape(logits.shape[:-1])


def token_log_probs_and_entropy_reference(
    logits: torch.Tensor, labels: torch.Tensor, *, temperature: float, entropy: str = "none"
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The direct computation over the whole ``[..., V]`` matrix at once (same arguments and results as above).

    Casts all logits to fp32 (fp64 stays fp64), divides by ``temperature``, takes ``gather - logsumexp`` and
    :func:`~async_rl.algorithms.entropy_from_logits`; autograd keeps its ``[..., V]`` temporaries for the backward.
    """
    _check_args(logits, labels, temperature, entropy)
    z = logits.to(_compute_dtype(logits))
    if temperature != 1.0:
        z = z / temperature
    log_probs = z.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, dim=-1)
    ent: torch.Tensor | None = None
    if entropy == "grad":
        ent = entropy_from_logits(z)
    elif entropy == "detached":
        with torch.no_grad():
            ent = entropy_from_logits(z.detach())
    return log_probs, ent
