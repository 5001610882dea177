"""rollout_metrics on real wire groups, checked by hand: rewards, lengths, finish reasons, staleness, version span."""

from __future__ import annotations

import pytest

from async_rl.metric_catalog import unknown_keys
from async_rl.runtime.rollout_metrics import rollout_metrics
from async_rl.transport import make_completion
from async_rl.transport.protocol import RolloutGroup

EOS = 2


def _group(prompt_id: int, completions: list[tuple[list[int], int, int, str, float]], gen_s: float) -> RolloutGroup:
    """``completions``: (token ids, version_min, version_max, finish reason, reward) each."""
    return RolloutGroup(
        prompt_id=prompt_id,
        lease_id=prompt_id + 1,
        actor_id="actor-0",
        completions=[
            make_completion(
                tokens,
                [-0.5] * len(tokens),
                version_min=vmin,
                version_max=vmax,
                finish_reason=reason,
                reward=reward,
                reward_components={"acc": float(reward > 0)},
            )
            for tokens, vmin, vmax, reason, reward in completions
        ],
        timings={"generate_s": gen_s},
    )


def test_rollout_metrics_by_hand() -> None:
    groups = [
        # oldest completion under version 3: trained at 5, staleness 2; spans 0 and 1
        _group(0, [([5, 6, EOS], 3, 3, "stop", 1.0), ([7, 8, 9, 4], 4, 5, "length", 0.0)], gen_s=2.0),
        # under 5: staleness 0; span 0 twice
        _group(1, [([EOS], 5, 5, "stop", 0.5), ([3, EOS], 5, 5, "stop", 0.5)], gen_s=4.0),
    ]
    m = rollout_metrics(groups, trained_version=5, eos_token_id=EOS)
    assert m["rollout/reward_mean"] == pytest.approx(0.5)  # (1 + 0 + 0.5 + 0.5) / 4
    assert m["rollout/reward/acc"] == pytest.approx(0.75)  # 3 of 4 rewards > 0
    assert m["rollout/response_length_mean"] == pytest.approx(2.5)  # (3 + 4 + 1 + 2) / 4
    assert m["rollout/generated_tokens"] == 10.0
    assert m["rollout/group_generate_s_mean"] == pytest.approx(3.0)  # (2 + 4) / 2
    assert (m["rollout/finish/stop"], m["rollout/finish/length"]) == (0.75, 0.25)
    assert m["rollout/eos_fraction"] == 0.75  # all but the truncated one end in EOS
    assert m["rollout/staleness_mean"] == 1.0  # groups: 2 and 0
    assert m["rollout/staleness_max"] == 2.0
    assert (m["rollout/staleness_hist/0"], m["rollout/staleness_hist/2"]) == (0.5, 0.5)
    assert "rollout/staleness_hist/1" not in m
    assert m["rollout/version_span_mean"] == 0.25 and m["rollout/version_span_max"] == 1.0  # spans 0, 1, 0, 0
    assert unknown_keys(m, "step") == []


def test_rollout_metrics_without_eos_or_groups() -> None:
    one = [_group(0, [([1, 2], 0, 0, "stop", 1.0)], gen_s=1.0)]
    assert "rollout/eos_fraction" not in rollout_metrics(one, trained_version=0)
    empty = rollout_metrics([], trained_version=3)
    assert empty["rollout/staleness_mean"] == 0.0 and empty["rollout/staleness_max"] == 0.0
    assert empty["rollout/reward_mean"] == 0.0 and empty["rollout/version_span_mean"] == 0.0
