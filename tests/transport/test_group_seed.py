"""Every sample of a run gets its own random stream (vLLM seeds sample i of a request with ``seed + i``)."""

from __future__ import annotations

from async_rl.transport.protocol import SEED_MODULUS, group_seed


def _streams(base: int, prompts: range, n: int, stream: int = 0) -> list[int]:
    return [group_seed(base, p, n, stream) + i for p in prompts for i in range(n)]


def test_a_64_by_4_step_uses_256_distinct_streams() -> None:
    # The old scheme (seed + prompt id) gave 67 distinct seeds for these 256 samples.
    old = {(0 + p) + i for p in range(64) for i in range(4)}
    assert len(old) == 67
    assert len(set(_streams(0, range(64), 4))) == 256


def test_no_overlap_across_many_prompts_epochs_and_group_sizes() -> None:
    for n in (1, 4, 8, 16):
        seeds = _streams(7, range(20_000), n)
        assert len(set(seeds)) == len(seeds)
        assert all(0 <= s < SEED_MODULUS + n for s in seeds)


def test_deterministic_and_different_per_base_seed_and_stream() -> None:
    assert group_seed(3, 10, 4) == group_seed(3, 10, 4)
    train, evals = set(_streams(0, range(500), 8)), set(_streams(0, range(500), 8, stream=1))
    assert not train & evals
    assert not set(_streams(0, range(500), 8)) & set(_streams(1, range(500), 8))  # neighbouring run seeds
