"""Polling helpers shared by the coordinator tests (real sockets, so conditions are awaited, not assumed)."""

from __future__ import annotations

import time
from collections.abc import Callable

from async_rl.transport import RolloutClient
from async_rl.transport.protocol import PromptGrant


def wait_until(pred: Callable[[], bool], timeout_s: float = 5.0, poll: Callable[[], None] | None = None) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if poll is not None:
            poll()
        if pred():
            return True
        time.sleep(0.01)
    return pred()


def collect_grants(client: RolloutClient, want: int, loaded: int, timeout_s: float = 3.0) -> list[PromptGrant]:
    got: list[PromptGrant] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        got += client.request_work(want - len(got), loaded, timeout_s=0.05)
    return got
