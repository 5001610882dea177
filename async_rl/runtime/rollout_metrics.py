"""Metrics of the rollout groups trained in one step: rewards, lengths, finish reasons, staleness and version span.

The keys are the ``rollout/...`` entries of the metric catalog (runtime/metric_catalog.py), which also defines
staleness; every value here is computed once from the whole step's groups (reduction ``batch``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from async_rl import metric_catalog as mc
from async_rl.metric_catalog import histogram_mean, lag_histogram

if TYPE_CHECKING:
    from async_rl.transport.protocol import RolloutGroup


def rollout_metrics(
    groups: Sequence[RolloutGroup], trained_version: int, eos_token_id: int | None = None
) -> dict[str, float]:
    """Reward (mean and by component), response length, staleness and version span of the groups trained now, and
    how completions ended: ``rollout/finish/<reason>`` fractions and ``rollout/eos_fraction`` (last token = EOS).

    ``trained_version``: the learner's version at the start of the step that trained ``groups``; a group's staleness
    counts from its oldest completion (``RolloutGroup.version``)."""
    from async_rl.transport.protocol import unpack_array  # the rollout plane (ZeroMQ) only when a run has one

    rewards: list[float] = []
    lengths: list[int] = []
    components: dict[str, list[float]] = {}
    spans: Counter[int] = Counter()
    gen_s: list[float] = []
    finish: Counter[str] = Counter()
    eos = 0
    for g in groups:
        gen_s.append(float(g.timings.get("generate_s", 0.0)))
        for c in g.completions:
            rewards.append(float(c.reward))
            tokens = unpack_array(c.token_ids)
            lengths.append(len(tokens))
            finish[str(c.finish_reason)] += 1
            eos += int(eos_token_id is not None and len(tokens) > 0 and int(tokens[-1]) == eos_token_id)
            spans[c.version_max - c.version_min] += 1
            for name, value in (c.reward_components or {}).items():
                components.setdefault(name, []).append(float(value))
    n = max(len(rewards), 1)
    out = {
        mc.ROLLOUT_REWARD_MEAN: sum(rewards) / n,
        mc.ROLLOUT_RESPONSE_LENGTH_MEAN: sum(lengths) / n,
        mc.ROLLOUT_GENERATED_TOKENS: float(sum(lengths)),
        mc.ROLLOUT_GROUP_GENERATE_S_MEAN: sum(gen_s) / max(len(gen_s), 1),
    }
    for name, values in components.items():
        out[mc.rollout_reward_component_key(name)] = sum(values) / len(values)
    for reason, count in finish.items():
        out[mc.rollout_finish_reason_key(reason)] = count / n
    if eos_token_id is not None:
        out[mc.ROLLOUT_EOS_FRACTION] = eos / n
    lags = lag_histogram(trained_version, (g.version for g in groups))
    out[mc.ROLLOUT_STALENESS_MEAN] = histogram_mean(lags)
    out[mc.ROLLOUT_STALENESS_MAX] = float(max(lags, default=0))
    for lag, count in lags.items():
        out[mc.rollout_staleness_hist_lag_key(lag)] = count / max(len(groups), 1)
    out[mc.ROLLOUT_VERSION_SPAN_MAX] = float(max(spans, default=0))
    out[mc.ROLLOUT_VERSION_SPAN_MEAN] = histogram_mean(spans)
    out.update(episode_metrics(groups))
    return out


def episode_metrics(groups: Sequence[RolloutGroup]) -> dict[str, float]:
    """Multi-turn metrics of the step's episodes (completions that carry ``turns``); {} when there are none."""
    episodes = [c for g in groups for c in g.completions if c.turns is not None]
    if not episodes:
        return {}
    turns = [len(c.turns or ()) for c in episodes]
    turn_lengths = [t.length for c in episodes for t in c.turns or ()]
    stats = [c.episode for c in episodes if c.episode is not None]
    n = len(episodes)
    out = {
        mc.ROLLOUT_NUM_TURNS_MEAN: sum(turns) / n,
        mc.ROLLOUT_NUM_TURNS_MAX: float(max(turns)),
        mc.ROLLOUT_TURN_LENGTH_MEAN: sum(turn_lengths) / max(len(turn_lengths), 1),
        mc.ROLLOUT_SAMPLED_TOKENS_MEAN: sum(turn_lengths) / n,
    }
    if stats:
        out[mc.ROLLOUT_TOOL_CALLS_MEAN] = sum(s.tool_calls for s in stats) / len(stats)
        out[mc.ROLLOUT_TOOL_ERRORS] = float(sum(s.tool_errors for s in stats))
        out[mc.ROLLOUT_TEMPLATE_MISMATCHES] = float(sum(s.template_mismatch for s in stats))
        out[mc.ROLLOUT_RETOKENIZATION_DRIFT] = float(sum(s.retokenization_drift for s in stats))
    return out
