"""EvalRound bookkeeping as pure logic: granting, re-granting on actor death and lease timeout, de-duplication,
wrong-version rejection, revocation, completion detection, closing, and the wire grants it builds."""

from __future__ import annotations

import numpy as np
import pytest

from async_rl.transport import GroupSampling, PromptRecord, make_completion, unpack_array
from async_rl.transport.actors import ActorState
from async_rl.transport.evaluation import EvalRound
from async_rl.transport.protocol import Completion, group_seed

V = 3  # the round's pinned policy version


def _round(n_records: int = 4, n: int = 2, seed: int | None = None) -> EvalRound:
    recs = [PromptRecord(np.arange(i, i + 3, dtype=np.int32), {"ground_truth": str(i)}) for i in range(n_records)]
    return EvalRound(7, V, recs, GroupSampling.defaults(n=n, temperature=0.0, max_tokens=4, seed=seed), now=100.0)


def _completions(n: int = 2, vmin: int = V, vmax: int = V, reward: float = 1.0) -> list[Completion]:
    return [make_completion([1, 2], [-0.1, -0.2], version_min=vmin, version_max=vmax, reward=reward) for _ in range(n)]


def test_grants_in_order_and_completes_when_every_index_is_delivered() -> None:
    rnd = _round()
    a = rnd.grant("a", 3, deadline=200.0)
    b = rnd.grant("b", 5, deadline=200.0)
    assert [x.index for x in a] == [0, 1, 2] and [x.index for x in b] == [3]
    assert len({x.lease_id for x in a + b}) == 4 and not rnd.pending
    assert rnd.grant("c", 1, deadline=200.0) == []
    for i, lease in enumerate(a + b):
        assert not rnd.complete
        assert rnd.deliver(lease.index, lease.lease_id, _completions(reward=float(i)), now=110.0 + i) == "accepted"
    assert rnd.complete and rnd.finished_at == 113.0 and rnd.open_count == 0
    result = rnd.close(now=120.0)
    assert result.complete and result.wall_s == 13.0  # 113 - 100: to the last result, not to the close
    assert sorted(result.completions) == [0, 1, 2, 3]
    assert [c.reward for c in result.completions[2]] == [2.0, 2.0]
    assert result.counters == {"grants": 4, "accepted": 4}


def test_dead_actors_leases_are_granted_again_and_a_late_result_still_counts_once() -> None:
    rnd = _round(3)
    dead = rnd.grant("dead", 2, deadline=200.0)  # indices 0, 1
    assert [x.index for x in rnd.expire_actor("dead")] == [0, 1]
    assert list(rnd.pending) == [2, 0, 1] and rnd.leases == {}
    # index 2 and index 0 go to the survivor; index 1 is still pending when the dead actor's result shows up
    alive = rnd.grant("alive", 2, deadline=200.0)
    assert [x.index for x in alive] == [2, 0]
    assert rnd.deliver(1, dead[1].lease_id, _completions(), now=101.0) == "accepted"  # valid work, nobody else has it
    assert list(rnd.pending) == []
    assert rnd.deliver(0, dead[0].lease_id, _completions(), now=102.0) == "accepted"  # the old lease's result wins
    assert rnd.deliver(0, alive[1].lease_id, _completions(), now=103.0) == "duplicate"  # the re-grant is deduped
    assert rnd.deliver(2, alive[0].lease_id, _completions(), now=104.0) == "accepted"
    assert rnd.complete and rnd.counters["duplicates"] == 1 and rnd.counters["lease_expiries"] == 2


def test_lease_timeout_expires_only_due_leases() -> None:
    rnd = _round(3)
    rnd.grant("a", 1, deadline=150.0)
    rnd.grant("b", 1, deadline=250.0)
    assert [x.index for x in rnd.expire_due(now=200.0)] == [0]
    assert list(rnd.pending) == [2, 0] and list(rnd.leases) == [1]


def test_duplicate_delivery_of_the_same_lease_is_dropped() -> None:
    rnd = _round(2)
    lease = rnd.grant("a", 1, deadline=200.0)[0]
    assert rnd.deliver(0, lease.lease_id, _completions(reward=1.0), now=101.0) == "accepted"
    assert rnd.deliver(0, lease.lease_id, _completions(reward=0.0), now=102.0) == "duplicate"
    assert [c.reward for c in rnd.done[0]] == [1.0, 1.0]  # the first result is kept


@pytest.mark.parametrize(("vmin", "vmax"), [(V, V + 1), (V - 1, V), (V + 1, V + 1)])
def test_wrong_version_is_rejected_and_the_index_granted_again(vmin: int, vmax: int) -> None:
    rnd = _round(3)
    leases = rnd.grant("a", 2, deadline=200.0)
    # a weight update landed while index 1 was generating: its completions span versions
    assert rnd.deliver(1, leases[1].lease_id, _completions(vmin=vmin, vmax=vmax), now=101.0) == "stale"
    assert 1 not in rnd.done and list(rnd.pending) == [1, 2]  # first in line again
    again = rnd.grant("b", 1, deadline=200.0)[0]
    assert again.index == 1 and again.lease_id != leases[1].lease_id
    assert rnd.deliver(1, again.lease_id, _completions(), now=102.0) == "accepted"
    assert rnd.counters["wrong_version"] == 1


