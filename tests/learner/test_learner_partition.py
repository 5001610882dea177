"""Balanced equal-size rank partitions, verl mini/micro-batch splitting, padding-waste accounting (pure functions)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from async_rl.learner.partition import (
    computed_rows,
    forward_order,
    karmarkar_karp,
    pack_rows,
    padding_waste,
    plan_forward,
    plan_updates,
    split_micro,
    token_imbalance,
)


def test_karmarkar_karp_by_hand() -> None:
    # weights 10, 1, 1, 8 into 2 sets of 2: the only balanced split is {10, 1} vs {8, 1} (sums 11 and 9)
    parts = karmarkar_karp([10, 1, 1, 8], 2)
    sums = sorted(sum([10, 1, 1, 8][i] for i in p) for p in parts)
    assert sums == [9, 11]
    assert all(len(p) == 2 for p in parts)


@settings(max_examples=200, deadline=None)
@given(
    k=st.integers(1, 5),
    per=st.integers(1, 6),
    data=st.data(),
)
def test_karmarkar_karp_properties(k: int, per: int, data: st.DataObject) -> None:
    weights = data.draw(st.lists(st.integers(1, 500), min_size=k * per, max_size=k * per))
    parts = karmarkar_karp(weights, k)
    assert len(parts) == k
    assert sorted(i for p in parts for i in p) == list(range(len(weights)))  # each index exactly once
    assert {len(p) for p in parts} == {per}  # equal counts: same number of micro-steps on every rank
    sums = [sum(weights[i] for i in p) for p in parts]
    # differencing never widens the spread beyond one run's spread, so max - min <= max(w) - min(w)
    assert max(sums) - min(sums) <= max(weights) - min(weights)


def test_karmarkar_karp_rejects_uneven() -> None:
    with pytest.raises(ValueError, match="not divisible by k=2"):
        karmarkar_karp([1, 2, 3], 2)
    with pytest.raises(ValueError, match="k must be"):
        karmarkar_karp([1], 0)


def test_token_imbalance_by_hand() -> None:
    # sums 11 and 9: mean 10, max 11 -> 11/10 - 1 = 0.1
    assert token_imbalance([10, 1, 1, 8], [[0, 1], [2, 3]]) == pytest.approx(0.1)


def test_split_micro_sorts_longest_first() -> None:
    assert split_micro([0, 1, 2, 3, 4], [1, 5, 3, 5, 2], 2) == [[1, 3], [2, 4], [0]]
    assert split_micro([0, 1, 2], [1, 5, 3], 2, sort=False) == [[0, 1], [2]]


def test_plan_forward_and_order_cover_the_batch() -> None:
    lengths = [5, 9, 2, 7, 3, 8]
    shares = [plan_forward(lengths, 2, r, micro_size=2) for r in range(2)]
    flat = [i for share in shares for mb in share for i in mb]
    assert sorted(flat) == list(range(6))
    assert all(sum(len(mb) for mb in share) == 3 for share in shares)
    assert sorted(forward_order(lengths, 2)) == list(range(6))


NO_SKIP: dict[str, None] = {"groups": None, "skip": None}


def test_plan_updates_follows_verl_geometry() -> None:
    # 16 sequences, mini-batches of 8 (2 prompts x n=4), 2 ranks, micro-batches of 3, 2 epochs
    lengths = [10 + (i * 7) % 13 for i in range(16)]
    plans = [
        plan_updates(
            lengths, mini_size=8, micro_size=3, epochs=2, world_size=2, rank=r, shuffle=True, seed=5, **NO_SKIP
        )
        for r in range(2)
    ]
    for plan in plans:
        assert plan.num_updates == 4  # 2 epochs x 2 mini-batches
        for epoch in plan.epochs:
            # each rank gets 4 of a mini-batch's 8 rows, cut into micro-batches of 3 + 1
            assert [[len(mb) for mb in mini] for mini in epoch] == [[3, 1], [3, 1]]
    for e in range(2):
        for m in range(2):
            rows = [i for plan in plans for mb in plan.epochs[e][m] for i in mb]
            assert len(rows) == 8 and len(set(rows)) == 8
        epoch_rows = sorted(i for plan in plans for mini in plan.epochs[e] for mb in mini for i in mb)
        assert epoch_rows == list(range(16))  # every sequence once per epoch
    # shuffling: epochs differ from each other, but the plan is a pure function of the seed
    minis = lambda p, e: [sorted(i for mb in mini for i in mb) for mini in p.epochs[e]]  # noqa: E731
    again = plan_updates(
        lengths, mini_size=8, micro_size=3, epochs=2, world_size=2, rank=0, shuffle=True, seed=5, **NO_SKIP
    )
    assert again == plans[0]
    no_shuffle = plan_updates(
        lengths, mini_size=8, micro_size=3, epochs=1, world_size=1, rank=0, shuffle=False, seed=0, **NO_SKIP
    )
    assert minis(no_shuffle, 0) == [list(range(8)), list(range(8, 16))]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mini_size": 5}, "does not divide into mini-batches of mini_size=5"),
        ({"mini_size": 3, "world_size": 2}, "mini_size=3 sequences is not divisible by world_size=2"),
        ({"mini_size": 6, "world_size": 4}, "world_size=4"),
        ({"epochs": 0}, "epochs"),
        ({"rank": 2, "world_size": 2}, "rank"),
    ],
)
def test_plan_updates_rejects_bad_geometry(kwargs: dict[str, int], match: str) -> None:
    args = {"mini_size": 6, "micro_size": 1, "epochs": 1, "world_size": 1, "rank": 0, "shuffle": False, "seed": 0}
    args |= kwargs
    with pytest.raises(ValueError, match=match):
        plan_updates([1] * 12, **args, **NO_SKIP)


def test_padding_waste_by_hand() -> None:
    prompts, responses = [2, 4, 3, 1], [5, 1, 3, 2]
    # micro [0, 1]: real 7 + 5 = 12; padded to max prompt 4 + max response 5 = 9 slots x 2 rows = 18
    # micro [2]: real 6 = slots 6
    assert padding_waste(prompts, responses, [[0, 1], [2]], layout="padded") == (18, 24)
    # packed rows hold at most the longest sequence (7): [7] and [5] -> 2 rows x 7 = 14 slots; [6] -> 6
    assert padding_waste(prompts, responses, [[0, 1], [2]], layout="packed") == (18, 20)
    # one micro-batch of lengths 7, 5, 6, 3 (capacity 7): rows [7], [6] (1 free), [5] (2 free); 3 fits in none
    # -> 4 rows x 7 = 28 slots for 21 real tokens; padded: 4 rows x (max prompt 4 + max response 5) = 36
    assert padding_waste(prompts, responses, [[0, 1, 2, 3]], layout="packed") == (21, 28)
    assert padding_waste(prompts, responses, [[0, 1, 2, 3]], layout="padded") == (21, 36)


def test_pack_rows_by_hand() -> None:
    # capacity 10, lengths 6, 4, 5, 3, 2 -> FFD: 6 -> r0 (4 free); 5 -> r1 (5 free); 4 -> r0 (0); 3 -> r1 (2); 2 -> r1
    assert pack_rows([6, 4, 5, 3, 2], 10) == [[0, 1], [2, 3, 4]]
    with pytest.raises(ValueError, match="capacity=3"):
        pack_rows([4], 3)


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(1, 50), min_size=1, max_size=30), extra=st.integers(0, 40))
def test_pack_rows_properties(lengths: list[int], extra: int) -> None:
    capacity = max(lengths) + extra
    rows = pack_rows(lengths, capacity)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in row) <= capacity for row in rows)
    # first fit never leaves two rows at most half full (the later row's items would have fit in the earlier one)
    assert sum(1 for row in rows if 2 * sum(lengths[i] for i in row) <= capacity) <= 1


def test_computed_rows_leave_marked_rows_out_but_give_every_rank_a_share() -> None:
    skip = [False, True, True, False, True, True, True, True]
    assert computed_rows(range(8), skip, 1) == [0, 3]
    assert computed_rows(range(8), skip, 2) == [0, 3]
    assert computed_rows(range(8), skip, 4) == [0, 1, 2, 3]  # two marked rows come back: one row per rank
    assert computed_rows(range(8), [True] * 8, 2) == [0, 1]  # nothing to learn from: still one row a rank
    assert computed_rows([5, 4, 3], [False, False, False, False, False, True], 1) == [4, 3]  # in the given order
    assert computed_rows(range(6), [False, True, False, True, False, True], 2) == [0, 1, 2, 4]  # an even count


def test_plan_updates_computes_the_unmarked_rows_and_counts_the_whole_mini_batch() -> None:
    """4 groups of 4 rows, 2 of them marked (all-zero advantages), 2 ranks, 2 epochs: the computed micro-batches hold
    only the other groups' rows, balanced over the ranks, while ``counted`` is the plan without marks."""
    groups = [g for g in range(4) for _ in range(4)]
    lengths = [10 + (i * 7) % 13 for i in range(16)]
    skip = [g in (1, 2) for g in groups]
    args = {"mini_size": 16, "micro_size": 64, "epochs": 2, "world_size": 2, "shuffle": True, "seed": 3}
    plans = [plan_updates(lengths, rank=r, groups=groups, skip=skip, **args) for r in range(2)]
    unmarked = [plan_updates(lengths, rank=r, groups=groups, skip=None, **args) for r in range(2)]
    for e in range(2):
        computed = [i for plan in plans for mb in plan.epochs[e][0] for i in mb]
        assert sorted(computed) == [0, 1, 2, 3, 12, 13, 14, 15]
        assert [len(plan.epochs[e][0]) for plan in plans] == [1, 1]  # the same number of micro-steps per rank
        assert [len(plan.epochs[e][0][0]) for plan in plans] == [4, 4]
        for plan, base in zip(plans, unmarked, strict=True):
            assert plan.counted[e] == base.counted[e] == [sorted(i for mb in base.epochs[e][0] for i in mb)]
    assert [plan.left_out for plan in plans] == [8, 8] and unmarked[0].left_out == 0
    with pytest.raises(ValueError, match="skip marks 3 rows, the batch has 16"):
        plan_updates(lengths, rank=0, groups=groups, skip=[False] * 3, **args)
