"""Group filtering (DAPO dynamic sampling) as pure logic: the ledger's ``filtered`` state and its accounting, the
constant-metric test, the per-step attribution and generation budget of `GroupFilter`, and their saved states."""

from __future__ import annotations

import numpy as np
import pytest

from async_rl.config import ConfigError, load_config
from async_rl.config.algorithm import FilterGroupsConfig
from async_rl.transport.codec import WireCodec, decode_plain, encode_plain
from async_rl.transport.filtering import GroupFilter, is_constant, metric_values
from async_rl.transport.ledger import Ledger
from async_rl.transport.protocol import RolloutGroup, make_completion

CODEC = WireCodec()


def group(prompt_id: int, lease_id: int, rewards: list[float], acc: list[float] | None = None) -> RolloutGroup:
    completions = [
        make_completion(
            np.array([1, 2], dtype=np.int32),
            np.array([-0.5, -0.5], dtype=np.float32),
            version_min=0,
            reward=r,
            reward_components=None if acc is None else {"acc": acc[i], "format": 1.0},
        )
        for i, r in enumerate(rewards)
    ]
    return RolloutGroup(prompt_id=prompt_id, lease_id=lease_id, actor_id="a", completions=completions)


def accounted(led: Ledger) -> int:
    return (
        led.trained_total
        + led.filtered_total
        + led.dropped_total
        + len(led.leases)
        + len(led.regrant)
        + len(led.received)
        + len(led.taken)
    )


# ---- the ledger ------------------------------------------------------------------------------------------------------
def test_a_filtered_prompt_is_done_counted_and_never_granted_again() -> None:
    led = Ledger(total=6)
    leases = led.grant("a", 4, deadline=10.0)
    assert [x.prompt_id for x in leases] == [0, 1, 2, 3]
    assert led.in_flight == 4
    assert led.check_delivery(1, leases[1].lease_id) == "ok"
    led.filter(1)
    assert led.is_done(1) and led.filtered_total == 1 and led.trained_total == 0
    assert led.in_flight == 3  # its admission slot is free at once
    assert 1 not in led.received and 1 not in led.leases and 1 not in led.regrant
    assert led.check_delivery(1, leases[1].lease_id) == "duplicate"  # a re-send is not filtered (or counted) twice
    led.accept(group(0, leases[0].lease_id, [0.0, 1.0]), 100)
    # the next grants are new data: a filtered prompt never returns to the re-grant queue
    assert [x.prompt_id for x in led.grant("a", 5, deadline=10.0)] == [4, 5]
    assert led.exhausted
    led.check_invariants()
    assert accounted(led) == led.next_prompt_id == 6


def test_a_late_delivery_can_be_filtered_and_trained_filtered_dropped_add_up() -> None:
    led = Ledger(total=None)
    first = led.grant("a", 3, deadline=1.0)
    led.expire_due(now=2.0)  # all three back to the re-grant queue, late deliveries still accepted
    assert led.check_delivery(0, first[0].lease_id) == "late"
    led.filter(0)  # a late group that is constant
    assert 0 not in led.regrant and led.filtered_total == 1
    led.accept(group(1, first[1].lease_id, [0.0, 1.0]), 10)
    led.reject_stale(2, regrant=False)  # dropped for good
    (taken,) = led.take(1)
    led.mark_trained([taken.group.prompt_id])
    assert (led.trained_total, led.filtered_total, led.dropped_total) == (1, 1, 1)
    assert led.done_low == 3
    led.check_invariants()


def test_invariants_catch_a_done_id_counted_nowhere() -> None:
    led = Ledger(total=None)
    (lease,) = led.grant("a", 1, deadline=1.0)
    led.filter(lease.prompt_id)
    led.filtered_total = 0  # corrupted: a DONE id that is neither trained, filtered nor dropped
    with pytest.raises(ValueError, match="DONE but trained_total=0 \\+ filtered_total=0 \\+ dropped_total=0 = 0"):
        led.check_invariants()


def test_grants_settled_counts_every_lease_whose_outcome_is_known() -> None:
    led = Ledger(total=None)
    leases = led.grant("a", 4, deadline=1.0)  # lease ids 1..4
    assert led.grants_settled == 0  # all four still out
    led.filter(0)
    led.accept(group(1, leases[1].lease_id, [0.0, 1.0]), 10)
    assert led.grants_settled == 1  # the filtered one; the buffered group's outcome is not known yet
    led.expire_due(now=5.0)  # 2 and 3 expire: those grants were wasted ...
    assert led.grants_settled == 3
    again = led.grant("a", 2, deadline=10.0)  # ... and granted again (lease ids 5, 6)
    assert [x.lease_id for x in again] == [5, 6] and led.grants_settled == 3
    (buf,) = led.take(1)
    led.mark_trained([buf.group.prompt_id])
    assert led.grants_settled == 4  # 6 issued - 2 out


