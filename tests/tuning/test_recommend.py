"""The recommendation search on a synthetic profile."""

from __future__ import annotations

import pytest

from async_rl.tuning.profile import Profile
from async_rl.tuning.recommend import Assumptions, Candidate, bottleneck, evaluate, learner_at, recommend, sync_at
from async_rl.tuning.simulator import SimResult


def test_learner_scaling_assumption(tuner_profile: Profile) -> None:
    a = Assumptions(efficiency_per_doubling=0.5)
    assert learner_at(tuner_profile, 2, a).tokens_per_s == pytest.approx(1800.0)  # measured: used as is
    # 8 ranks = 2 doublings past the measured 2: 4 x 1800 x 0.5^2
    assert learner_at(tuner_profile, 8, a).tokens_per_s == pytest.approx(1800.0)
    assert sync_at(tuner_profile, 4, Assumptions(sync_log_factor=0.5)) == pytest.approx(tuner_profile.sync_s() * 2.0)


def test_bottleneck_names() -> None:
    def r(learner_idle: float, actor_idle: float, sync: float = 0.0) -> SimResult:
        return SimResult(1.0, 1.0, 1.0, learner_idle, sync, actor_idle, 0.0, 0.0, 1.0)

    assert bottleneck(r(0.5, 0.0)) == "generation"
    assert bottleneck(r(0.0, 0.5)) == "learner"
    assert bottleneck(r(0.0, 0.0, sync=0.5)) == "weight sync"
    assert bottleneck(r(0.4, 0.4)) == "staleness bound"
    assert bottleneck(r(0.05, 0.05)) == "balanced"


def test_recommend_picks_the_best_and_prefers_small_k(tuner_profile: Profile) -> None:
    chosen, tried = recommend(tuner_profile, 8, Assumptions(), steps=12)
    best = max(t.result.trained_tokens_per_s for t in tried)
    assert chosen in tried
    assert chosen.result.trained_tokens_per_s >= 0.98 * best
    near = [t for t in tried if t.result.trained_tokens_per_s >= 0.98 * best]
    assert chosen.candidate.max_staleness == min(t.candidate.max_staleness for t in near)
    c = chosen.candidate
    assert c.learner_gpus + c.actors == 8 and c.learner_gpus in (1, 2, 4)


def test_a_slow_learner_gets_more_gpus_than_a_fast_one(tuner_profile: Profile) -> None:
    slow, _ = recommend(tuner_profile, 16, Assumptions(learner_scale=0.05), steps=12)
    fast, _ = recommend(tuner_profile, 16, Assumptions(learner_scale=50.0), steps=12)
    assert slow.candidate.learner_gpus > fast.candidate.learner_gpus


def test_evaluate_reports_tokens_per_step(tuner_profile: Profile) -> None:
    rec = evaluate(tuner_profile, Candidate(4, 2, 2, 8, 8, 1), Assumptions(), steps=12)
    # 8 groups x 4 sequences x (10 prompt + mean response ~20) tokens
    assert 8 * 4 * (10 + 10) <= rec.tokens_per_step <= 8 * 4 * (10 + 30)
    assert rec.row()["gpus"] == 4
