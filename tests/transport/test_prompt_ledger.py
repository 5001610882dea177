"""The exactly-once ledger, without sockets: lease life cycle, delivery verdicts, persistence, and a randomised
sequence of operations (with save/restore in the middle) that must end with every prompt trained exactly once."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from async_rl.transport.codec import WireCodec, decode_plain, encode_plain
from async_rl.transport.ledger import Ledger
from async_rl.transport.protocol import RolloutGroup, make_completion

CODEC = WireCodec()


def _group(prompt_id: int, lease_id: int, version: int = 0) -> RolloutGroup:
    comp = make_completion(np.array([prompt_id]), np.array([-1.0]), version_min=version)
    return RolloutGroup(prompt_id=prompt_id, lease_id=lease_id, actor_id="a", completions=[comp])


def test_grants_new_data_in_order_then_stops_when_exhausted() -> None:
    led = Ledger(total=3)
    leases = led.grant("a", 5, deadline=10.0)
    assert [x.prompt_id for x in leases] == [0, 1, 2]  # only 3 prompts exist
    assert [x.lease_id for x in leases] == [1, 2, 3]
    assert led.exhausted and not led.finished
    assert led.grant("a", 1, deadline=10.0) == []


def test_expired_prompts_are_regranted_before_new_data() -> None:
    led = Ledger()
    led.grant("a", 2, deadline=5.0)  # prompts 0, 1 until t=5
    led.grant("b", 1, deadline=50.0)  # prompt 2 until t=50
    expired = led.expire_due(now=6.0)
    assert sorted(x.prompt_id for x in expired) == [0, 1]
    again = led.grant("b", 3, deadline=60.0)
    assert [x.prompt_id for x in again] == [0, 1, 3]  # re-grants first, then new prompt 3
    led.check_invariants()


def test_revoked_grants_go_back_to_the_front_in_order() -> None:
    led = Ledger()
    led.grant("a", 1, deadline=1.0)
    led.expire_due(now=2.0)  # prompt 0 waits for a re-grant
    unsent = led.grant("b", 3, deadline=9.0)  # prompts 0, 1, 2
    led.revoke(unsent[1:])  # 1 and 2 were never delivered
    assert list(led.regrant) == [1, 2]
    assert [x.prompt_id for x in led.grant("c", 2, deadline=9.0)] == [1, 2]


def test_delivery_verdicts() -> None:
    led = Ledger()
    first = led.grant("a", 2, deadline=1.0)  # prompt 0 lease 1, prompt 1 lease 2
    assert led.check_delivery(0, 1) == "ok"
    assert led.check_delivery(0, 2) == "duplicate"  # a lease of another prompt
    assert led.check_delivery(5, 1) == "unknown"  # never granted
    assert led.check_delivery(0, 99) == "unknown"  # lease id never issued
    led.accept(_group(0, 1), nbytes=10)
    assert led.check_delivery(0, 1) == "duplicate"  # re-sent after a lost ack
    led.expire_due(now=2.0)  # prompt 1's lease 2 expired, not re-granted yet
    assert led.check_delivery(1, first[1].lease_id) == "late"  # allowed: nobody else is working on it
    regranted = led.grant("b", 1, deadline=9.0)
    assert regranted[0].prompt_id == 1
    assert led.check_delivery(1, first[1].lease_id) == "duplicate"  # its prompt now belongs to lease 3
    assert led.check_delivery(1, regranted[0].lease_id) == "ok"


def test_late_delivery_settles_the_regrant_entry() -> None:
    led = Ledger()
    (lease,) = led.grant("a", 1, deadline=1.0)
    led.expire_actor("a")
    led.accept(_group(0, lease.lease_id), nbytes=1)  # late, accepted
    assert not led.regrant
    assert led.grant("b", 1, deadline=9.0)[0].prompt_id == 1  # prompt 0 is not handed out again


def test_take_orders_by_oldest_version_then_arrival() -> None:
    led = Ledger()
    leases = led.grant("a", 3, deadline=9.0)
    for lease, version in zip(leases, [2, 1, 2], strict=True):
        led.accept(_group(lease.prompt_id, lease.lease_id, version), nbytes=1)
    assert [b.group.prompt_id for b in led.take(3)] == [1, 0, 2]  # version 1 first, then arrival order


def test_purge_stale_regrants_or_drops() -> None:
    for regrant in (True, False):
        led = Ledger()
        leases = led.grant("a", 2, deadline=9.0)
        led.accept(_group(0, leases[0].lease_id, version=0), nbytes=1)
        led.accept(_group(1, leases[1].lease_id, version=2), nbytes=1)
        stale = led.purge_stale(current_version=3, max_staleness=1, regrant=regrant)  # 3-0 > 1 stale, 3-2 ok
        assert [g.prompt_id for g in stale] == [0]
        assert (0 in led.regrant) is regrant
        assert led.dropped_total == (0 if regrant else 1)
        if regrant:  # the stale group's lease must not be accepted again as "late"
            assert led.check_delivery(0, leases[0].lease_id) == "duplicate"
        led.check_invariants()


def test_mark_trained_rejects_ids_not_handed_out() -> None:
    led = Ledger()
    (lease,) = led.grant("a", 1, deadline=9.0)
    led.accept(_group(0, lease.lease_id), nbytes=1)
    with pytest.raises(ValueError, match=r"\[0\]"):
        led.mark_trained([0])  # received but not taken
    led.take(1)
    led.mark_trained([0])
    assert led.is_done(0) and led.done_low == 1 and led.trained_total == 1


def test_state_round_trip_folds_leases_into_the_regrant_queue() -> None:
    led = Ledger(total=10)
    leases = led.grant("a", 4, deadline=9.0)  # prompts 0..3
    led.accept(_group(0, leases[0].lease_id), nbytes=1)
    led.accept(_group(1, leases[1].lease_id), nbytes=1)
    led.take(1)  # prompt 0 taken, not trained
    state = decode_plain(encode_plain(led.state_dict(CODEC)))  # through msgpack bytes, as a checkpoint would
    back = Ledger.from_state_dict(state, CODEC)
    assert back.next_prompt_id == 4
    assert sorted(back.received) == [0, 1]  # taken-but-untrained comes back as buffered
    assert list(back.regrant) == [2, 3]  # outstanding leases return to the queue
    assert back.check_delivery(2, leases[2].lease_id) == "late"  # an old actor may still deliver it
    assert [x.prompt_id for x in back.grant("b", 3, deadline=1.0)] == [2, 3, 4]


def test_state_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="format"):
        Ledger.from_state_dict({"format": 99}, CODEC)
    state = Ledger().state_dict(CODEC)
    del state["done_low"]
    with pytest.raises(ValueError, match="done_low"):
        Ledger.from_state_dict(state, CODEC)
    with pytest.raises(ValueError, match="extension"):
        decode_plain(msgspec.msgpack.encode(msgspec.msgpack.Ext(1, b"")))


OPS = st.lists(
    st.tuples(st.sampled_from(["grant", "deliver", "late", "expire", "take", "train", "restore"]), st.integers(0, 9)),
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(ops=OPS)
def test_random_operations_train_every_prompt_exactly_once(ops: list[tuple[str, int]]) -> None:
    total = 12
    led = Ledger(total=total)
    held: list[tuple[int, int]] = []  # (prompt id, lease id) an actor holds, including expired ones
    trained: list[int] = []
    now = 0.0
    for op, arg in ops:
        now += 1.0
        if op == "grant":
            held += [(x.prompt_id, x.lease_id) for x in led.grant(f"a{arg % 3}", arg % 4, deadline=now + 3)]
        elif op in ("deliver", "late") and held:
            pid, lease_id = held.pop(arg % len(held))
            if led.check_delivery(pid, lease_id) in ("ok", "late"):
                led.accept(_group(pid, lease_id), nbytes=1)
        elif op == "expire":
            led.expire_actor(f"a{arg % 3}")
        elif op == "take":
            led.take(arg % 4)
        elif op == "train" and led.taken:
            ids = list(led.taken)[: 1 + arg % 3]
            led.mark_trained(ids)
            trained += ids
        elif op == "restore":
            led = Ledger.from_state_dict(decode_plain(encode_plain(led.state_dict(CODEC))), CODEC)
            assert all(led.is_done(p) for p in trained)
        led.check_invariants()
    # Drain: the learner trains what it holds, a well-behaved actor answers every grant, the learner trains the rest.
    trained += list(led.taken)
    led.mark_trained(list(led.taken))
    led.expire_due(now + 100)  # leases nobody will deliver time out
    for _ in range(10 * total):
        for lease in led.grant("z", 4, deadline=now + 3):
            led.accept(_group(lease.prompt_id, lease.lease_id), nbytes=1)
        taken = [b.group.prompt_id for b in led.take(4)]
        led.mark_trained(taken)
        trained += taken
        if led.finished:
            break
    assert led.finished
    assert sorted(trained) == list(range(total))  # each prompt exactly once, none skipped
