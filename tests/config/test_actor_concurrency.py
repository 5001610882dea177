"""``max_concurrent_eval``: a validation round's prompts one actor generates at once, as many samples as its
training groups may hold."""

from __future__ import annotations

from async_rl.config import load_config
from async_rl.config.resolve import max_concurrent_eval


def _cfg(groups: int, n: int, val_n: int):  # type: ignore[no-untyped-def]
    return load_config(
        None,
        [
            f"async_training.actor.max_concurrent_groups={groups}",
            f"actor_rollout_ref.rollout.n={n}",
            f"actor_rollout_ref.rollout.val_kwargs.n={val_n}",
        ],
    )


def test_a_round_gets_as_many_samples_as_the_training_groups() -> None:
    assert max_concurrent_eval(_cfg(32, 8, 1)) == 256  # the SmolLM2 recipe: 32 groups x 8 samples, greedy rounds
    assert max_concurrent_eval(_cfg(32, 8, 4)) == 64  # mean@4 rounds: 4 samples per prompt
    assert max_concurrent_eval(_cfg(4, 1, 1)) == 4  # one sample each way: the same cap as training


def test_more_samples_per_prompt_than_per_group_still_leaves_one() -> None:
    assert max_concurrent_eval(_cfg(2, 2, 16)) == 1
