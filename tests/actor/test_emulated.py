"""The emulated actor's pieces: the pacing model as pure math (hand values), the engine's timing, versions and
aborts on the real clock, the scorer, and the receive-only weight sync against a real sender over gloo."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import numpy as np
import pytest
import torch

from async_rl.actor.emulated import EmulatedEngine, EmulatedScorer, ReceiveOnlyWeightSync, TokenRatePacer
from async_rl.transport.protocol import GroupSampling, WeightSyncPlan
from async_rl.weight_sync import WeightSender, WeightSyncError, create_store, open_group
from async_rl.weight_sync.membership import JoinInfo

# ---------------------------------------------------------------------------------------------------- pacing math


def test_fifo_finish_times_by_hand() -> None:
    pacer = TokenRatePacer(100.0)  # 100 tokens/s
    a = pacer.submit(0.0, 50)  # idle server: 0 + 50/100 = 0.5
    b = pacer.submit(0.1, 100)  # queued behind a: max(0.1, 0.5) + 1.0 = 1.5
    c = pacer.submit(3.0, 10)  # idle again: 3.0 + 0.1 = 3.1
    assert pacer.finish_time(a) == pytest.approx(0.5)
    assert pacer.finish_time(b) == pytest.approx(1.5)
    assert pacer.finish_time(c) == pytest.approx(3.1)


def test_capacity_is_rate_over_group_cost() -> None:
    # n=4 completions x 16 tokens = 64 tokens per group at 640 tokens/s: 10 groups/s, so 10 groups end at 1.0 s.
    pacer = TokenRatePacer(640.0)
    tickets = [pacer.submit(0.0, 4 * 16) for _ in range(10)]
    assert [pacer.finish_time(t) for t in tickets] == pytest.approx([0.1 * (i + 1) for i in range(10)])


def test_pause_shifts_only_unfinished_work_by_its_length() -> None:
    pacer = TokenRatePacer(100.0)
    done = pacer.submit(0.0, 50)  # ends 0.5, before the pause
    running = pacer.submit(0.0, 100)  # ends 1.5, running when the pause begins at 1.0
    pacer.pause(1.0)
    late = pacer.submit(1.2, 20)  # submitted during the pause: queued behind `running`: 1.5 + 0.2 = 1.7
    pacer.resume(1.4)  # a 0.4 s pause
    assert pacer.finish_time(done) == pytest.approx(0.5)
    assert pacer.finish_time(running) == pytest.approx(1.9)
    assert pacer.finish_time(late) == pytest.approx(2.1)
    assert pacer.busy_until == pytest.approx(2.1)
    assert pacer.paused_s == pytest.approx(0.4)


def test_work_submitted_to_an_idle_paused_server_starts_at_resume() -> None:
    pacer = TokenRatePacer(10.0)
    pacer.pause(5.0)
    t = pacer.submit(6.0, 10)  # 1 s of work; nothing runs until the resume at 7.0
    pacer.resume(7.0)
    assert pacer.finish_time(t) == pytest.approx(8.0)
    pacer.resume(9.0)  # not paused: no effect
    assert pacer.finish_time(t) == pytest.approx(8.0)


def test_pacer_rejects_bad_rates() -> None:
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="tokens_per_s"):
            TokenRatePacer(bad)


# ---------------------------------------------------------------------------------------------------- the engine


def test_generate_takes_cost_over_rate_and_returns_valid_completions() -> None:
    engine = EmulatedEngine(400.0, response_len=5)
    prompt = [11, 12, 13, 14]
    sampling = GroupSampling.defaults(n=4, max_tokens=99, seed=3)  # response_len overrides max_tokens

    async def run() -> tuple[list[Any], float]:
        t0 = time.monotonic()
        out = await engine.generate(prompt, sampling)
        return out, time.monotonic() - t0

    completions, seconds = asyncio.run(run())
    assert 0.05 - 0.005 <= seconds < 0.05 + 0.1  # 4 x 5 tokens at 400 tokens/s = 0.05 s
    assert len(completions) == 4
    for c in completions:
        assert c.token_ids.dtype == np.int32 and len(c.token_ids) == 5
        assert set(c.token_ids.tolist()) <= set(prompt)  # ids the model's vocabulary has
        assert c.logprobs.tolist() == [-1.0] * 5
        assert (c.min_version, c.max_version, c.finish_reason) == (0, 0, "length")
    assert engine.stats.generated_tokens == 20 and engine.stats.requests == 1
    again = asyncio.run(EmulatedEngine(1e9, response_len=5).generate(prompt, sampling))
    assert [c.token_ids.tolist() for c in again] == [c.token_ids.tolist() for c in completions]  # seeded


def test_inflight_update_pauses_the_group_and_spans_versions() -> None:
    engine = EmulatedEngine(100.0)  # max_tokens 10, n 1: 0.1 s of work

    async def load() -> None:
        await asyncio.sleep(0.2)  # the weight transfer

    async def run() -> tuple[list[Any], float]:
        t0 = time.monotonic()
        task = asyncio.ensure_future(engine.generate([5, 6], GroupSampling.defaults(n=1, max_tokens=10)))
        await asyncio.sleep(0.03)
        await engine.update_weights(1, load, "inflight")
        out = await task
        return out, time.monotonic() - t0

    completions, seconds = asyncio.run(run())
    assert seconds >= 0.3 - 0.005  # 0.1 s of work + the 0.2 s pause
    assert (completions[0].min_version, completions[0].max_version) == (0, 1)
    assert engine.version == 1 and engine.stats.updates == 1
    assert engine.pacer.paused_s == pytest.approx(0.2, abs=0.05)


def test_drain_update_waits_for_running_groups() -> None:
    engine = EmulatedEngine(100.0)
    loaded_at: list[float] = []

    async def load() -> None:
        loaded_at.append(time.monotonic())

    async def run() -> list[Any]:
        t0 = time.monotonic()
        task = asyncio.ensure_future(engine.generate([5], GroupSampling.defaults(n=1, max_tokens=10)))
        await asyncio.sleep(0.01)
        await engine.update_weights(1, load, "drain")
        assert loaded_at[0] - t0 >= 0.1 - 0.005  # only after the group's 0.1 s
        return await task

    completions = asyncio.run(run())
    assert (completions[0].min_version, completions[0].max_version) == (0, 0)


def test_a_failed_update_aborts_running_groups_and_stays_paused_until_one_succeeds() -> None:
    engine = EmulatedEngine(10.0)  # 1 s per group: must be cut short

    async def broken_load() -> None:
        raise RuntimeError("the transfer broke half-way")

    async def load() -> None:
        pass

    async def run() -> tuple[list[Any], list[Any]]:
        task = asyncio.ensure_future(engine.generate([5], GroupSampling.defaults(n=2, max_tokens=5)))
        await asyncio.sleep(0.02)
        with pytest.raises(RuntimeError, match="half-way"):
            await engine.update_weights(1, broken_load, "inflight")
        aborted = await asyncio.wait_for(task, timeout=0.5)
        assert engine.pacer.paused and engine.version == 0  # the half-loaded weights are never sampled from
        late = asyncio.ensure_future(engine.generate([5], GroupSampling.defaults(n=1, max_tokens=1)))  # 0.1 s of work
        await asyncio.sleep(0.2)
        assert not late.done()  # still paused
        await engine.update_weights(1, load, "drain")  # nothing runs: drain does not wait; it resumes
        return aborted, await asyncio.wait_for(late, timeout=1.0)

    aborted, late = asyncio.run(run())
    assert [c.finish_reason for c in aborted] == ["abort", "abort"]
    assert [(c.finish_reason, c.min_version, c.max_version) for c in late] == [("length", 0, 1)]
    assert engine.stats.generated_tokens == 1 and engine.version == 1 and engine.stats.updates == 1


def test_scorer_is_deterministic_and_in_unit_interval() -> None:
    scorer = EmulatedScorer()
    scores = [scorer.score("1+2=", f"{i} {i}", "3").score for i in range(200)]
    assert scores == [scorer.score("1+2=", f"{i} {i}", "3").score for i in range(200)]
    assert all(0.0 <= s < 1.0 for s in scores)
    assert 0.3 < float(np.mean(scores)) < 0.7 and len(set(scores)) == 200


# ---------------------------------------------------------------------------------------------------- weight sync


def _weights() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {"embed.weight": torch.randn(64, 32, generator=gen), "norm.weight": torch.randn(32, generator=gen)}


def _actor_side(
    sync: ReceiveOnlyWeightSync, port: int, version: int, box: dict[str, Any], timeout_s: float
) -> threading.Thread:
    async def actor() -> dict[str, Any]:
        plan = WeightSyncPlan(
            host="127.0.0.1", port=port, backend="gloo", timeout_s=timeout_s, join_timeout_s=timeout_s, version=-1,
            epoch=0, candidates=(),
        )  # fmt: skip
        await sync.join(JoinInfo(plan=plan, world_size=2, rank_offset=1))
        return await sync.update(version)

    def run() -> None:
        try:
            box["value"] = asyncio.run(actor())
        except BaseException as exc:  # handed to the test thread
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("expect", [3, 4])
def test_receive_only_weight_sync_verifies_what_a_real_sender_sends(expect: int) -> None:
    timeout_s = 30.0 if expect == 3 else 2.0  # the refusing receiver leaves the sender waiting until its timeout
    store = create_store("127.0.0.1", 0, is_master=True, timeout_s=timeout_s)
    sync = ReceiveOnlyWeightSync()
    box: dict[str, Any] = {}
    thread = _actor_side(sync, store.port, expect, box, timeout_s)
    root = open_group("127.0.0.1", store.port, rank=0, world_size=2, backend="gloo", timeout_s=timeout_s, store=store)
    try:
        sent = WeightSender(root, bucket_size_mb=1.0).send(iter(_weights().items()), version=3)
    except WeightSyncError:
        sent = None  # the receiver gave up on the wrong version and left the collective sequence
    thread.join(timeout=30)
    root.close()
    sync.close()
    if expect == 3:
        assert "error" not in box, box.get("error")
        report = box["value"]
        assert sent is not None
        assert (report["version"], report["tensors"], report["fingerprint"]) == (3, 2, sent.fingerprint)
        assert sync.updates == 1
    else:  # the learner sent v3 while the actor expected v4: refused, never counted as loaded
        assert isinstance(box.get("error"), WeightSyncError)
        assert sync.updates == 0
