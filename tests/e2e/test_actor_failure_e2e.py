"""SIGKILL one of two real vLLM actors mid-run: the run completes, no prompt group is lost or trained twice, and a
restarted actor rejoins and receives the current weights.

Processes are started by hand (not through the launcher, which by design stops the whole job when a part fails)
and each lives in its own process group, so cleanup kills by process group, never by name.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
K = 1
BATCH = 8
STEPS = 14


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as f:
        return subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def _kill_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


@pytest.mark.slow
def test_killed_actor_loses_nothing_and_a_restarted_actor_rejoins(tmp_path, assert_nothing_lost):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    port, ws_port = _free_port(), _free_port()
    overrides = [
        "--config",
        str(ROOT / "configs" / "smoke_grpo.yaml"),
        f"trainer.default_local_dir={run_dir}",
        f"trainer.total_training_steps={STEPS}",
        f"data.train_batch_size={BATCH}",
        f"async_training.max_staleness={K}",
        "async_training.stale_policy=regrant",
        f"async_training.transport.port={port}",
        f"async_training.weight_sync.master_port={ws_port}",
        "async_training.transport.heartbeat_interval_s=1.0",
        "async_training.transport.peer_timeout_s=5.0",
        "async_training.transport.lease_timeout_s=60.0",
        "async_training.weight_sync.timeout_s=30",
        "async_training.num_actors=2",
        "trainer.logger=['jsonl']",
    ]
    learner_cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    learner_cmd += ["-m", "async_rl.entrypoints.train", *overrides]

    def actor_cmd(name: str) -> list[str]:
        coordinator = f"tcp://127.0.0.1:{port}"
        return [sys.executable, "-m", "async_rl.entrypoints.actor", *overrides, "--coordinator", coordinator,
                "--actor-id", name]  # fmt: skip

    procs: list[subprocess.Popen[bytes]] = []
    try:
        learner = _start(learner_cmd, tmp_path / "learner.log")
        procs.append(learner)
        victim = _start(actor_cmd("actor-0"), tmp_path / "actor-0.log")
        survivor = _start(actor_cmd("actor-1"), tmp_path / "actor-1.log")
        procs += [victim, survivor]

        deadline = time.monotonic() + 600
        while len(_jsonl(run_dir / "metrics.jsonl")) < 3:
            assert learner.poll() is None, (tmp_path / "learner.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the run did not reach step 3"
            time.sleep(0.5)
        _kill_group(victim)  # SIGKILL mid-run: whatever it held leased must come back
        victim.wait(timeout=30)
        killed_at = len(_jsonl(run_dir / "metrics.jsonl"))
        # Freeze the survivor until the restarted actor is up: otherwise the learner (about 1 s a step) can finish
        # before a new vLLM engine has even started (about 40 s), and the rejoin would go untested. The frozen
        # survivor misses heartbeats, its leases expire and are granted again (regrant policy): nothing is lost.
        os.killpg(survivor.pid, signal.SIGSTOP)
        restarted = _start(actor_cmd("actor-2"), tmp_path / "actor-2.log")
        procs.append(restarted)
        deadline = time.monotonic() + 600
        while "now on policy version" not in (tmp_path / "actor-2.log").read_text():
            assert restarted.poll() is None, (tmp_path / "actor-2.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the restarted actor never received weights"
            time.sleep(0.5)
        os.killpg(survivor.pid, signal.SIGCONT)
        assert learner.wait(timeout=900) == 0, (tmp_path / "learner.log").read_text()[-3000:]
        for actor in (survivor, restarted):
            assert actor.wait(timeout=60) == 0  # told to shut down by the coordinator
    finally:
        for proc in procs:
            _kill_group(proc)

    metrics = _jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    assert all(m["rollout/staleness_max"] <= K for m in metrics)
    audit = _jsonl(run_dir / "trained_groups.jsonl")
    ids = [i for rec in audit for i in rec["prompt_ids"]]
    assert len(ids) == len(set(ids)) == STEPS * BATCH  # 0 duplicates
    # 0 lost: the ledger accounts for every prompt ever granted, at every step, and none was dropped (regrant policy).
    assert_nothing_lost(metrics)
    assert metrics[-1]["transport/dropped_total"] == 0
    # Whether the victim held leases at the kill depends on timing (admission grants at most about one step ahead,
    # and a fast actor finishes its leases quickly); tests/transport/test_actor_processes.py kills actor processes
    # that hold leases and checks the expiries. Here the identity above shows nothing was lost either way.
    # The restarted actor received the weights current when it joined (>= the version at the kill) and kept up.
    restarted_log = (tmp_path / "actor-2.log").read_text()
    versions = [int(line.rsplit(" ", 1)[1]) for line in restarted_log.splitlines() if "now on policy version" in line]
    assert versions and min(versions) >= killed_at - 1 and max(versions) >= STEPS - 1
