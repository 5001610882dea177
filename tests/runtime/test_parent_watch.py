"""watch_parent: a process whose parent is SIGKILLed exits within seconds (PDEATHSIG, and the polling fallback).

Each test starts a middle process (its own session, like a launcher part) that starts a grandchild; the grandchild
enables the watch, writes its pid, and would sleep for a minute. The test SIGKILLs the middle process only and checks
by PID that the grandchild is gone (or a zombie waiting for init) within a few seconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from async_rl.runtime import parent_watch

ROOT = Path(__file__).resolve().parents[2]

MIDDLE = """
import subprocess, sys, time
grandchild = subprocess.Popen([sys.executable, sys.argv[1], *sys.argv[2:]])
time.sleep(60)
"""

FORKER = """
import os, sys, time
from pathlib import Path
from async_rl.runtime import parent_watch

assert parent_watch.watch_parent(grace_s=0.5, forked_children=True)  # as the actor does before vLLM forks its engine
if os.fork() == 0:  # the forked child starts no watch itself: the at-fork hook does
    Path(sys.argv[3]).write_text(str(os.getpid()))
    time.sleep(60)
    os._exit(0)
time.sleep(60)
"""

GRANDCHILD = """
import os, signal, sys, time
from pathlib import Path
from async_rl.runtime import parent_watch

mode, out = sys.argv[1], Path(sys.argv[2])
if mode == "poll-only":  # as where prctl is missing: only the polling thread notices
    parent_watch.set_parent_death_signal = lambda sig=signal.SIGTERM: False
if mode == "ignores-term":  # a process that does not leave on SIGTERM: the fallback exits it after grace_s
    signal.signal(signal.SIGTERM, lambda *a: None)
assert parent_watch.watch_parent(grace_s=0.5, poll_s=0.2)
out.write_text(str(os.getpid()))
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture
def family(tmp_path: Path) -> Iterator[list[int]]:
    """Pids to SIGKILL at teardown should a test fail (each checked to still carry this test's directory)."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            if str(tmp_path).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _orphan_exit_s(tmp_path: Path, mode: str, family: list[int], middle_code: str = MIDDLE) -> float:
    """Start middle -> grandchild(mode), SIGKILL the middle one, return how long the grandchild outlived it."""
    (tmp_path / "middle.py").write_text(middle_code)
    (tmp_path / "grandchild.py").write_text(GRANDCHILD)
    out = tmp_path / "grandchild.pid"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, str(tmp_path / "middle.py"), str(tmp_path / "grandchild.py"), mode, str(out)]
    middle = subprocess.Popen(argv, env=env, start_new_session=True)
    family.append(middle.pid)
    deadline = time.monotonic() + 60
    while not (out.exists() and out.read_text()):
        assert middle.poll() is None and time.monotonic() < deadline, "the grandchild never started its watch"
        time.sleep(0.05)
    grandchild = int(out.read_text())
    family.append(grandchild)
    assert _alive(grandchild)
    killed = time.monotonic()
    middle.kill()  # the middle process only: the grandchild is not in its process group's way, it is orphaned
    middle.wait()
    while _alive(grandchild) and time.monotonic() - killed < 10:
        time.sleep(0.02)
    assert not _alive(grandchild), f"{mode}: the orphaned grandchild is still alive 10 s after its parent died"
    return time.monotonic() - killed


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_parent_death_signal_ends_an_orphan_at_once(tmp_path: Path, family: list[int]) -> None:
    assert _orphan_exit_s(tmp_path, "default", family) < 1.0  # the kernel signals it; no polling delay


@pytest.mark.skipif(os.name != "posix", reason="the watch is a no-op off POSIX")
def test_polling_fallback_ends_an_orphan_within_a_poll(tmp_path: Path, family: list[int]) -> None:
    assert _orphan_exit_s(tmp_path, "poll-only", family) < 3.0  # poll_s = 0.2 plus interpreter exit


@pytest.mark.skipif(os.name != "posix", reason="the watch is a no-op off POSIX")
def test_an_orphan_ignoring_sigterm_is_exited_after_the_grace(tmp_path: Path, family: list[int]) -> None:
    assert _orphan_exit_s(tmp_path, "ignores-term", family) < 3.0  # SIGTERM ignored; os._exit 0.5 s later


@pytest.mark.skipif(not hasattr(os, "register_at_fork"), reason="needs os.register_at_fork")
def test_a_forked_child_leaves_with_the_process_that_forked_it(tmp_path: Path, family: list[int]) -> None:
    # middle = the forker (an actor); the process that must go is its os.fork() child (vLLM's engine process)
    assert _orphan_exit_s(tmp_path, "forked", family, middle_code=FORKER) < 1.0


def test_watch_is_a_no_op_without_posix_or_under_init(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parent_watch, "_watching", None)
    monkeypatch.setattr(parent_watch.os, "name", "nt")
    assert parent_watch.watch_parent() is False
    monkeypatch.setattr(parent_watch.os, "name", "posix")
    monkeypatch.setattr(parent_watch.os, "getppid", lambda: 1)  # started by init: no parent to outlive
    assert parent_watch.watch_parent() is False
    assert parent_watch._watching is None  # nothing was started
    with pytest.raises(ValueError, match="poll_s"):
        parent_watch.watch_parent(poll_s=0)


def test_death_signal_is_set_in_a_fresh_process() -> None:
    code = textwrap.dedent(
        """
        import ctypes, signal, sys
        from async_rl.runtime.parent_watch import set_parent_death_signal
        ok = set_parent_death_signal(signal.SIGUSR1)
        if sys.platform.startswith("linux"):
            libc = ctypes.CDLL(None, use_errno=True)
            got = ctypes.c_int()
            assert libc.prctl(2, ctypes.byref(got), 0, 0, 0) == 0  # PR_GET_PDEATHSIG
            assert ok and got.value == signal.SIGUSR1, got.value
        else:
            assert not ok
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)
