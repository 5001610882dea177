"""Shared checks for the end-to-end tests: the ledger identity, that no process a test started outlives it, and that
every metrics.jsonl a test wrote names only catalogued metrics and real weight-sync values (_e2e_helpers).

A job that several tests of one module assert on is launched once, by module-scoped fixtures that use `shared_run`:
the same two checks then apply to it as a whole, after the module's last test."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from _e2e_helpers import check_run_metrics

MARKER = "ASYNC_RL_E2E_TEST"  # set in each test's environment: every process it starts (and theirs) inherits it
LEFTOVER_GRACE_S = 20.0  # processes still running this long after the test body are left behind


def _assert_nothing_lost(metrics: list[dict]) -> None:
    """The coordinator's ledger accounts for every prompt id below its data cursor at every logged step: trained,
    filtered (DAPO dynamic sampling), leased to an actor, received and waiting, handed to the learner, queued for
    re-grant, or dropped (counted)."""
    for m in metrics:
        assert m["transport/data_epoch"] == 0, "these runs stay within the first pass over the data"
        accounted = (
            m["transport/trained_total"]
            + m.get("transport/filter/filtered_total", 0)
            + m["transport/leased"]
            + m["transport/queue_depth"]
            + m["transport/taken"]
            + m["transport/regrant_queue"]
            + m["transport/dropped_total"]
        )
        assert accounted == m["transport/data_position"], m


@pytest.fixture
def assert_nothing_lost() -> Callable[[list[dict]], None]:
    return _assert_nothing_lost


class TestProcesses:
    """The live processes started by the running test, found by the marker in their environment (``/proc``).

    A process that left its parent's process group or was orphaned (a learner rank whose torchrun was killed) is
    still found: the environment is inherited across fork, exec, setsid and re-parenting.
    """

    __test__ = False  # not a test class

    def __init__(self, marker: str) -> None:
        self.marker = marker
        self.entry = f"{MARKER}={marker}".encode()

    def alive(self) -> dict[int, str]:
        """pid -> command line of every live (non-zombie) process carrying the marker, this one excepted."""
        found: dict[int, str] = {}
        if not Path("/proc/self/environ").exists():
            return found  # no /proc (not Linux): nothing can be checked
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if self.entry not in (entry / "environ").read_bytes().split(b"\0"):
                    continue
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            if stat[stat.rfind(")") + 2 :].split()[0] == "Z":
                continue
            if "from multiprocessing." in cmdline and int(stat[stat.rfind(")") + 2 :].split()[1]) == os.getpid():
                continue  # the test process's own multiprocessing helper (resource tracker): it lives as long as pytest
            found[int(entry.name)] = cmdline
        return found

    def wait_gone(self, timeout_s: float) -> dict[int, str]:
        """Wait up to ``timeout_s`` for every marked process to exit; returns those still alive."""
        deadline = time.monotonic() + timeout_s
        while (left := self.alive()) and time.monotonic() < deadline:
            time.sleep(0.2)
        return left

    def kill(self, pids: dict[int, str]) -> None:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture(autouse=True)
def e2e_processes(monkeypatch: pytest.MonkeyPatch) -> Iterator[TestProcesses]:
    """Every e2e test: mark the processes it starts; afterwards fail it if any is still alive (and kill those)."""
    marker = uuid.uuid4().hex
    monkeypatch.setenv(MARKER, marker)
    tracker = TestProcesses(marker)
    yield tracker
    left = tracker.wait_gone(LEFTOVER_GRACE_S)
    if left:
        tracker.kill(left)
        lines = "\n".join(f"  {pid}: {cmd[:300]}" for pid, cmd in sorted(left.items()))
        pytest.fail(
            f"{len(left)} process(es) started by the test still alive {LEFTOVER_GRACE_S:.0f} s after it:\n{lines}"
        )


@pytest.fixture(autouse=True)
def e2e_run_metrics(tmp_path: Path) -> Iterator[None]:
    """Every e2e test: afterwards, each metrics.jsonl it wrote under its tmp_path passes `check_run_metrics`."""
    yield
    for path in sorted(tmp_path.rglob("metrics.jsonl")):
        check_run_metrics(path)


@dataclass
class SharedRun:
    """A job launched once for several tests of a module: its directory, and the marker its processes carry."""

    __test__ = False  # not a test class

    path: Path
    processes: TestProcesses

    def env(self) -> dict[str, str]:
        """The environment to start the job's processes with: this run's marker (not the current test's)."""
        return {**os.environ, MARKER: self.processes.marker}


@pytest.fixture(scope="module")
def shared_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedRun]:
    """A directory and a process marker for a job that module-scoped fixtures launch once and several tests check.

    After the module's last test, the checks every e2e test gets (`e2e_processes`, `e2e_run_metrics`) run on it: no
    process it started is still alive, and each metrics.jsonl under its directory passes `check_run_metrics`.
    """
    run = SharedRun(tmp_path_factory.mktemp("shared"), TestProcesses(uuid.uuid4().hex))
    yield run
    left = run.processes.wait_gone(LEFTOVER_GRACE_S)
    if left:
        run.processes.kill(left)
        lines = "\n".join(f"  {pid}: {cmd[:300]}" for pid, cmd in sorted(left.items()))
        pytest.fail(f"{len(left)} process(es) started by the shared run still alive after the module:\n{lines}")
    for path in sorted(run.path.rglob("metrics.jsonl")):
        check_run_metrics(path)
