"""How a CPU engine's core process starts (``async_rl.actor.vllm_launch``): forked from a process that keeps torch
on one thread, spawned otherwise, with the same cores, threads and samples either way. Each start runs in a process of
its own (``_engine_start.py``): whether a fork is safe depends on what that process computed before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from async_rl.actor import vllm_launch
from async_rl.models.tiny import build_tiny_model

WORKER = Path(__file__).resolve().parent / "_engine_start.py"


def _start(model: Path, out: Path, **env: str) -> dict:
    environ = {**os.environ, **env}
    environ.pop("VLLM_WORKER_MULTIPROC_METHOD", None)
    subprocess.run([sys.executable, str(WORKER), str(model), str(out)], env=environ, check=True, timeout=240)
    return json.loads(out.read_text())


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores for a 2-thread engine")
def test_a_single_threaded_process_forks_its_engine_core_onto_the_cores_a_spawned_one_gets(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "model", seed=3)
    cores = sorted(os.sched_getaffinity(0))[:2]
    bind = {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cores))}
    forked = _start(model, tmp_path / "fork.json", ASYNC_RL_TEST_SINGLE_THREADED="1", **bind)
    spawned = _start(model, tmp_path / "spawn.json", **bind)
    assert forked["tokens"] == spawned["tokens"]  # seeded samples: the same engine either way
    assert [len(g) for g in forked["tokens"]] == [4, 4, 4, 4]
    # the forked core runs on the bound cores (set at the fork), on as many threads as the spawned one; a spawned
    # core's main thread is pinned to the first bound core by GNU OpenMP (GOMP_CPU_AFFINITY, read when it loads)
    assert forked["core_cores"] == cores and spawned["core_cores"] == cores[:1]
    assert forked["core_threads"] == spawned["core_threads"] == 2
    # the parent keeps its one thread and its own cores
    assert forked["threads"] == 1 and forked["cores"] == sorted(os.sched_getaffinity(0))


def test_only_a_declared_single_threaded_process_may_fork(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(vllm_launch, "_fork_ok", False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert not vllm_launch.may_fork()  # undeclared: a thread pool may exist
    monkeypatch.setattr(vllm_launch, "_fork_ok", True)
    assert vllm_launch.may_fork()
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert not vllm_launch.may_fork()  # declared, then raised: not safe any more
