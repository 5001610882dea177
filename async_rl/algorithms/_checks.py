"""Argument validation shared by the algorithm modules.

The algorithm core is a public API fed by user configs and by the learner, so malformed input must fail early with a
``ValueError`` that names the offending argument rather than with an opaque broadcasting error deep inside torch.
These helpers keep that validation in one place so every public function reports problems the same way.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

__all__ = [
    "check_2d",
    "check_choice",
    "check_positive_count",
    "check_same_shape",
    "float_mask",
]


def check_2d(name: str, tensor: torch.Tensor) -> None:
    """Raise ``ValueError`` unless ``tensor`` is a 2-D ``[B, T]`` tensor."""
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape [B, T], got {type(tensor).__name__}")
    if tensor.ndim != 2:
        raise ValueError(f"{name} must have shape [B, T] (2-D), got shape {tuple(tensor.shape)}")


def check_same_shape(name: str, tensor: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    """Raise ``ValueError`` unless ``tensor`` is 2-D and has exactly the shape of ``ref``."""
    check_2d(name, tensor)
    if tensor.shape != ref.shape:
        raise ValueError(
            f"{name} has shape {tuple(tensor.shape)} but {ref_name} has shape {tuple(ref.shape)}; they must match"
        )


def check_choice(name: str, value: str, allowed: Iterable[str]) -> None:
    """Raise ``ValueError`` listing the allowed names unless ``value`` is one of them."""
    allowed_sorted = sorted(allowed)
    if value not in allowed_sorted:
        raise ValueError(f"unknown {name} {value!r}; allowed: {', '.join(allowed_sorted)}")


def check_positive_count(name: str, value: float | torch.Tensor | None) -> None:
    """Raise ``ValueError`` if a python-number count is not strictly positive.

    Tensor counts are not inspected (that would force a device synchronisation); ``None`` means "not given".
    """
    if value is None or isinstance(value, torch.Tensor):
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a positive number or a 0-d tensor, got {value!r}")
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")


def float_mask(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Return ``mask`` (bool or float) as a floating tensor with the dtype and device of ``like``."""
    return mask.to(dtype=like.dtype if like.is_floating_point() else torch.float32, device=like.device)