def test_unknown_leases_indices_and_malformed_groups() -> None:
    rnd = _round(2, n=2)
    lease = rnd.grant("a", 1, deadline=200.0)[0]
    assert rnd.deliver(0, 999, _completions(), now=101.0) == "unknown"  # a lease id this round never issued
    assert rnd.deliver(1, lease.lease_id, _completions(), now=101.0) == "unknown"  # the lease is for index 0
    assert rnd.deliver(0, lease.lease_id, _completions(n=3), now=101.0) == "unknown"  # n=3 for sampling.n=2
    assert rnd.counters["unknown"] == 3 and 0 in rnd.leases


def test_revoked_grants_go_back_to_the_front_in_order() -> None:
    rnd = _round(4)
    leases = rnd.grant("a", 3, deadline=200.0)
    rnd.revoke(leases[1:])
    assert list(rnd.pending) == [1, 2, 3] and list(rnd.leases) == [0]


def test_a_dropped_index_lets_the_round_finish_without_it() -> None:
    rnd = _round(2)
    leases = rnd.grant("a", 2, deadline=200.0)
    rnd.drop(1)  # its grant can never fit in a message
    assert rnd.deliver(0, leases[0].lease_id, _completions(), now=105.0) == "accepted"
    assert rnd.complete and rnd.counters["oversize"] == 1
    assert rnd.deliver(1, leases[1].lease_id, _completions(), now=106.0) == "duplicate"


def test_closing_early_returns_partial_results_and_stops_the_round() -> None:
    rnd = _round(3)
    leases = rnd.grant("a", 2, deadline=200.0)
    assert rnd.deliver(0, leases[0].lease_id, _completions(), now=104.0) == "accepted"
    result = rnd.close(now=130.0)
    assert not result.complete and result.finished_at is None and result.wall_s == 30.0
    assert sorted(result.completions) == [0] and result.num_prompts == 3
    assert rnd.grant("a", 5, deadline=200.0) == [] and not rnd.pending and not rnd.leases
    assert rnd.deliver(1, leases[1].lease_id, _completions(), now=131.0) == "unknown"  # late: dropped


def test_serve_only_actors_on_the_pinned_version_within_their_credit() -> None:
    rnd = _round(5)
    on_v = ActorState("on_v", b"on_v", claimed_version=V, last_seen=0.0, last_heartbeat_sent=0.0, credit=3)
    older = ActorState("older", b"older", claimed_version=V - 1, last_seen=0.0, last_heartbeat_sent=0.0, credit=8)
    newer = ActorState("newer", b"newer", claimed_version=V + 1, last_seen=0.0, last_heartbeat_sent=0.0, credit=8)
    broke = ActorState("broke", b"broke", claimed_version=V, last_seen=0.0, last_heartbeat_sent=0.0, credit=0)
    served = rnd.serve([older, on_v, newer, broke], max_per_grant=16, deadline=200.0)
    assert [(s.actor_id, [x.index for x in leases]) for s, leases in served] == [("on_v", [0, 1, 2])]
    assert (on_v.credit, on_v.granted_total) == (0, 3)
    assert (older.credit, newer.credit) == (8, 8)  # untouched: they cannot run version V
    on_v.credit = 10
    served = rnd.serve([on_v], max_per_grant=1, deadline=200.0)  # the per-message cap
    assert [x.index for x in served[0][1]] == [3]


def test_prompt_grant_is_pinned_and_marked_as_eval() -> None:
    rnd = _round(3, seed=40)
    lease = rnd.grant("a", 3, deadline=200.0)[2]
    grant = rnd.prompt_grant(lease)
    assert (grant.prompt_id, grant.lease_id, grant.min_version, grant.eval_round) == (2, lease.lease_id, V, 7)
    assert grant.is_eval and grant.sampling.seed == group_seed(40, 2, grant.sampling.n, 1)  # index 2's block
    assert unpack_array(grant.prompt_token_ids).tolist() == [2, 3, 4] and grant.extras == {"ground_truth": "2"}
    assert _round(1).prompt_grant(_round(1).grant("a", 1, 200.0)[0]).sampling.seed is None  # greedy: no seed


def test_a_round_needs_records_and_valid_ids() -> None:
    with pytest.raises(ValueError, match="at least one"):
        EvalRound(0, 0, [], GroupSampling.defaults(), now=0.0)
    with pytest.raises(ValueError, match=">= 0"):
        EvalRound(-1, 0, _round(1).records, GroupSampling.defaults(), now=0.0)
