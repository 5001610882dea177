"""GracefulStop: SIGTERM sets the stop flag even while the main thread is stuck in a C call, every learner rank agrees
to stop when one got it, and a process that does not stop in time exits at the deadline.

Signals are sent to child processes (never to pytest itself): a deadline that fired here would end the test run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from async_rl.learner.dist import local_context
from async_rl.runtime.graceful_stop import GracefulStop, StopRequested, step_outlasts_deadline
from async_rl.runtime.rollout_source import wait_for_groups

ROOT = Path(__file__).resolve().parents[2]


def _spawn(code: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_a_cooperative_loop_stops_on_sigterm_and_the_handler_is_restored() -> None:
    proc = _spawn(
        """
        import logging, signal, time
        from async_rl.runtime.graceful_stop import GracefulStop
        logging.basicConfig(level=logging.INFO)
        stop = GracefulStop(deadline_s=30.0).install()
        print("ready", flush=True)
        polls = 0
        while not stop.requested:
            time.sleep(0.05)
            polls += 1
        stop.close()
        print("stopped", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, signal.set_wakeup_fd(-1), flush=True)
        """
    )
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert time.monotonic() - sent < 5.0
    assert out.split() == ["stopped", "True", "-1"]  # default SIGTERM again, no wakeup fd left behind
    assert "SIGTERM: stopping at the next step boundary; exiting in at most 30.0 s" in err


def test_sigterm_reaches_a_main_thread_stuck_in_a_c_call_and_the_deadline_exits_it() -> None:
    proc = _spawn(
        """
        import ctypes, logging, os, signal
        from async_rl.runtime.graceful_stop import GracefulStop
        logging.basicConfig(level=logging.INFO)
        stop = GracefulStop(deadline_s=1.0).install()
        # SA_RESTART: the read below resumes after the signal, so the main thread never runs a Python handler again,
        # as in a collective waiting for a peer that is gone.
        signal.siginterrupt(signal.SIGTERM, False)
        r, _w = os.pipe()
        print("ready", flush=True)
        ctypes.CDLL(None, use_errno=True).read(r, ctypes.create_string_buffer(1), 1)
        print("read returned", flush=True)
        """
    )
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    took = time.monotonic() - sent
    assert proc.returncode == 128 + signal.SIGTERM, err  # 143: os._exit at the deadline
    assert 0.9 < took < 5.0, took
    assert "read returned" not in out
    assert "SIGTERM: stopping at the next step boundary" in err  # the watcher thread saw it through the wakeup fd
    assert "did not stop within 1.0 s of SIGTERM: exiting without a checkpoint" in err


def test_every_rank_agrees_when_one_rank_gets_sigterm(tmp_path: Path) -> None:
    worker = tmp_path / "worker.py"
    worker.write_text(
        textwrap.dedent(
            """
            import os, signal, time
            from async_rl.learner.dist import init_distributed, teardown
            from async_rl.runtime.graceful_stop import GracefulStop
            stop = GracefulStop(deadline_s=60.0).install()
            ctx = init_distributed(backend="gloo", timeout_s=120.0)
            agreed = []
            for i in range(200):
                if ctx.rank == 1 and i == 3:
                    os.kill(os.getpid(), signal.SIGTERM)  # only rank 1 is asked to stop
                if stop.agreed(ctx):
                    break
                time.sleep(0.02)
            with open(f"rank{ctx.rank}.txt", "w") as f:  # one file per rank: their stdout lines interleave
                f.write(f"{i} {stop.requested}")
            teardown(ctx)
            stop.close()
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(worker)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (poll0, got0), (poll1, got1) = ((tmp_path / f"rank{r}.txt").read_text().split() for r in (0, 1))
    # Rank 1 sets its flag at poll 3 (its handler runs as os.kill returns); rank 0 learns it from the same all-reduce,
    # so both leave at the same poll: 3, or 4 should the signal have reached another thread of rank 1 first.
    assert poll0 == poll1 and poll0 in ("3", "4")
    assert (got0, got1) == ("False", "True")  # only rank 1 was signalled


def test_agreed_without_a_process_group_is_the_local_flag() -> None:
    stop = GracefulStop(deadline_s=5.0)  # not installed, never requested: no deadline thread is started
    assert not stop.agreed(local_context())
    assert not stop.requested
    with pytest.raises(ValueError, match="deadline_s"):
        GracefulStop(deadline_s=0)


class _Agreed:
    """A stop every rank agreed on (the collective itself is tested above)."""

    def agreed(self, ctx: object) -> bool:
        return True


def test_the_rollout_wait_raises_stop_requested_before_taking_any_group() -> None:
    # coordinator None: the wait must leave before it asks the coordinator for groups (none is taken, none lost)
    with pytest.raises(StopRequested, match="waiting for rollouts"):
        wait_for_groups(local_context(), None, None, 8, timeout_s=10.0, republish=lambda: None, stop=_Agreed())  # type: ignore[arg-type]


def test_a_step_longer_than_the_stop_deadline_is_named_with_the_keys_to_raise() -> None:
    assert step_outlasts_deadline(9.9, 10.0) is None and step_outlasts_deadline(10.0, 10.0) is None
    warning = step_outlasts_deadline(35.25, 10.0)
    assert warning is not None
    assert warning.startswith("a step took 35.2 s, longer than async_training.timeouts.stop_s=10.0 s")
    assert "KillWait" in warning and "GraceTime" in warning
