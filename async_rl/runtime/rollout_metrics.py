"""Metrics of the rollout groups trained in one step: rewards, lengths, finish reasons, staleness and version span."""

from __future__ import annotations

from collections import Counter
from typing import Any


def rollout_metrics(groups: list[Any], version: int, eos_token_id: int | None = None) -> dict[str, float]:
    """Reward (mean and by component), response length, staleness and version span of the groups trained now, and
    how completions ended: ``rollout/finish/<reason>`` fractions and ``rollout/eos_fraction`` (last token = EOS)."""
    from async_rl.transport import unpack_array

    rewards: list[float] = []
    lengths: list[int] = []
    components: dict[str, list[float]] = {}
    staleness: Counter[int] = Counter()
    spans: Counter[int] = Counter()
    gen_s: list[float] = []
    finish: Counter[str] = Counter()
    eos = 0
    for g in groups:
        oldest = min(c.version_min for c in g.completions)
        staleness[version - oldest] += 1
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
    total = sum(staleness.values())
    out["rollout/staleness_mean"] = sum(k * v for k, v in staleness.items()) / max(total, 1)
    out["rollout/staleness_max"] = float(max(staleness, default=0))
    for lag, count in staleness.items():
        out[f"rollout/staleness_hist/{lag}"] = count / max(total, 1)
    out["rollout/version_span_max"] = float(max(spans, default=0))
    out["rollout/version_span_mean"] = sum(k * v for k, v in spans.items()) / max(sum(spans.values()), 1)
    return out
