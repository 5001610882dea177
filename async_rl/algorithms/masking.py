"""Masked reductions over padded ``[B, T]`` token tensors.

Responses in a batch have different lengths, so every statistic the RL algorithms need (means for metrics and losses,
variances and whitening for advantages) must ignore padding. These helpers follow verl's ``verl.utils.torch_functional``
conventions (Bessel-corrected variance, ``rsqrt(var + 1e-8)`` whitening) so that numbers ported from a verl
configuration reproduce. Means divide by the exact mask count (an empty mask gives 0); verl adds ``1e-8`` to the count
instead, which is bit-identical in float32 for any count >= 1 and avoids a spurious 1e-8 relative error in float64.
Padding positions are selected out with ``torch.where`` before summing, so a NaN/inf stored in padding cannot poison a
statistic.
"""

from __future__ import annotations

import torch

from async_rl.algorithms._checks import float_mask

__all__ = ["masked_extreme", "masked_mean", "masked_sum", "masked_var", "masked_whiten", "safe_count"]

_WHITEN_EPS = 1e-8


def safe_count(count: torch.Tensor) -> torch.Tensor:
    """``count`` with zeros replaced by 1, so ``sum / safe_count(count)`` is 0 for an empty mask instead of NaN."""
    return torch.where(count > 0, count, torch.ones_like(count))


def _check_mask_shape(x: torch.Tensor, mask: torch.Tensor) -> None:
    if not isinstance(mask, torch.Tensor) or mask.shape != x.shape:
        shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"mask must have the shape of x {tuple(x.shape)}, got {shape}")


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``x * mask`` over ``dim`` (all elements if ``None``); entries with mask 0 are ignored even if non-finite.

    Shapes: ``x`` and ``mask`` identical (typically ``[B, T]``); result has ``dim`` reduced away.
    """
    _check_mask_shape(x, mask)
    m = float_mask(mask, x)
    valid = torch.where(m != 0, x, torch.zeros((), dtype=x.dtype, device=x.device))
    if dim is None:
        return (valid * m).sum()
    return (valid * m).sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over the positions where ``mask`` is non-zero: ``sum(x*mask) / sum(mask)``.

    Shapes: ``x`` and ``mask`` identical; ``dim=None`` gives a 0-d tensor, ``dim=-1`` on ``[B, T]`` gives ``[B]``.
    An all-zero mask (or row, with ``dim``) yields 0, not NaN.
    """
    _check_mask_shape(x, mask)
    m = float_mask(mask, x)
    total = masked_sum(x, m, dim)
    count = m.sum() if dim is None else m.sum(dim=dim)
    return total / safe_count(count)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``x`` over all masked-in positions (a 0-d tensor).

    ``unbiased=True`` applies Bessel's correction ``n / (n - 1)`` with ``n = sum(mask)``; it raises ``ValueError``
    (naming ``mask``) when fewer than two positions are valid because the sample variance is then undefined. Note that
    the check reads ``sum(mask)`` on the host (one device synchronisation), as verl does.
    """
    m = float_mask(mask, x)
    mean = masked_mean(x, m)
    variance = masked_mean((x - mean) ** 2, m)
    if unbiased:
        count = float(m.sum().item())
        if count == 0:
            raise ValueError("mask has no valid position; the unbiased variance needs at least two")
        if count == 1:
            raise ValueError("mask has a single valid position; the unbiased variance needs at least two")
        variance = variance * (count / (count - 1))
    return variance


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Whiten ``x`` with the masked mean and unbiased masked variance: ``(x - mean) * rsqrt(var + 1e-8)``.

    With ``shift_mean=False`` the mean is added back (only the scale is normalised). Statistics are taken over every
    valid position of the whole tensor (batch-level whitening, as in verl); the output keeps the shape of ``x`` and
    padding positions are transformed too (callers multiply by the mask when they need zeros there).
    """
    m = float_mask(mask, x)
    mean = masked_mean(x, m)
    var = masked_var(x, m, unbiased=True)
    whitened = (x - mean) * torch.rsqrt(var + _WHITEN_EPS)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def masked_extreme(x: torch.Tensor, valid: torch.Tensor, *, largest: bool) -> torch.Tensor:
    """The largest (or smallest) entry of ``x`` where the bool tensor ``valid`` is set, as a 0-d tensor; 1 when no
    entry is valid (the neutral value of an importance weight)."""
    fill = torch.full((), float("-inf") if largest else float("inf"), dtype=x.dtype, device=x.device)
    filled = torch.where(valid, x, fill)
    extreme = filled.amax() if largest else filled.amin()
    return torch.where(valid.any(), extreme, torch.ones_like(extreme))
