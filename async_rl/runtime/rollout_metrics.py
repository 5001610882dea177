"""Metrics of the rollout groups trained in one step: rewards, lengths, finish reasons, staleness and version span.

The keys are the ``rollout/...`` entries of the metric catalog (runtime/metric_catalog.py), which also defines
staleness; every value here is computed once from the whole step's groups (reduction ``batch``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

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
        "rollout/reward_mean": sum(rewards) / n,
        "rollout/response_length_mean": sum(lengths) / n,
        "rollout/generated_tokens": float(sum(lengths)),
        "rollout/group_generate_s_mean": sum(gen_s) / max(len(gen_s), 1),
    }
    for name, values in components.items():
        out[f"rollout/reward/{name}"] = sum(values) / len(values)
    for reason, count in finish.items():
        out[f"rollout/finish/{reason}"] = count / n
    if eos_token_id is not None:
        out["rollout/eos_fraction"] = eos / n
    lags = lag_histogram(trained_version, (g.version for g in groups))
    out["rollout/staleness_mean"] = histogram_mean(lags)
    out["rollout/staleness_max"] = float(max(lags, default=0))
    for lag, count in lags.items():
        out[f"rollout/staleness_hist/{lag}"] = count / max(len(groups), 1)
    out["rollout/version_span_max"] = float(max(spans, default=0))
    out["rollout/version_span_mean"] = histogram_mean(spans)
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
        "rollout/num_turns_mean": sum(turns) / n,
        "rollout/num_turns_max": float(max(turns)),
        "rollout/turn_length_mean": sum(turn_lengths) / max(len(turn_lengths), 1),
        "rollout/sampled_tokens_mean": sum(turn_lengths) / n,
    }
    if stats:
        out["rollout/tool_calls_mean"] = sum(s.tool_calls for s in stats) / len(stats)
        out["rollout/tool_errors"] = float(sum(s.tool_errors for s in stats))
        out["rollout/template_mismatches"] = float(sum(s.template_mismatch for s in stats))
        out["rollout/retokenization_drift"] = float(sum(s.retokenization_drift for s in stats))
    return out
