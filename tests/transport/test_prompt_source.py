"""PromptSource: with a shuffle seed every epoch is a fresh permutation that visits each record exactly once."""

from __future__ import annotations

import numpy as np

from async_rl.transport import PromptRecord
from async_rl.transport.prompts import PromptSource

N = 50


def _source(shuffle_seed: int | None, max_epochs: int | None = 3) -> PromptSource:
    records = [PromptRecord(np.array([i], dtype=np.int32), {"ground_truth": str(i)}) for i in range(N)]
    return PromptSource(records, shuffle_seed=shuffle_seed, max_epochs=max_epochs)


def _epoch(source: PromptSource, epoch: int) -> list[int]:
    """The record indices epoch ``epoch`` visits, in order (prompt ids ``epoch * N .. epoch * N + N - 1``)."""
    return [int(source.record(epoch * N + pos).token_ids[0]) for pos in range(N)]


def test_every_epoch_is_a_new_permutation_of_all_records() -> None:
    source = _source(shuffle_seed=1)
    orders = [_epoch(source, e) for e in range(3)]
    for order in orders:
        assert sorted(order) == list(range(N))  # each record exactly once per epoch
    assert orders[0] != orders[1] and orders[1] != orders[2] and orders[0] != orders[2]  # reshuffled every epoch
    assert orders[0] != list(range(N))
    assert source.total == 3 * N


def test_the_order_is_a_function_of_seed_and_epoch_only() -> None:
    a, b = _source(shuffle_seed=1), _source(shuffle_seed=1)
    assert [_epoch(a, e) for e in (2, 0, 1)] == [_epoch(b, e) for e in (2, 0, 1)]  # resumable from the id alone
    assert _epoch(_source(shuffle_seed=2), 0) != _epoch(a, 0)


def test_without_a_seed_every_epoch_walks_the_file_order() -> None:
    source = _source(shuffle_seed=None, max_epochs=None)
    assert _epoch(source, 0) == _epoch(source, 5) == list(range(N))
    assert source.total is None
