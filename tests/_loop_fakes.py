"""Fakes for actor-loop tests (tests/actor, tests/rewards): grants, a scripted rollout client, an instant weight sync.

Imported as a top-level module (``from _loop_fakes import ...``): tests/ is on ``sys.path`` because the root
conftest.py lives here (pytest's default ``prepend`` import mode inserts its directory)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np

from async_rl.actor.emulated import EmulatedScorer
from async_rl.actor.loop import ActorLoop
from async_rl.transport.protocol import GroupSampling, PromptGrant, RolloutGroup, WeightSyncPlan, pack_array
from async_rl.weight_sync.membership import JoinInfo


def make_plan(candidates: tuple[str, ...] = ("a0",), *, epoch: int = 0, version: int = 1) -> WeightSyncPlan:
    """A publisher's plan inviting ``candidates`` to ``epoch`` for ``version`` (nobody listens at the port)."""
    return WeightSyncPlan(
        host="127.0.0.1", port=1, backend="gloo", timeout_s=5.0, join_timeout_s=1.0, version=version, epoch=epoch,
        candidates=candidates,
    )  # fmt: skip


def make_grant(
    prompt_id: int, min_version: int, eval_round: int = -1, sampling: GroupSampling | None = None
) -> PromptGrant:
    """A grant of prompt ``[3, 4, 5 + prompt_id]``; ``sampling`` None: two greedy completions of <= 4 tokens."""
    return PromptGrant(
        prompt_id=prompt_id,
        lease_id=prompt_id + 1,
        min_version=min_version,
        prompt_token_ids=pack_array(np.asarray([3, 4, 5 + prompt_id]), "<i4"),
        sampling=sampling or GroupSampling.defaults(n=2, temperature=0.0, max_tokens=4),
        extras={"prompt": "p", "ground_truth": "g"},
        eval_round=eval_round,
    )


class ScriptedClient:
    """The rollout client's surface the loop uses: grants a fixed list once, records sent groups, and announces a
    weight update of version ``publish`` (the publisher's plan) when ``publish_when(client)`` first holds."""

    def __init__(
        self,
        grants: list[PromptGrant],
        publish: int | None = None,
        publish_when: Callable[[ScriptedClient], bool] = lambda client: True,
    ) -> None:
        self.grants = list(grants)
        self.sent: list[RolloutGroup] = []
        self.shutdown_requested = False
        self.weight_sync: WeightSyncPlan | None = None
        self.learner_waiting: bool | None = False
        self.eval_version = -1  # no round with prompts left to grant
        self.queued_grants: tuple[PromptGrant, ...] = ()
        self.report: dict[str, float] = {}
        self._publish = publish
        self._publish_when = publish_when
        self.polls = 0

    def hello(self, loaded_version: int = 0) -> None:
        return None

    def poll(self, timeout_s: float = 0.0) -> None:
        self.polls += 1
        if self._publish is not None and self._publish_when(self):
            self.weight_sync = make_plan(version=self._publish)
            self._publish = None

    def request_work(self, max_groups: int, loaded_version: int, timeout_s: float = 0.0) -> list[PromptGrant]:
        out, self.grants = self.grants[:max_groups], self.grants[max_groups:]
        return out

    def send_group(self, group: RolloutGroup) -> None:
        self.sent.append(group)

    def wait_acked(self, timeout_s: float) -> bool:
        return True


class InstantWeightSync:
    """Joins and "receives" at once (the engine's update path still pauses, swaps the version and resumes); a held
    version is recorded in ``held`` when received and in ``loaded_held`` when loaded."""

    def __init__(self) -> None:
        self.updates: list[int] = []
        self.held: list[int] = []
        self.loaded_held: list[int] = []
        self.joins: list[JoinInfo] = []
        self.announced: list[str] = []

    async def announce(self, host: str, port: int, *, member: str, token: str, timeout_s: float) -> None:
        self.announced.append(token)

    async def join(self, info: JoinInfo) -> None:
        self.joins.append(info)

    async def update(self, version: int) -> dict[str, Any]:
        await asyncio.sleep(0.05)
        self.updates.append(version)
        return {}

    async def stage(self, version: int) -> dict[str, Any]:
        await asyncio.sleep(0.05)
        self.held.append(version)
        return {}

    async def load_staged(self, version: int) -> dict[str, Any]:
        assert self.held and self.held[-1] == version, (self.held, version)  # only the last one received is loaded
        self.loaded_held.append(version)
        return {}


def run_loop(
    engine: Any,
    client: Any,
    *,
    max_groups: int,
    max_concurrent_groups: int,
    weight_sync: Any = None,
    **kwargs: Any,
) -> ActorLoop:
    """Run an actor loop on ``engine`` and ``client`` with the emulated scorer and ``weight_sync`` (None: an instant
    one) until it has sent ``max_groups`` groups (at most 20 s); ``kwargs`` go to :class:`ActorLoop` as well."""
    loop = ActorLoop(
        actor_id="a0",
        client=client,
        engine=engine,
        scorer=EmulatedScorer(),
        weight_sync=weight_sync or InstantWeightSync(),
        max_concurrent_groups=max_concurrent_groups,
        max_concurrent_eval=kwargs.pop("max_concurrent_eval", max_concurrent_groups),
        max_groups=max_groups,
        update_mode="inflight",
        poll_interval_s=0.005,
        **kwargs,
    )
    asyncio.run(asyncio.wait_for(loop.run(), timeout=20.0))
    return loop
