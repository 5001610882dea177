"""DAPO overlong reward shaping: the penalty by hand, its application to a reward, and the actor loop sending the
shaped reward (with its components) on the wire."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from _loop_fakes import ScriptedClient, make_grant

from async_rl.actor.engine import EngineOutput, EngineStats
from async_rl.actor.loop import ActorLoop
from async_rl.config import load_config
from async_rl.rewards import OverlongShaping, RewardResult, overlong_penalty
from async_rl.runtime.actor_main import reward_shaping
from async_rl.transport.protocol import GroupSampling, RolloutGroup


@pytest.mark.parametrize(
    ("length", "expected"),
    [
        # max_resp_len 16, buffer 4: the zone starts after 16 - 4 = 12 tokens; penalty -(length - 12) / 4 * factor
        (1, 0.0),
        (12, 0.0),  # exactly at the start of the zone: exceed 0
        (13, -0.25),  # exceed 1: -1/4
        (14, -0.5),
        (16, -1.0),  # at max_resp_len: the full factor
        (18, -1.5),  # past max_resp_len (verl does not cap it)
    ],
)
def test_overlong_penalty_by_hand(length: int, expected: float) -> None:
    assert overlong_penalty(length, max_resp_len=16, buffer_len=4, factor=1.0) == pytest.approx(expected)


def test_overlong_penalty_scales_with_the_factor_and_a_full_buffer() -> None:
    assert overlong_penalty(15, 16, 4, 0.5) == pytest.approx(-0.375)  # exceed 3: -3/4 * 0.5
    assert overlong_penalty(8, 8, 8, 2.0) == pytest.approx(-2.0)  # buffer = whole length: expected 0, exceed 8
    assert overlong_penalty(2, 8, 8, 2.0) == pytest.approx(-0.5)  # exceed 2: -2/8 * 2
    assert overlong_penalty(3, 8, 8, 0.0) == 0.0  # factor 0: never penalised
    assert str(overlong_penalty(0, 8, 2, 1.0)) == "0.0"  # no -0.0


def test_overlong_penalty_rejects_a_bad_zone() -> None:
    with pytest.raises(ValueError, match="buffer length must be > 0"):
        overlong_penalty(3, 8, 0, 1.0)
    with pytest.raises(ValueError, match="max_resp_len"):
        overlong_penalty(3, 4, 8, 1.0)
    with pytest.raises(ValueError, match="buffer length"):
        OverlongShaping(max_resp_len=8, buffer_len=0)


def test_apply_adds_the_penalty_and_records_components() -> None:
    shaping = OverlongShaping(max_resp_len=8, buffer_len=4, penalty_factor=1.0)
    base = RewardResult(score=1.0, components={"digits": 0.5})
    shaped = shaping.apply(base, length=6)  # exceed 2 of 4: -0.5
    assert shaped.score == pytest.approx(0.5)
    # acc keeps the unshaped score (filter_groups.metric=acc filters on correctness, as verl's dapo manager)
    assert shaped.components == {"acc": 1.0, "digits": 0.5, "overlong_reward": -0.5}
    assert base.components == {"digits": 0.5}  # the input is not modified
    own = shaping.apply(RewardResult(score=1.0, components={"acc": 0.0}), length=6)
    assert own.components["acc"] == 0.0  # a function's own acc wins
    inside = shaping.apply(base, length=4)
    assert inside.score == 1.0 and inside.components["overlong_reward"] == 0.0

    logged = OverlongShaping(max_resp_len=8, buffer_len=4, log=True)
    assert logged.apply(base, 6).components["overlong"] == 1.0
    assert logged.apply(base, 4).components["overlong"] == 0.0
    # a scoring failure (score 0, error kept) is shaped too: the length penalty does not depend on the function
    failed = logged.apply(RewardResult(score=0.0, error="timeout"), 8)
    assert (failed.score, failed.error) == (pytest.approx(-1.0), "timeout")


# ---------------------------------------------------------------------------------------------- the actor loop
class _LengthsEngine:
    """Returns one completion per entry of ``lengths`` (finish reason 'length' at max_tokens, else 'stop')."""

    def __init__(self, lengths: list[int]) -> None:
        self.lengths = lengths
        self.version = 0
        self.stats = EngineStats()
        self.dead = False

    async def generate(self, prompt_token_ids: list[int], sampling: GroupSampling) -> list[EngineOutput]:
        return [
            EngineOutput(
                token_ids=np.arange(1, n + 1, dtype=np.int32),
                logprobs=np.full(n, -0.5, dtype=np.float32),
                finish_reason="length" if n >= sampling.max_tokens else "stop",
                min_version=0,
                max_version=0,
                text="x" * n,
            )
            for n in self.lengths
        ]

    async def update_weights(self, new_version: int, load: Any, mode: str) -> None:
        raise AssertionError("no weight updates in this test")


class _ConstantScorer:
    def score(self, prompt: str, completion: str, ground_truth: str, extra: dict[str, Any] | None = None) -> Any:
        return RewardResult(score=1.0, components={"digits": 0.25})


def _run_loop(lengths: list[int], shaping: OverlongShaping | None) -> RolloutGroup:
    sampling = GroupSampling.defaults(n=len(lengths), temperature=1.0, max_tokens=8)
    client = ScriptedClient([make_grant(0, min_version=0, sampling=sampling)])
    loop = ActorLoop(
        actor_id="a0",
        client=client,
        engine=_LengthsEngine(lengths),
        scorer=_ConstantScorer(),
        weight_sync=None,
        reward_shaping=shaping,
        max_concurrent_groups=1,
        max_concurrent_eval=1,
        max_groups=1,
        update_mode="inflight",
        poll_interval_s=0.001,
    )
    asyncio.run(asyncio.wait_for(loop.run(), timeout=10.0))
    assert len(client.sent) == 1
    return client.sent[0]


def test_the_actor_sends_the_shaped_reward_and_its_components() -> None:
    # max_resp_len 8, buffer 4, factor 0.5: lengths 3, 4 are free; 6 -> -(2/4)*0.5 = -0.25; 8 -> -0.5
    group = _run_loop([3, 4, 6, 8], OverlongShaping(max_resp_len=8, buffer_len=4, penalty_factor=0.5, log=True))
    rewards = [c.reward for c in group.completions]
    assert rewards == pytest.approx([1.0, 1.0, 0.75, 0.5])
    comps = [c.reward_components or {} for c in group.completions]
    assert [c["overlong_reward"] for c in comps] == pytest.approx([0.0, 0.0, -0.25, -0.5])
    assert [c["overlong"] for c in comps] == [0.0, 0.0, 1.0, 1.0]
    assert all(c["digits"] == 0.25 for c in comps)  # the function's own components are kept
    assert [c.finish_reason for c in group.completions] == ["stop", "stop", "stop", "length"]


def test_without_shaping_the_reward_is_the_functions() -> None:
    group = _run_loop([3, 8], None)
    assert [c.reward for c in group.completions] == [1.0, 1.0]
    assert [c.reward_components for c in group.completions] == [{"digits": 0.25}, {"digits": 0.25}]


def test_the_actor_reads_the_shaping_from_the_config() -> None:
    assert reward_shaping(load_config(None, [])) is None  # off by default
    on = ["reward.reward_kwargs.overlong_buffer_cfg.enable=true", "reward.reward_kwargs.overlong_buffer_cfg.len=4"]
    shaping = reward_shaping(load_config(None, on))
    # max_resp_len null = data.max_response_length (8 in the defaults)
    assert shaping == OverlongShaping(max_resp_len=8, buffer_len=4, penalty_factor=1.0, log=False)
    legacy = [
        "data.max_response_length=32",
        "reward_model.overlong_buffer.enable=true",
        "reward_model.overlong_buffer.len=8",
        "reward_model.overlong_buffer.penalty_factor=0.5",
        "reward_model.overlong_buffer.log=true",
    ]
    assert reward_shaping(load_config(None, legacy)) == OverlongShaping(32, 8, 0.5, True)
    transitional = [
        "reward_model.reward_kwargs.overlong_buffer_cfg.enable=true",
        "reward_model.reward_kwargs.overlong_buffer_cfg.len=2",
        "reward_model.reward_kwargs.max_resp_len=6",
    ]
    assert reward_shaping(load_config(None, transitional)) == OverlongShaping(6, 2, 1.0, False)
