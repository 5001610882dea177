"""The actor loop with a teacher (on-policy distillation): training groups carry the teacher's log-prob of every token
they sampled, validation groups are not scored, and the loop reports what the teacher did. The teacher here is a fake
(the real engine is tested end to end, tests/e2e/test_distillation_e2e.py)."""

from __future__ import annotations

import asyncio

import numpy as np
from _loop_fakes import InstantWeightSync, ScriptedClient, make_grant

from async_rl.actor.emulated import EmulatedEngine, EmulatedScorer
from async_rl.actor.loop import ActorLoop
from async_rl.actor.teacher import TeacherStats
from async_rl.transport.protocol import unpack_array


class FakeTeacher:
    """Scores token ``t`` at position ``i`` of a completion as ``-(t + i) / 100``; records each request."""

    def __init__(self) -> None:
        self.stats = TeacherStats()
        self.calls: list[tuple[list[int], list[list[int]]]] = []

    @property
    def dead(self) -> bool:
        return False

    async def score(self, prompt_ids: list[int], completions: list[list[int]]) -> list[np.ndarray]:
        self.calls.append((prompt_ids, completions))
        self.stats.requests += len(completions)
        self.stats.tokens += sum(len(prompt_ids) + len(c) for c in completions)
        return [np.asarray([-(t + i) / 100 for i, t in enumerate(c)], np.float32) for c in completions]


def _run(client: ScriptedClient, teacher: FakeTeacher, max_groups: int) -> ActorLoop:
    loop = ActorLoop(
        actor_id="a0",
        client=client,
        engine=EmulatedEngine(2000.0, response_len=4),
        scorer=EmulatedScorer(),
        weight_sync=InstantWeightSync(),
        teacher=teacher,
        max_concurrent_groups=4,
        max_concurrent_eval=4,
        max_groups=max_groups,
        update_mode="inflight",
        poll_interval_s=0.005,
    )
    asyncio.run(asyncio.wait_for(loop.run(), timeout=20.0))
    return loop


def test_training_groups_carry_the_teachers_log_prob_of_each_token_and_eval_groups_none() -> None:
    teacher = FakeTeacher()
    client = ScriptedClient([make_grant(3, min_version=0), make_grant(4, min_version=0, eval_round=0)])
    loop = _run(client, teacher, max_groups=2)
    train = next(g for g in client.sent if g.eval_round < 0)
    evaluation = next(g for g in client.sent if g.eval_round >= 0)
    assert len(teacher.calls) == 1  # the validation group was not scored
    prompt, completions = teacher.calls[0]
    assert prompt == [3, 4, 8]  # the grant's prompt tokens, as sent to the teacher
    for c, sent_tokens in zip(train.completions, completions, strict=True):
        tokens = unpack_array(c.token_ids).tolist()
        assert tokens == sent_tokens and len(tokens) == 4
        assert c.teacher_logprobs is not None
        expected = np.asarray([-(t + i) / 100 for i, t in enumerate(tokens)], np.float32)
        np.testing.assert_array_equal(unpack_array(c.teacher_logprobs), expected)
    assert all(c.teacher_logprobs is None for c in evaluation.completions)
    metrics = loop.metrics()
    assert metrics["actor/teacher/requests"] == 2.0
    assert metrics["actor/teacher/tokens"] == 2 * (3 + 4)


def test_an_episodes_observation_tokens_get_a_teacher_log_prob_of_zero() -> None:
    from async_rl.transport.protocol import make_completion

    loop = ActorLoop(
        actor_id="a0",
        client=ScriptedClient([]),
        engine=EmulatedEngine(2000.0, response_len=4),
        scorer=EmulatedScorer(),
        weight_sync=None,
        teacher=FakeTeacher(),
        max_concurrent_groups=1,
        max_concurrent_eval=1,
        update_mode="inflight",
    )
    episode = make_completion([5, 6, 7, 8], [-0.1, 0.0, 0.0, -0.2], version_min=0, loss_mask=[1, 0, 0, 1])
    (scored,) = asyncio.run(loop._teacher_scored(make_grant(0, min_version=0), [episode]))
    assert scored.teacher_logprobs is not None
    np.testing.assert_array_equal(
        unpack_array(scored.teacher_logprobs), np.asarray([-0.05, 0.0, 0.0, -0.11], np.float32)
    )
