"""The quick exit of the actor's vLLM child processes (``async_rl.actor.vllm_exit``), in real spawned children: the
teardown is skipped, the logs are flushed and the exit code is the one the child was leaving with."""

from __future__ import annotations

import atexit
import logging
import logging.handlers
import multiprocessing
import os
import sys
from pathlib import Path

import pytest

from async_rl.actor import vllm_exit


def _child(workdir: str, how: str) -> None:
    """Stands for a vLLM child: an exit handler registered at import (before the plugin, so it would run after it),
    a log record buffered until logging shuts down, then the plugin, then the way out ``how``."""
    atexit.register(lambda: Path(workdir, "teardown_ran").write_text("yes"))
    buffered = logging.handlers.MemoryHandler(capacity=1000, target=logging.FileHandler(Path(workdir, "child.log")))
    logging.getLogger("child").addHandler(buffered)
    logging.getLogger("child").warning("last words")
    vllm_exit.register()
    if how == "exit3":
        sys.exit(3)
    if how == "raise":
        raise RuntimeError("child failed")


@pytest.mark.parametrize(
    ("armed", "how", "code"), [("1", "return", 0), ("1", "exit3", 3), ("1", "raise", 1), ("0", "return", 0)]
)
def test_a_child_skips_its_teardown_with_its_own_exit_code_and_its_logs_written(
    tmp_path, monkeypatch, armed, how, code
):
    monkeypatch.setenv(vllm_exit.ENV, armed)
    child = multiprocessing.get_context("spawn").Process(target=_child, args=(str(tmp_path), how))
    child.start()
    child.join(60)
    assert child.exitcode == code
    assert (tmp_path / "child.log").read_text() == "last words\n"
    assert (tmp_path / "teardown_ran").exists() == (armed != "1")


def test_the_process_that_starts_the_engine_is_left_alone(monkeypatch):
    monkeypatch.setenv(vllm_exit.ENV, "1")
    monkeypatch.setattr(vllm_exit, "_registered", False)
    vllm_exit.register()  # pytest's own process: no multiprocessing parent
    assert not vllm_exit._registered and sys.exit is vllm_exit._real_sys_exit


def test_exit_status_is_what_the_interpreter_would_give():
    assert [vllm_exit.exit_status(c) for c in (None, 0, 3, "a message")] == [0, 0, 3, 1]


def test_arm_sets_the_variable_children_inherit(monkeypatch):
    monkeypatch.delenv(vllm_exit.ENV, raising=False)
    vllm_exit.arm()
    assert os.environ[vllm_exit.ENV] == "1"
