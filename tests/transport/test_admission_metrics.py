"""Pure pieces: the staleness bound, admission control (incl. the K = 0 gate), credit accounting, metrics
snapshots, and the once-per-sender bad-message log."""

from __future__ import annotations

import logging

import pytest

from async_rl.transport.actors import ActorState
from async_rl.transport.admission import Admission, min_start_version, within_bound
from async_rl.transport.metrics import BadMessageLog, RateMeter, TransportMetrics


def test_staleness_bound() -> None:
    assert within_bound(current_version=5, group_version=3, max_staleness=2)  # 5 - 3 = 2 <= 2
    assert not within_bound(current_version=6, group_version=3, max_staleness=2)  # 6 - 3 = 3 > 2
    assert within_bound(current_version=4, group_version=4, max_staleness=0)
    assert min_start_version(5, 2) == 3 and min_start_version(1, 4) == 0  # never negative


def test_admission_caps_in_flight_groups() -> None:
    adm = Admission(max_staleness=1, cap=8)  # groups_per_step defaults to the cap: the flat cap binds
    assert adm.allowance(in_flight=0, current_version=0) == 8
    assert adm.allowance(in_flight=6, current_version=0) == 2
    assert adm.allowance(in_flight=9, current_version=0) == 0  # over the cap (e.g. after a restore): never negative


def test_admission_looks_ahead_to_the_train_version() -> None:
    # K = 2, B = 4 per step, flat cap 12. Learner idle at version 5: positions 0..3 train at 5, 4..7 at 6, 8..11 at 7.
    adm = Admission(max_staleness=2, cap=12, groups_per_step=4)
    assert [adm.train_version(5, q, busy=False) for q in (0, 3, 4, 8)] == [5, 5, 6, 7]
    assert [adm.min_version(5, q, busy=False) for q in (0, 4, 8)] == [3, 4, 5]
    assert adm.allowance(in_flight=0, current_version=5) == 12  # position 11 trains at 7 = 5 + K: still allowed
    # Busy (a step in progress): everything queued shifts one version later, so one step's worth less may be queued.
    assert adm.train_version(5, 0, busy=True) == 6
    assert adm.allowance(in_flight=4, current_version=5, queued=0, busy=True) == 8  # (2 + 1 - 1) x 4 - 0
    assert adm.allowance(in_flight=10, current_version=5, queued=6, busy=True) == 2
    # An actor whose weights lag the learner may only take positions whose floor its weights satisfy.
    assert adm.allowance(in_flight=0, current_version=5, loaded=4) == 8  # positions 0..7 have floor <= 4
    assert adm.allowance(in_flight=0, current_version=5, loaded=2) == 0  # floor of position 0 is 3
    # Trained but not yet published: the learner is still "busy" until version 6 arrives.
    adm.on_trained(current_version=5)
    assert adm.allowance(in_flight=0, current_version=5) == 8
    assert adm.allowance(in_flight=0, current_version=6) == 12


def test_k0_gate_opens_only_at_the_next_version() -> None:
    adm = Admission(max_staleness=0, cap=4)
    assert adm.allowance(0, current_version=3) == 4
    assert adm.min_version(3, 3, busy=False) == 3  # K = 0: every prompt starts under the newest policy
    assert adm.allowance(0, current_version=3, busy=True) == 0  # a step in progress: nothing granted
    adm.on_trained(current_version=3)
    assert adm.allowance(0, current_version=3) == 0  # trained, new version not yet published
    assert adm.allowance(0, current_version=4) == 4
    adm.load_state_dict({"wait_for_version": 9})  # the key older checkpoints wrote
    assert adm.allowance(0, current_version=8) == 0
    assert adm.state_dict() == {"pending_version": 9}
    with pytest.raises(ValueError, match="pending_version"):
        adm.load_state_dict({"pending_version": -1})
    with pytest.raises(ValueError, match="cap"):
        Admission(max_staleness=0, cap=0)
    with pytest.raises(ValueError, match="groups_per_step"):
        Admission(max_staleness=0, cap=4, groups_per_step=0)


