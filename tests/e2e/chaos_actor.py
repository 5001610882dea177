"""Faulty actors for the chaos test (tests/e2e/test_chaos_e2e.py), each a real process on the real rollout plane.

    python tests/e2e/chaos_actor.py MODE CONFIG COORDINATOR ACTOR_ID [OVERRIDE ...]

Modes:
* ``silent``: says hello, then nothing (no polls, no heartbeats, no weight-sync announcement) until killed;
* ``bad``: an emulated actor (it receives weights like any actor, so it is granted work) whose groups no learner
  can train: a token id past the vocabulary, or one completion too few; the coordinator quarantines it;
* ``dies-in-update``: an emulated actor (real loop, client and weight-sync receiver) that SIGKILLs itself while it
  receives its second weight update, between two buckets.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

from async_rl.actor.emulated import EmulatedEngine, EmulatedScorer, ReceiveOnlyWeightSync
from async_rl.actor.engine import EngineOutput
from async_rl.actor.loop import ActorLoop
from async_rl.config import load_config
from async_rl.config.resolve import max_concurrent_eval
from async_rl.transport import RolloutClient
from async_rl.transport.protocol import GroupSampling
from async_rl.weight_sync import WeightReceiver

OUT_OF_VOCAB = 1_000_000


def silent(client: RolloutClient) -> None:
    client.hello(timeout_s=300.0)
    print("silent: hello sent", flush=True)
    time.sleep(3600)


class _BadEngine(EmulatedEngine):
    """Generates like an emulated actor, then breaks each group: a token id past the vocabulary, or, every third
    group, one completion too few (a tokenizer/model mismatch, or a bug in a custom rollout)."""

    groups = 0

    async def generate(self, prompt_token_ids: Sequence[int], sampling: GroupSampling) -> list[EngineOutput]:
        completions = await super().generate(prompt_token_ids, sampling)
        self.groups += 1
        if self.groups % 3 == 2:
            print(f"bad: group {self.groups} with one completion too few", flush=True)
            return completions[:-1]
        tokens = completions[0].token_ids.copy()
        tokens[-1] = OUT_OF_VOCAB
        print(f"bad: group {self.groups} with token id {OUT_OF_VOCAB}", flush=True)
        return [dataclasses.replace(completions[0], token_ids=tokens), *completions[1:]]


class _DiesInUpdate(ReceiveOnlyWeightSync):
    async def update(self, version: int) -> dict[str, Any]:
        if self.updates == 1 and self.group is not None:
            group = self.group

            def load(batch: list[Any]) -> None:
                print(f"dies-in-update: killing myself inside the update to version {version}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

            await asyncio.to_thread(WeightReceiver(group).receive, load, expect_version=version)
        return await super().update(version)


async def emulated(client: RolloutClient, cfg: Any, engine: EmulatedEngine, sync: ReceiveOnlyWeightSync) -> None:
    """The real actor loop, client and weight-sync receiver around an emulated engine (no vLLM)."""
    client.hello(timeout_s=300.0)
    loop = ActorLoop(
        actor_id=client.actor_id,
        client=client,
        engine=engine,
        scorer=EmulatedScorer(),
        weight_sync=sync,
        max_concurrent_groups=cfg.async_training.actor.max_concurrent_groups,
        max_concurrent_eval=max_concurrent_eval(cfg),
        update_mode=cfg.async_training.update_mode,
    )
    await loop.run()


def main() -> None:
    mode, config, coordinator, actor_id, *overrides = sys.argv[1:]
    cfg = load_config(config, overrides)
    go = os.environ.get("CHAOS_GO")  # start the fault only when the test says so (imports are done by then)
    while go and not os.path.exists(go):
        time.sleep(0.05)
    client = RolloutClient(coordinator, actor_id, cfg.async_training.transport)
    try:
        if mode == "silent":
            silent(client)
        elif mode == "bad":
            asyncio.run(emulated(client, cfg, _BadEngine(2000.0, response_len=4), ReceiveOnlyWeightSync()))
        elif mode == "dies-in-update":
            asyncio.run(emulated(client, cfg, EmulatedEngine(2000.0, response_len=4), _DiesInUpdate()))
        else:
            raise SystemExit(f"unknown mode {mode!r}")
    finally:
        client.close(linger_s=0.0)


if __name__ == "__main__":
    main()
