"""Reward functions: built-ins, a `module:function` loader, and a sandboxed worker with a per-call time limit.

A reward function is named in config as ``"package.module:function"`` and called as
``fn(prompt=..., completion=..., ground_truth=..., extra=...)``. verl-style functions named through
``custom_reward_function.{path,name}`` keep verl's signature
``fn(data_source, solution_str, ground_truth, extra_info)``.
Either kind returns a float score or a dict with a ``"score"`` key plus optional named numeric components.

Rewards run off the learner's critical path, in the actor, inside :class:`RewardWorker` (a child process spoken to
over msgpack frames, never pickle) so that a function that raises or hangs costs a score of 0 and a counted error,
not the actor.

:class:`OverlongShaping` (DAPO's overlong reward shaping, :mod:`async_rl.rewards.shaping`) adds a length penalty to
the score in the actor, after the worker returns it.
"""

from async_rl.rewards.base import RewardFn, RewardResult, load_reward_fn, normalize_reward
from async_rl.rewards.shaping import OverlongShaping, overlong_penalty
from async_rl.rewards.worker import RewardWorker

__all__ = [
    "OverlongShaping",
    "RewardFn",
    "RewardResult",
    "RewardWorker",
    "load_reward_fn",
    "normalize_reward",
    "overlong_penalty",
]
