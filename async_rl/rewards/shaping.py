"""Length-based reward shaping applied on top of the reward function's score (no torch; runs in the actor).

DAPO's *overlong reward shaping* (verl's ``dapo`` reward manager, keys ``reward.reward_kwargs.overlong_buffer_cfg.*``
and ``reward.reward_kwargs.max_resp_len``): the last ``buffer_len`` tokens before ``max_resp_len`` are a soft-penalty
zone. A response of ``length`` tokens gets

    expected = max_resp_len - buffer_len
    exceed   = length - expected
    penalty  = min(-exceed / buffer_len * penalty_factor, 0)

added to its score: 0 up to ``expected`` tokens, falling linearly to ``-penalty_factor`` at ``max_resp_len`` (and on
past it, for a response longer than ``max_resp_len``). ``length`` counts the response's generated tokens, EOS
included, as verl's ``valid_response_length`` does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from async_rl.rewards.base import RewardResult

OVERLONG_REWARD = "overlong_reward"  # reward component: the penalty added to the score (<= 0)
OVERLONG = "overlong"  # reward component (with log=True): 1.0 when the penalty is < 0, else 0.0
ACC = "acc"  # reward component: the unshaped score, unless the function returned its own "acc" (verl's dapo manager)


def overlong_penalty(length: int, max_resp_len: int, buffer_len: int, factor: float) -> float:
    """The (non-positive) overlong penalty of a ``length``-token response; see the module docstring."""
    if buffer_len <= 0:
        raise ValueError(f"overlong buffer length must be > 0, got {buffer_len}")
    if max_resp_len < buffer_len:
        raise ValueError(f"max_resp_len ({max_resp_len}) must be >= the overlong buffer length ({buffer_len})")
    exceed = length - (max_resp_len - buffer_len)
    penalty = -exceed / buffer_len * factor
    return penalty if penalty < 0 else 0.0  # min(penalty, 0), never -0.0


@dataclass(frozen=True)
class OverlongShaping:
    """The settings of :func:`overlong_penalty` for one run; :meth:`apply` shapes one :class:`RewardResult`."""

    max_resp_len: int
    buffer_len: int
    penalty_factor: float = 1.0
    log: bool = False

    def __post_init__(self) -> None:
        overlong_penalty(0, self.max_resp_len, self.buffer_len, self.penalty_factor)  # same checks, fail at start-up

    def apply(self, result: RewardResult, length: int) -> RewardResult:
        """``result`` with the penalty added to its score and recorded as the ``overlong_reward`` component (plus the
        0/1 ``overlong`` flag when ``log``); ``acc`` keeps the unshaped score (``algorithm.filter_groups.metric=acc``
        then filters on correctness, not on the shaped reward, as in verl's DAPO recipes). A scoring error (score 0)
        is shaped too: the length is still known."""
        penalty = overlong_penalty(length, self.max_resp_len, self.buffer_len, self.penalty_factor)
        components = {ACC: result.score, **result.components, OVERLONG_REWARD: penalty}
        if self.log:
            components[OVERLONG] = 1.0 if penalty < 0 else 0.0
        return replace(result, score=result.score + penalty, components=components)


__all__ = ["ACC", "OVERLONG", "OVERLONG_REWARD", "OverlongShaping", "overlong_penalty"]
