"""The real launcher when a part fails or is stopped: a SIGKILLed actor is named, restarted, rejoins weight sync and
the run finishes 0; a SIGTERM to the launcher stops the learner at a step boundary with a checkpoint, inside the grace.

Real launcher, torchrun, 2-rank FSDP2 learner on the tiny model, coordinator, ZeroMQ and weight sync; the actors are
emulated (``--emulate-tokens-per-s``: the real actor loop, client and weight receiver, no vLLM), so each restart takes
seconds, not a vLLM start-up. Faults next to a real vLLM actor are in tests/e2e/test_chaos_e2e.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from _e2e_helpers import ROOT, launcher_command, read_jsonl

BATCH = 4
N = 2
LENGTH = 8


def _command(run_dir: Path, steps: int, actors: int, *extra: str, tokens_per_s: int = 256) -> list[str]:
    flags = ["--emulate-tokens-per-s", str(tokens_per_s), "--emulate-response-len", str(LENGTH)]
    overrides = [
        f"data.train_batch_size={BATCH}",
        f"actor_rollout_ref.rollout.n={N}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={BATCH}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={BATCH * N // 2}",
        "async_training.stale_policy=regrant",
        "async_training.transport.heartbeat_interval_s=0.5",
        "async_training.transport.peer_timeout_s=3.0",
        *extra,
    ]
    return launcher_command("smoke_grpo.yaml", run_dir, steps=steps, actors=actors, flags=flags, overrides=overrides)


def _wait(predicate, what: str, job: subprocess.Popen[bytes], timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert job.poll() is None, f"the job ended (exit {job.returncode}) before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _start(cmd: list[str], tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    err = tmp_path / "launcher.err"
    with err.open("wb") as f:
        job = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=f, start_new_session=True)
    return job, err


def _actor_group(run_dir: Path, name: str) -> int:
    """The process group of actor ``name`` (the launcher starts each part as its own group leader)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if (
                b"async_rl.entrypoints.actor" in argv
                and name.encode() in argv
                and str(run_dir).encode() in b" ".join(argv)
            ):
                pgid = int(stat[stat.rfind(")") + 2 :].split()[2])
                if pgid == int(entry.name):
                    return pgid
    raise AssertionError(f"no {name} process found")


@pytest.mark.slow
def test_a_killed_actor_is_restarted_rejoins_and_the_run_finishes(tmp_path: Path, assert_nothing_lost) -> None:
    run_dir, steps = tmp_path / "run", 16
    restart = ("async_training.launcher.restart_actors=true", "async_training.launcher.restart_backoff_s=0.5")
    # 64 tokens/s: a step's 64 response tokens take one surviving actor about 1 s, so the 14 steps after the kill
    # outlast the restarted actor's start-up. At 256 tokens/s they took 7.5 s, and a restarted actor beside another
    # test's processes (pytest-xdist) had not finished importing when the run ended (2026-12-06).
    job, err = _start(_command(run_dir, steps, 2, *restart, tokens_per_s=64), tmp_path)
    try:
        _wait(lambda: len(read_jsonl(run_dir / "metrics.jsonl")) >= 2, "step 2", job)
        os.killpg(_actor_group(run_dir, "actor-1"), signal.SIGKILL)
        killed_at = len(read_jsonl(run_dir / "metrics.jsonl"))
        rc = job.wait(timeout=300)
    finally:
        if job.poll() is None:
            job.send_signal(signal.SIGTERM)  # the launcher stops its parts
            job.wait(timeout=60)
    text = err.read_text()
    assert rc == 0, text[-4000:]
    log = run_dir / "logs" / "actor-1.log"
    assert f"actor-1 failed with exit code -9; log: {log}; restarting it in 0.5 s (restart 1 of 3)" in text
    assert "restarted actor-1 (restart 1 of 3)" in text and "stopping every other part" not in text
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))
    ids = [i for rec in read_jsonl(run_dir / "trained_groups.jsonl") for i in rec["prompt_ids"]]
    assert len(ids) == len(set(ids)) == steps * BATCH  # nothing trained twice
    assert_nothing_lost(metrics)
    # the restarted actor (same id) rejoined the weight sync: it received versions published after the kill
    restarted = log.read_text().split("----- launch: restart 1 of actor-1 -----", 1)[1]
    versions = [int(line.rsplit(" ", 1)[1]) for line in restarted.splitlines() if "now on policy version" in line]
    assert versions and max(versions) > killed_at, versions
    assert metrics[-1]["sync/actors"] == 2.0


@pytest.mark.slow
def test_sigterm_stops_the_learner_with_a_checkpoint_inside_the_grace(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    ckpt = "async_training.checkpoint.save_every_n_steps=1000"  # configured, but only the stop writes one here
    job, err = _start(_command(run_dir, 200, 1, ckpt), tmp_path)
    try:
        _wait(lambda: len(read_jsonl(run_dir / "metrics.jsonl")) >= 3, "step 3", job)
        sent = time.monotonic()
        job.send_signal(signal.SIGTERM)
        rc = job.wait(timeout=60)
        took = time.monotonic() - sent
    finally:
        if job.poll() is None:
            job.kill()
    text = err.read_text()
    assert rc == 128 + signal.SIGTERM, text[-4000:]
    assert "did not stop within" not in text  # nothing had to be killed
    assert took < 15.0, took  # the launcher's default --grace-s
    learner_log = (run_dir / "logs" / "learner.log").read_text()
    done = len(read_jsonl(run_dir / "metrics.jsonl"))
    assert f"stopped by signal after step {done}; checkpoint: {run_dir / 'checkpoints' / f'step_{done}'}" in learner_log
    assert (run_dir / "checkpoints" / f"step_{done}" / "COMMITTED").exists()
