"""Shared by the loss tests: vanilla PPO's policy loss with verl's default clipping and token-mean aggregation."""

from __future__ import annotations

from functools import partial

from async_rl.algorithms import policy_loss

ppo_loss = partial(
    policy_loss,
    clip_ratio=0.2,
    clip_ratio_low=None,
    clip_ratio_high=None,
    clip_ratio_c=3.0,
    loss_agg_mode="token-mean",
    loss_mode="vanilla",
    loss_scale_factor=None,
)
