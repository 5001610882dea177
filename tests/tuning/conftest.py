"""A synthetic profile for the tuner tests: round numbers, so expected values can be worked out by hand."""

from __future__ import annotations

import pytest

from async_rl.tuning.profile import LearnerPoint, Profile, SyncPoint


def make_profile() -> Profile:
    return Profile(
        config=("configs/demo_grpo.yaml",),
        overrides=(),
        device="cpu",
        cores=2,
        group_size=4,
        groups_per_step=8,
        max_concurrent_groups=8,
        max_staleness=1,
        sync_every=1,
        prompt_len=10.0,
        response_lengths=(10, 20, 30),
        gen_sequences=(4.0, 16.0, 32.0),
        gen_tokens_per_s=(100.0, 300.0, 400.0),
        # world 1: 0.1 s + tokens / 1000; world 2: 0.1 s + tokens / 1800
        learner=(
            LearnerPoint(1, 4, 500, 0.6),
            LearnerPoint(1, 8, 1000, 1.1),
            LearnerPoint(2, 4, 900, 0.6),
            LearnerPoint(2, 8, 1800, 1.1),
        ),
        # 0.05 s + bytes / 100 MB/s
        sync=(SyncPoint(10_000_000, 0.15), SyncPoint(50_000_000, 0.55)),
        model_bytes=20_000_000,
    )


@pytest.fixture
def tuner_profile() -> Profile:
    return make_profile()
