"""Helpers shared by the end-to-end tests: the launcher command line, killing a job, reading a run's JSONL files, free
ports, and the checks every run's metrics.jsonl must pass (conftest.py runs them after each test): every key is in
the metric catalog, and the weight-sync metrics carry real values."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from async_rl.metric_catalog import record_kind, unknown_keys

ROOT = Path(__file__).resolve().parents[2]


def launcher_command(
    config: str,
    run_dir: Path,
    *,
    steps: int,
    actors: int = 1,
    flags: Sequence[str] = (),
    overrides: Sequence[str] = (),
) -> list[str]:
    """``launchers/local.py`` on ``configs/<config>`` with 2 learner ranks, JSONL metrics in ``run_dir``."""
    return [
        sys.executable,
        str(ROOT / "launchers" / "local.py"),
        "--config",
        str(ROOT / "configs" / config),
        "--nproc-per-node",
        "2",
        "--actors",
        str(actors),
        "--run-dir",
        str(run_dir),
        *flags,
        f"trainer.default_local_dir={run_dir}",
        f"trainer.total_training_steps={steps}",
        "trainer.logger=['jsonl']",
        *overrides,
    ]


def read_jsonl(path: Path) -> list[dict]:
    """The complete lines of a JSONL file, which may still be written to (a line in flight is left out)."""
    if not path.exists():
        return []
    text = path.read_text()
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines() if line.strip()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def assert_catalogued(metrics: list[dict]) -> None:
    """Every key of every record (training step or validation round) is one the metric catalog names."""
    unknown = sorted({k for m in metrics for k in unknown_keys(m, record_kind(m))})
    assert not unknown, f"metrics not in async_rl/metric_catalog.py (add them there): {unknown}"


def assert_sync_moved_weights(metrics: list[dict]) -> None:
    """Every training step that published weights to actors reports the bytes it broadcast (> 0, the same whole model
    each time) and a bandwidth > 0.

    A step published when it logged ``sync/seconds`` with ``sync/actors`` > 0 and ``sync/failures`` did not grow (a
    failed transfer reports its time too); a resumed learner counts its failures from 0 again."""
    published: list[dict] = []
    failures_before = 0.0
    for m in metrics:
        if "val/version" in m or "sync/seconds" not in m:
            continue  # a validation round, or a step that published nothing (sync_every_n_steps)
        failures = float(m.get("sync/failures", 0.0))
        failed = failures > failures_before if failures >= failures_before else failures > 0
        failures_before = failures
        if float(m.get("sync/actors", 0.0)) > 0 and not failed:
            published.append(m)
    for m in published:
        assert m.get("sync/bytes", 0) > 0 and m.get("sync/bandwidth_MBps", 0) > 0, (
            f"step {m['step']} published weights to {m['sync/actors']:.0f} actor(s) but reports "
            f"sync/bytes={m.get('sync/bytes')}, sync/bandwidth_MBps={m.get('sync/bandwidth_MBps')}"
        )
    sizes: dict[float | None, set[float]] = {}  # bits per floating weight on the wire (if logged) -> bytes sent
    for m in published:
        sizes.setdefault(m.get("sync/wire_bits"), set()).add(m["sync/bytes"])
    for bits, sent in sizes.items():
        assert len(sent) == 1, f"every publish sends the whole model, yet at {bits} bits sync/bytes took {sent}"
    if {16.0, 32.0} <= sizes.keys():  # a run resumed with actors of another dtype: half the floating bytes
        assert sizes[16.0].pop() < 0.55 * sizes[32.0].pop(), sizes


def check_run_metrics(path: Path) -> None:
    """The checks every e2e run's metrics.jsonl passes (see the module docstring)."""
    metrics = read_jsonl(path)
    assert_catalogued(metrics)
    assert_sync_moved_weights(metrics)


def kill_job(job: subprocess.Popen) -> None:
    """SIGKILL a ``launchers/local.py`` job: every part's process group first (each part runs in a session of its
    own), then the launcher's. Learner ranks, in sessions of their own, leave because their parent died."""
    for line in subprocess.run(["ps", "-eo", "pid,pgid,ppid"], capture_output=True, text=True).stdout.split("\n"):
        fields = line.split()
        if len(fields) == 3 and fields[2] == str(job.pid):
            try:
                os.killpg(int(fields[1]), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    os.killpg(job.pid, signal.SIGKILL)
    job.wait(timeout=60)