def test_state_round_trip_keeps_filtered_prompts_done_and_the_total() -> None:
    led = Ledger(total=10)
    leases = led.grant("a", 5, deadline=1.0)
    for pid in (0, 2, 3):
        led.filter(pid)
    led.accept(group(1, leases[1].lease_id, [0.0, 1.0]), 10)
    state = decode_plain(encode_plain(led.state_dict(CODEC)))
    assert state["filtered_total"] == 3
    back = Ledger.from_state_dict(state, CODEC)
    assert back.filtered_total == 3 and all(back.is_done(p) for p in (0, 2, 3))
    assert list(back.regrant) == [4] and set(back.received) == {1}  # the outstanding lease is folded into re-grants
    assert [x.prompt_id for x in back.grant("b", 3, deadline=1.0)] == [4, 5, 6]  # 0, 2, 3 never come back
    back.check_invariants()


def test_a_state_saved_before_filtering_existed_still_loads() -> None:
    led = Ledger(total=4)
    (lease,) = led.grant("a", 1, deadline=1.0)
    led.accept(group(0, lease.lease_id, [1.0, 0.0]), 10)
    state = led.state_dict(CODEC)
    del state["filtered_total"]
    assert Ledger.from_state_dict(state, CODEC).filtered_total == 0


# ---- the metric ------------------------------------------------------------------------------------------------------
def test_metric_values_read_the_reward_or_a_component() -> None:
    g = group(0, 1, [0.25, 0.75, 0.25], acc=[1.0, 1.0, 1.0])
    assert metric_values(g, "reward") == [0.25, 0.75, 0.25]
    assert metric_values(g, "acc") == [1.0, 1.0, 1.0]
    assert not is_constant(metric_values(g, "reward")) and is_constant(metric_values(g, "acc"))


@pytest.mark.parametrize(
    ("values", "constant"),
    [
        ([1.0, 1.0], True),
        ([0.0, 0.0, 0.0, 0.0], True),
        ([0.1, 0.1, 0.1], True),  # exact equality: np.std of these is 1.4e-17, not 0
        ([1.0, 1.0 + 1e-12], False),  # any difference is signal
        ([1.0], False),  # one completion: no variance to judge, never filtered
        ([], False),
        ([float("nan"), float("nan")], False),
    ],
)
def test_constant_means_all_exactly_equal(values: list[float], constant: bool) -> None:
    assert is_constant(values) is constant


# ---- GroupFilter -----------------------------------------------------------------------------------------------------
def test_only_an_enabled_filter_with_two_completions_filters() -> None:
    constant = group(0, 1, [1.0, 1.0], acc=[0.0, 0.0])
    assert not GroupFilter(FilterGroupsConfig(), 4, n=2).should_filter(constant)
    assert not GroupFilter(FilterGroupsConfig(enable=False, metric="reward"), 4, n=2).should_filter(constant)
    single = GroupFilter(FilterGroupsConfig(enable=True, metric="reward"), 4, n=1)
    assert not single.active and single.required_component is None
    on = GroupFilter(FilterGroupsConfig(enable=True, metric="reward"), 4, n=2)
    assert on.should_filter(constant) and on.required_component is None  # the scalar reward is always there
    by_acc = GroupFilter(FilterGroupsConfig(enable=True, metric="acc"), 4, n=2)
    assert by_acc.required_component == "acc"
    assert by_acc.should_filter(constant)
    assert not by_acc.should_filter(group(1, 2, [1.0, 1.0], acc=[0.0, 1.0]))  # equal rewards, acc differs


def test_filtered_groups_count_towards_the_step_the_buffer_is_filling() -> None:
    f = GroupFilter(FilterGroupsConfig(enable=True, metric="reward"), 4, n=2)
    f.on_filtered(buffered=0)
    f.on_filtered(buffered=3)  # the next step is still short: its own
    f.on_filtered(buffered=4)  # a full step is buffered: this one is the following step's waste
    f.on_filtered(buffered=9)  # two full steps buffered: the third
    assert f.pending == [2, 1, 1]
    f.on_take(4)
    assert (f.last_filtered, f.last_taken) == (2, 4)
    assert f.metrics(trained_total=4, grants_settled=6, filtered_total=4) == {
        "transport/filter/filtered_groups": 2,
        "transport/filter/filtered_fraction": 2 / 6,
        "transport/filter/grants_per_trained_group": 1.5,
        "transport/filter/filtered_total": 4,
    }
    f.on_take(4)
    f.on_take(4)
    f.on_take(4)  # nothing was filtered for this one
    assert (f.last_filtered, f.pending) == (0, [])
    assert f.metrics(0, 0, 0)["transport/filter/filtered_fraction"] == 0.0
    assert f.metrics(0, 0, 0)["transport/filter/grants_per_trained_group"] == 0.0


