"""Reward-function loading and result normalisation (no torch; imported by the actor and the reward worker)."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from async_rl.imports import import_attr

RewardFn = Callable[..., Any]


@dataclass(frozen=True)
class RewardResult:
    """A completion's reward: the scalar ``score`` and optional named components (e.g. ``{"format": 1.0}``)."""

    score: float
    components: dict[str, float] = field(default_factory=dict)
    error: str | None = None


def normalize_reward(value: Any) -> RewardResult:
    """Turn what a reward function returned (number, bool, or dict with ``"score"``) into a :class:`RewardResult`.

    Raises ``ValueError`` for anything else or a non-finite score, so a broken function is counted, never trained on.
    """
    if isinstance(value, bool | int | float):
        score = float(value)
        components: dict[str, float] = {}
    elif isinstance(value, Mapping):
        if "score" not in value:
            raise ValueError(f"reward dict must have a 'score' key, got keys {sorted(value)}")
        score = float(value["score"])
        components = {}
        for key, comp in value.items():
            if key == "score":
                continue
            if not isinstance(comp, bool | int | float):
                raise ValueError(f"reward component {key!r} must be a number, got {type(comp).__name__}")
            components[str(key)] = float(comp)
    else:
        raise ValueError(f"reward function returned {type(value).__name__}; expected a number or a dict with 'score'")
    if not math.isfinite(score):
        raise ValueError(f"reward score is not finite: {score}")
    return RewardResult(score=score, components=components)


def _import_target(spec: str) -> Any:
    target = import_attr(spec, what="reward function", form="module:function")
    if not callable(target):
        raise ValueError(f"reward target {spec!r} is not callable")
    return target


def load_reward_fn(spec: str, *, verl_style: bool = False) -> Callable[[str, str, str, dict[str, Any]], Any]:
    """Load a reward function and adapt it to ``call(prompt, completion, ground_truth, extra)``.

    ``verl_style=True`` adapts verl's ``fn(data_source, solution_str, ground_truth, extra_info)`` signature, with
    ``data_source`` taken from ``extra["data_source"]`` when present.
    """
    fn = _import_target(spec)
    if verl_style:

        def call_verl(prompt: str, completion: str, ground_truth: str, extra: dict[str, Any]) -> Any:
            return fn(extra.get("data_source", ""), completion, ground_truth, extra)

        return call_verl

    params = inspect.signature(fn).parameters
    missing = [p for p in ("completion", "ground_truth") if p not in params]
    accepts_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if missing and not accepts_kwargs:
        raise ValueError(
            f"reward function {spec!r} must accept keyword arguments prompt, completion, ground_truth, extra "
            f"(missing {missing}); use custom_reward_function.* for verl-style functions"
        )

    def call(prompt: str, completion: str, ground_truth: str, extra: dict[str, Any]) -> Any:
        kwargs: dict[str, Any] = {"completion": completion, "ground_truth": ground_truth}
        if "prompt" in params or accepts_kwargs:
            kwargs["prompt"] = prompt
        if "extra" in params or accepts_kwargs:
            kwargs["extra"] = extra
        return fn(**kwargs)

    return call
