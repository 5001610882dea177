"""Fixtures for the transport tests: prompt records, coordinators/clients that always close, fake actor processes
that are always killed (by PID), and a helper that answers a grant with a well-formed group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _plane_config import coordinator, plane_config

from async_rl.config import Config
from async_rl.transport import Coordinator, PromptRecord, RolloutClient, make_completion, unpack_array
from async_rl.transport.protocol import PromptGrant, RolloutGroup

REPO_ROOT = Path(__file__).resolve().parents[2]
FAKE_ACTOR = Path(__file__).with_name("fake_actor.py")


def fast(**overrides: Any) -> Config:
    """A test config with quick liveness: heartbeats every 0.1 s, a peer is dead after 1 s of silence."""
    return plane_config(heartbeat_interval_s=0.1, peer_timeout_s=1.0, **overrides)


def records(n: int, length: int = 4) -> list[PromptRecord]:
    """Prompt i has tokens [i, i+1, ..., i+length-1] and ground truth str(i)."""
    return [PromptRecord(np.arange(i, i + length, dtype=np.int32), {"ground_truth": str(i)}) for i in range(n)]


@pytest.fixture
def make_records() -> Callable[..., list[PromptRecord]]:
    return records


@pytest.fixture
def coordinator_factory() -> Iterator[Callable[..., Coordinator]]:
    made: list[Coordinator] = []

    def make(n_records: int = 16, cfg: Config | None = None, **kwargs: Any) -> Coordinator:
        recs = kwargs.pop("records", None) or records(n_records)
        kwargs.setdefault("seed", 0)  # per-sample seeds from seed 0
        kwargs.setdefault("trust_claimed_versions", True)  # no weight sync here: clients' versions are their claims
        coord = coordinator(recs, cfg or fast(), **kwargs)
        made.append(coord)
        return coord

    yield make
    for coord in made:
        coord.close()


@pytest.fixture
def client_factory() -> Iterator[Callable[..., RolloutClient]]:
    made: list[RolloutClient] = []

    def make(address: str, actor_id: str = "actor-0", cfg: Config | None = None, **kw: Any) -> RolloutClient:
        client = RolloutClient(address, actor_id, (cfg or fast()).async_training.transport, **kw)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close(linger_s=0.0)


def answer(grant: PromptGrant, actor_id: str, version: int, version_max: int | None = None) -> RolloutGroup:
    """A group for ``grant``: completion i = reversed prompt tokens + [i]; log-prob -0.5 per token."""
    prompt = unpack_array(grant.prompt_token_ids)
    completions = []
    for i in range(grant.sampling.n):
        tokens = np.concatenate([prompt[::-1], np.array([i], dtype=prompt.dtype)])
        lps = np.full(len(tokens), -0.5, dtype=np.float32)
        completions.append(make_completion(tokens, lps, version_min=version, version_max=version_max))
    return RolloutGroup(prompt_id=grant.prompt_id, lease_id=grant.lease_id, actor_id=actor_id, completions=completions)


@pytest.fixture
def make_group() -> Callable[..., RolloutGroup]:
    return answer


class ActorProcesses:
    """Starts fake_actor.py subprocesses and guarantees they are gone afterwards (SIGCONT + SIGKILL by PID)."""

    def __init__(self) -> None:
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def spawn(self, address: str, actor_id: str, **options: float | int) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, str(FAKE_ACTOR), "--address", address, "--actor-id", actor_id]
        for key, value in options.items():
            cmd += [f"--{key.replace('_', '-')}", str(value)]
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env)
        self.procs[actor_id] = proc
        return proc

    def signal(self, actor_id: str, sig: signal.Signals) -> None:
        os.kill(self.procs[actor_id].pid, sig)

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGCONT)
                    os.kill(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait(timeout=10)
        self.procs.clear()

    def wait_all(self, timeout_s: float) -> None:
        """Give actors a chance to exit on their own (after Shutdown), then kill the rest."""
        for proc in self.procs.values():
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
        self.kill_all()


@pytest.fixture
def actor_procs() -> Iterator[ActorProcesses]:
    procs = ActorProcesses()
    try:
        yield procs
    finally:
        procs.kill_all()