def test_the_budget_is_max_num_gen_batches_times_the_step() -> None:
    f = GroupFilter(FilterGroupsConfig(enable=True, metric="acc", max_num_gen_batches=2), 4, n=3)
    for _ in range(5):
        f.on_filtered(buffered=2)
    assert f.budget_error(buffered=2) is None  # 5 filtered + 2 informative = 7 < 2 x 4
    assert f.budget_error(buffered=4) is None  # the step is full: it is the next one that fills now
    f.on_filtered(buffered=2)
    why = f.budget_error(buffered=2)  # 6 + 2 = 8 prompts used, still 2 short: a 9th would exceed the budget
    assert why is not None
    for part in (
        "too many generated batches",
        "algorithm.filter_groups.max_num_gen_batches=2",
        "2 x data.train_batch_size=4 = 8 prompts",
        "8 have come back for this step, 6 of them filtered",
        "metric 'acc' equal across all n=3 completions",
        "only 2 of the 4 informative groups",
    ):
        assert part in why, part
    assert f.budget_error(buffered=6) is None  # counted from a full step on, the next step has used 2 + 0


@pytest.mark.parametrize("limit", [0, -1])
def test_no_budget_without_a_positive_limit(limit: int) -> None:
    f = GroupFilter(FilterGroupsConfig(enable=True, metric="reward", max_num_gen_batches=limit), 2, n=2)
    for _ in range(1000):
        f.on_filtered(buffered=0)
    assert f.budget_error(buffered=0) is None


def test_filter_state_round_trip_and_a_step_taken_but_not_trained() -> None:
    f = GroupFilter(FilterGroupsConfig(enable=True, metric="reward"), 2, n=2)
    f.on_filtered(0)
    f.on_filtered(0)
    f.on_take(2)  # taken, 2 filtered for it ...
    f.on_filtered(0)  # ... and 1 already filtered for the next
    saved = decode_plain(encode_plain(f.state_dict(taken_outstanding=False)))
    g = GroupFilter(FilterGroupsConfig(enable=True, metric="reward"), 2, n=2)
    g.load_state_dict(saved)
    assert (g.pending, g.last_filtered, g.last_taken) == ([1], 2, 2)
    # saved while the taken step was not trained yet: the resumed learner takes that step again, with its count
    h = GroupFilter(FilterGroupsConfig(enable=True, metric="reward"), 2, n=2)
    h.load_state_dict(f.state_dict(taken_outstanding=True))
    h.on_take(2)
    assert h.last_filtered == 2
    h.on_take(2)
    assert h.last_filtered == 1
    for bad in ({"format": 9}, {"format": 1, "pending": [-1], "last": [0, 0]}, {"format": 1, "pending": []}):
        with pytest.raises(ValueError, match="filter state"):
            g.load_state_dict(bad)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["algorithm.filter_groups.enable=true"], "needs algorithm.filter_groups.metric"),
        (["algorithm.filter_groups.metric=''"], "1 to 128 characters"),
        ([f"algorithm.filter_groups.metric={'x' * 129}"], "1 to 128 characters"),
        (["algorithm.filter_groups.max_num_gen_batches=1.5"], "max_num_gen_batches"),
    ],
)
def test_bad_filter_settings_are_config_errors(overrides: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(None, ["actor_rollout_ref.rollout.n=4", *overrides])


def test_the_filter_refuses_enable_without_a_metric() -> None:
    with pytest.raises(ValueError, match="needs algorithm.filter_groups.metric"):
        GroupFilter(FilterGroupsConfig(enable=True), 4, n=2)


def test_filter_budget() -> None:
    def limit(**kwargs: object) -> int:
        return GroupFilter(FilterGroupsConfig(**kwargs), 4, n=2).limit_batches  # type: ignore[arg-type]

    assert limit(enable=True, metric="reward", max_num_gen_batches=3) == 3
    assert limit(enable=True, metric="reward", max_num_gen_batches=-2) == 0
    assert limit(enable=False, metric="reward", max_num_gen_batches=3) == 0
