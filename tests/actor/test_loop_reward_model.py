"""The actor loop with a learned reward model: scores combined into the reward, a server that does not answer waited
out and tried again, an untrusted answer refusing the group (never sent with a guessed score)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from _loop_fakes import InstantWeightSync, ScriptedClient, make_grant

from async_rl.actor.emulated import EmulatedEngine, EmulatedScorer
from async_rl.actor.loop import ActorLoop
from async_rl.rewards.model_client import RewardModelStats, RewardModelUnavailable, RewardWeights
from async_rl.rewards.model_score import UntrustedScore


class _ScriptedModel:
    """Answers ``len(response) / 10`` per completion, after raising the scripted exceptions one call each."""

    def __init__(self, failures: Sequence[Exception] = (), max_batch_sequences: int = 64) -> None:
        self.failures = list(failures)
        self.stats = RewardModelStats()
        self.max_batch_sequences = max_batch_sequences
        self.calls: list[tuple[list[int], list[list[int]]]] = []
        self.batches: list[int] = []  # groups per score_groups call

    def score_groups(self, items):  # type: ignore[no-untyped-def]
        self.batches.append(len(items))
        out: list = []
        for prompt_ids, response_ids in items:
            self.calls.append((list(prompt_ids), [list(r) for r in response_ids]))
            if self.failures:
                out.append(self.failures.pop(0))
                continue
            self.stats.requests += 1
            out.append([len(r) / 10 for r in response_ids])
        return out

    def close(self) -> None:
        pass


def _run(
    model: _ScriptedModel, grants: int, *, give_up_s: float = 60.0, concurrent: int = 2
) -> tuple[ActorLoop, ScriptedClient]:
    client = ScriptedClient([make_grant(i, 0) for i in range(grants)])
    loop = ActorLoop(
        actor_id="a0",
        client=client,
        engine=EmulatedEngine(5000.0, response_len=4),
        scorer=EmulatedScorer(),
        weight_sync=InstantWeightSync(),
        reward_model=model,
        reward_weights=RewardWeights(model=2.0, rule=0.5),
        give_up_s=give_up_s,
        max_concurrent_groups=concurrent,
        max_concurrent_eval=concurrent,
        max_groups=grants,
        update_mode="inflight",
        poll_interval_s=0.005,
    )

    async def main() -> None:
        task = asyncio.ensure_future(loop.run())
        s = loop.stats
        for _ in range(1000):  # at most ~10 s: until every grant was sent, refused or given up
            if task.done() or len(client.sent) + s.reward_model_refused + s.reward_model_given_up >= grants:
                break
            await asyncio.sleep(0.01)
        loop._stop = True
        await task

    asyncio.run(main())
    return loop, client


def test_the_models_score_is_combined_with_the_rule_score_as_components() -> None:
    model = _ScriptedModel()
    loop, client = _run(model, 2)
    assert len(client.sent) == 2 and len(model.calls) == 2
    for group in client.sent:
        for c in group.completions:
            components = c.reward_components or {}
            assert components["reward_model"] == pytest.approx(c.token_ids.length / 10)
            assert c.reward == pytest.approx(0.5 * components["rule"] + 2.0 * components["reward_model"])
    prompt, responses = model.calls[0]
    assert prompt[:2] == [3, 4] and [len(r) for r in responses] == [4, 4]  # the grant's prompt ids, 2 completions
    report = client.report
    assert report["reward_model_requests"] == 2.0 and report["reward_model_refused"] == 0.0


def test_a_server_that_does_not_answer_is_waited_out_and_the_group_is_scored_later() -> None:
    model = _ScriptedModel([RewardModelUnavailable("no reply"), RewardModelUnavailable("no reply")])
    loop, client = _run(model, 1)
    assert len(client.sent) == 1  # scored after two back-offs (1 s, 2 s), nothing lost
    assert loop.stats.reward_model_deferred == 2 and loop.stats.reward_model_given_up == 0
    assert len(model.calls) == 3


def test_a_group_is_given_up_once_waiting_would_pass_give_up_s() -> None:
    model = _ScriptedModel([RewardModelUnavailable("no reply")] * 5)
    loop, client = _run(model, 1, give_up_s=0.5)
    assert client.sent == []  # its lease expires and the coordinator grants the prompt again
    assert loop.stats.reward_model_given_up == 1 and loop.stats.reward_model_deferred == 0


def test_an_untrusted_answer_refuses_the_group_at_once() -> None:
    model = _ScriptedModel([UntrustedScore("non-finite scores for completions [1]")])
    loop, client = _run(model, 2)
    assert len(client.sent) == 1  # the other group goes through
    assert loop.stats.reward_model_refused == 1 and len(model.calls) == 2
    assert client.report["reward_model_refused"] == 1.0


class _SlowModel(_ScriptedModel):
    """Takes 50 ms a call: groups that finish meanwhile wait for the next batch."""

    def score_groups(self, items):  # type: ignore[no-untyped-def]
        import time

        time.sleep(0.05)
        return super().score_groups(items)


def test_groups_that_finish_together_are_scored_in_one_batch_up_to_the_cap() -> None:
    model = _SlowModel()
    loop, client = _run(model, 16, concurrent=16)
    assert len(client.sent) == 16 and len(model.calls) == 16  # every group scored once
    assert sum(model.batches) == 16 and max(model.batches) > 1 and len(model.batches) < 16
    assert max(model.batches) <= 32  # 64 completions / 2 per group
    capped = _SlowModel(max_batch_sequences=5)  # two groups of 2 completions fit, a third would not
    loop, client = _run(capped, 16, concurrent=16)
    assert len(client.sent) == 16 and max(capped.batches) == 2


def test_a_reward_model_needs_its_weights_and_deadline() -> None:
    with pytest.raises(ValueError, match="reward_weights and give_up_s"):
        ActorLoop(
            actor_id="a0",
            client=ScriptedClient([]),
            engine=EmulatedEngine(5000.0, response_len=4),
            scorer=EmulatedScorer(),
            weight_sync=None,
            reward_model=_ScriptedModel(),
            max_concurrent_groups=1,
            max_concurrent_eval=1,
            update_mode="inflight",
        )
