"""Shared pytest set-up: skip `gpu`-marked tests when no CUDA device is present; arm the vLLM engines' quick exit.

This file also puts tests/ on ``sys.path`` (pytest's default ``prepend`` import mode inserts a root conftest's
directory), so helpers shared by several test directories live here as top-level modules: ``_loop_fakes`` (the
actor-loop fakes of tests/actor and tests/rewards)."""

from __future__ import annotations

import pytest

from async_rl.actor import vllm_exit

# The vLLM engines tests start skip the interpreter's teardown when they stop, as the actor's do (about 4 s a stop).
vllm_exit.arm()


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items or _cuda_available():  # import torch only when some test needs the answer
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in gpu_items:
        item.add_marker(skip_gpu)