def test_credit_counts_prompts_in_transit() -> None:
    actor = ActorState("a", b"a", claimed_version=0, last_seen=0.0, last_heartbeat_sent=0.0)
    actor.granted_total = 10
    actor.set_credit(max_groups=4, grants_seen=8)  # 2 granted prompts not seen yet: 4 - 2 = 2 more
    assert actor.credit == 2
    actor.set_credit(max_groups=4, grants_seen=10)  # the same request after seeing everything: 4
    assert actor.credit == 4
    actor.set_credit(max_groups=1, grants_seen=5)  # 5 in transit > 1: no credit, not negative
    assert actor.credit == 0


def test_rate_meter_measures_between_reads() -> None:
    meter = RateMeter(now=10.0)
    meter.add(30)
    assert meter.rate(now=12.0) == 15.0  # 30 events / 2 s
    meter.add(5)
    assert meter.rate(now=17.0) == 1.0  # 5 events / 5 s
    assert meter.total == 35


def test_metrics_snapshot_is_namespaced_with_histograms() -> None:
    m = TransportMetrics(max_staleness=2)
    for s in (0, 1, 1, 2):
        m.record_staleness(s)
    for span in (0, 3, 11):
        m.record_span(span)
    m.drops["transport/drops/stale"] += 3
    snap = m.snapshot({"transport/queue_depth": 5}, {"schema": 2, "ext": 1}, {"hwm": 4})
    assert all(key.startswith("transport/") for key in snap)
    assert [snap[f"transport/staleness/{k}"] for k in range(3)] == [1, 2, 1]
    assert snap["transport/staleness_mean"] == 1.0  # (0 + 1 + 1 + 2) / 4
    assert snap["transport/version_span/3"] == 1 and snap["transport/version_span/8+"] == 1  # 11 lands in 8+
    assert snap["transport/decode_errors_total"] == 3 and snap["transport/decode_errors/ext"] == 1
    assert snap["transport/drops/stale"] == 3 and snap["transport/send_failures/hwm"] == 4
    assert snap["transport/queue_depth"] == 5


def test_bad_messages_are_logged_once_per_sender(caplog: pytest.LogCaptureFixture) -> None:
    log = BadMessageLog("message", window_s=60.0, max_senders=2)
    with caplog.at_level(logging.WARNING, logger="async_rl.transport.metrics"):
        assert log.record("x", "schema", "d", now=0.0)
        assert not log.record("x", "kind", "d", now=1.0)  # same sender within the window: counted only
        assert log.record("y", "schema", "d", now=2.0)
        assert log.record("x", "schema", "d", now=61.0)  # window elapsed: logged again
    assert len(caplog.records) == 3
    assert log.counts == {"schema": 3, "kind": 1} and log.total == 4
    log.record("z", "schema", "d", now=62.0)
    assert log.tracked_senders == 2  # bounded: the oldest sender was forgotten


def test_actor_reports_accumulate_growth_and_survive_restarts() -> None:
    m = TransportMetrics(max_staleness=1)
    m.record_actor_report({}, {"generated_tokens": 100.0, "idle_s": 1.0, "uptime_s": 5.0, "unknown": 7.0})
    m.record_actor_report({"generated_tokens": 100.0, "idle_s": 1.0, "uptime_s": 5.0}, {"generated_tokens": 150.0})
    # a restarted actor reports from zero again: its new count is all growth
    m.record_actor_report({"generated_tokens": 150.0}, {"generated_tokens": 20.0, "idle_s": float("nan")})
    snap = m.snapshot({}, {}, {})
    assert snap["transport/actors/generated_tokens_total"] == 170.0  # 100 + 50 + 20
    assert snap["transport/actors/idle_s_total"] == 1.0  # the NaN report is ignored
    assert snap["transport/actors/uptime_s_total"] == 5.0
    assert "transport/actors/unknown_total" not in snap
    # LoRA served-weights checks reach the step's metrics the same way (not only each actor's exit summary)
    m.record_actor_report({}, {"served_checks": 3.0, "served_check_failures": 0.0})
    m.record_actor_report({"served_checks": 3.0}, {"served_checks": 5.0, "served_check_failures": 1.0})
    snap = m.snapshot({}, {}, {})
    assert snap["transport/actors/served_checks_total"] == 5.0
    assert snap["transport/actors/served_check_failures_total"] == 1.0
    m.record_actor_report({}, {"lend_switches": 4.0})  # lent cores taken and given back twice
    assert m.snapshot({}, {}, {})["transport/actors/lend_switches_total"] == 4.0
