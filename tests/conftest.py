"""Shared pytest set-up: skip `gpu`-marked tests when no CUDA device is present; arm the vLLM engines' quick exit;
under pytest-xdist, share the cores between the workers and hand out the long tests first.

This file also puts tests/ on ``sys.path`` (pytest's default ``prepend`` import mode inserts a root conftest's
directory), so helpers shared by several test directories live here as top-level modules: ``_loop_fakes`` (the
actor-loop fakes of tests/actor and tests/rewards)."""

from __future__ import annotations

import os
import sys

import pytest

from async_rl.actor import vllm_exit

# The vLLM engines tests start skip the interpreter's teardown when they stop, as the actor's do (about 4 s a stop).
vllm_exit.arm()


def _share_cores_between_workers() -> None:
    """Under pytest-xdist with N workers, a worker's tests and every process they start use cores / N OpenMP threads
    (unless OMP_NUM_THREADS is set already). Two workers on 2 cores otherwise each ran 2-thread OpenMP loops beside
    the other's processes, and a process's threads waited at every parallel region for a thread that had lost its
    core: the demo's tiny-model SFT warm start spent 378 s in its 1,000 steps (median 0.053 s, some 1-4 s), where
    300 steps take 25 s alone, start-up included (2026-12-06)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers < 2 or "OMP_NUM_THREADS" in os.environ:
        return
    threads = max(1, len(os.sched_getaffinity(0)) // workers)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if "torch" in sys.modules:  # imported already: OMP_NUM_THREADS was read when it loaded
        sys.modules["torch"].set_num_threads(threads)


_share_cores_between_workers()


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Modules with a `slow` test first, each kept whole and in order: pytest-xdist hands out modules in this order, so
    # the long end-to-end runs overlap each other and the short tests fill in around them, instead of one long run
    # ending the suite alone.
    slow_modules = {item.nodeid.split("::")[0] for item in items if "slow" in item.keywords}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in slow_modules)
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items or _cuda_available():  # import torch only when some test needs the answer
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in gpu_items:
        item.add_marker(skip_gpu)
