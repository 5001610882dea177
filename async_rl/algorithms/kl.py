"""KL-divergence estimators, KL-coefficient controllers and the in-reward KL penalty.

A policy fine-tuned with RL is kept close to a frozen reference model either by a KL term in the loss or by subtracting
``beta * KL`` from the per-token rewards. Only sampled tokens are available, so the KL is estimated per token from the
two log-probabilities with Schulman's k1/k2/k3 estimators; the ``+`` kinds (straight-through) report one estimator's
value while taking the gradient of k2, which is unbiased for the KL gradient. Names and numerics follow verl's
``kl_penalty`` and ``AdaptiveKLController`` exactly.
"""

from __future__ import annotations

import logging
from typing import Protocol

import numpy as np
import torch

from async_rl.algorithms._checks import check_choice, check_same_shape, float_mask
from async_rl.algorithms.masking import masked_mean

__all__ = [
    "KL_KINDS",
    "AdaptiveKLController",
    "FixedKLController",
    "KLController",
    "apply_kl_in_reward",
    "kl_penalty",
    "policy_shift_sums",
]

logger = logging.getLogger(__name__)

_BASE_KINDS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
KL_KINDS: frozenset[str] = frozenset(_BASE_KINDS + tuple(k + "+" for k in _BASE_KINDS))
"""Accepted ``kind`` names: k1 (``kl``), ``abs``, k2 (``mse``), k3 (``low_var_kl``) and each with a ``+`` suffix."""


def _kl_value(logprob: torch.Tensor, ref_logprob: torch.Tensor, base: str) -> torch.Tensor:
    diff = logprob - ref_logprob
    if base in ("kl", "k1"):
        return diff
    if base == "abs":
        return diff.abs()
    if base in ("mse", "k2"):
        return 0.5 * diff.square()
    assert base in ("low_var_kl", "k3"), base
    # k3 = q/p - log(q/p) - 1 with log(q/p) = ref - logprob; both clamps as in verl keep it finite.
    kl = torch.clamp(ref_logprob - logprob, min=-20.0, max=20.0)
    kld = torch.exp(kl) - kl - 1
    return torch.clamp(kld, min=-10.0, max=10.0)


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL(pi || ref) estimate ``[B, T]`` from the sampled tokens' log-probs (both ``[B, T]``).

    - ``kl``/``k1``: ``logprob - ref`` (unbiased, high variance, can be negative)
    - ``abs``: ``|logprob - ref|``
    - ``mse``/``k2``: ``0.5 * (logprob - ref)^2``
    - ``low_var_kl``/``k3``: with ``d = clamp(ref - logprob, -20, 20)``: ``clamp(exp(d) - d - 1, -10, 10)``
      (unbiased before the clamps, low variance, non-negative)
    - ``<kind>+``: the value of ``<kind>`` with the gradient of k2 (``k2 - k2.detach() + value.detach()``).

    Padding positions are not masked here; callers mask. Raises ``ValueError`` naming ``kind`` if unknown, and for
    mismatched shapes.
    """
    check_choice("kind", kind, KL_KINDS)
    check_same_shape("logprob", logprob, "ref_logprob", ref_logprob)
    base = kind.rstrip("+")
    value = _kl_value(logprob, ref_logprob, base)
    if not kind.endswith("+") or base in ("mse", "k2"):
        return value
    k2 = 0.5 * (logprob - ref_logprob).square()
    return k2 - k2.detach() + value.detach()


def policy_shift_sums(
    before: torch.Tensor, after: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """How far an update moved a policy on sampled tokens: ``(sum of k3 KL(before || after), sum of |after - before|,
    token count)`` over the positions where ``mask`` is non-zero (all ``[B, T]``; log-probs in, fp64 sums out).

    The tokens were sampled from (a policy close to) ``before``, so k3 with ``before`` as the sampling side is the
    low-variance, non-negative estimate of KL(before || after). Sums, not means, so ranks and micro-batches add up.
    """
    check_same_shape("before", before, "after", after)
    check_same_shape("before", before, "mask", mask)
    b, a = before.double(), after.double()
    m = float_mask(mask, b)
    return (kl_penalty(b, a, "k3") * m).sum(), ((a - b).abs() * m).sum(), m.sum()


class KLController(Protocol):
    """What ``apply_kl_in_reward`` needs from a KL-coefficient controller."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None: ...


class FixedKLController:
    """A constant KL coefficient ``value``; ``update`` is a no-op."""

    def __init__(self, kl_coef: float) -> None:
        if not kl_coef >= 0:
            raise ValueError(f"kl_coef must be >= 0, got {kl_coef!r}")
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Ignore the observation (kept for interface compatibility with ``AdaptiveKLController``)."""


class AdaptiveKLController:
    """Proportional controller steering the observed KL towards ``target_kl`` (Ziegler et al., 2019; verl's form).

    ``update``: ``e = clip(current_kl / target_kl - 1, -0.2, 0.2)``; ``value *= 1 + e * n_steps / horizon``.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float) -> None:
        if not init_kl_coef >= 0:
            raise ValueError(f"init_kl_coef must be >= 0, got {init_kl_coef!r}")
        if not target_kl > 0:
            raise ValueError(f"target_kl must be > 0, got {target_kl!r}")
        if not horizon > 0:
            raise ValueError(f"horizon must be > 0, got {horizon!r}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Scale ``value`` by ``1 + clip(current_kl / target - 1, -0.2, 0.2) * n_steps / horizon``."""
        proportional_error = float(np.clip(current_kl / self.target - 1, -0.2, 0.2))
        self.value *= 1 + proportional_error * n_steps / self.horizon


def apply_kl_in_reward(
    token_level_scores: torch.Tensor,
    logprob: torch.Tensor,
    ref_logprob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_ctrl: KLController,
    kind: str,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Subtract the KL penalty from the rewards: ``rewards = scores - beta * kl_penalty(...) * mask`` (all ``[B, T]``).

    ``beta`` is ``kl_ctrl.value`` *before* the update. The observed KL is ``current_kl`` = mean over rows of each row's
    masked mean KL; the controller is then updated with ``kl_ctrl.update(current_kl, n_steps=B)``. Returns the rewards
    and python-float metrics ``{"reward_kl_penalty": current_kl, "reward_kl_penalty_coeff": beta}`` (reading
    ``current_kl`` costs one device synchronisation). Runs without gradient tracking.
    """
    check_same_shape("token_level_scores", token_level_scores, "logprob", logprob)
    check_same_shape("response_mask", response_mask, "logprob", logprob)
    with torch.no_grad():
        mask = float_mask(response_mask, logprob)
        kld = kl_penalty(logprob, ref_logprob, kind) * mask
        beta = float(kl_ctrl.value)
        token_level_rewards = token_level_scores - beta * kld
        current_kl = float(masked_mean(kld, mask, dim=-1).mean().item())
    kl_ctrl.update(current_kl=current_kl, n_steps=token_level_scores.shape[0])
    logger.debug("in-reward KL %.6f with coefficient %.6f", current_kl, beta)
    return token_level_rewards, {"reward_kl_penalty": current_kl, "reward_kl_penalty_coeff": beta}
