"""RL with a learned reward model served beside the actors, through the real launcher: a reward model trained on the
toy preferences (the real trainer, a few steps), a reward-server process, one real vLLM actor, the 2-rank FSDP2
learner. The reward server is SIGSTOPped for a while, then SIGKILLed (the launcher restarts it). The run must finish
every step, train no prompt twice and lose none, carry the model's score as its own reward component, and count the
server's missed deadlines under their own names.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _e2e_helpers import ROOT, launcher_command, read_jsonl

STEPS = 8
BATCH = 8  # smoke_grpo.yaml's prompts per step
STOP_S = 6.0


def _train_reward_model(out: Path) -> Path:
    cmd = [sys.executable, "-m", "async_rl.entrypoints.train_reward_model"]
    cmd += ["--config", str(ROOT / "configs" / "reward_model" / "tiny_toy.yaml")]
    cmd += [f"trainer.default_local_dir={out}", "trainer.total_training_steps=30"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out / "hf"


def _server_group(run_dir: Path) -> int:
    """The reward server's process group (the launcher starts each part as its own group leader)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if b"async_rl.entrypoints.reward_server" in argv and str(run_dir).encode() in b" ".join(argv):
            pgid = int(stat[stat.rfind(")") + 2 :].split()[2])
            if pgid == int(entry.name):
                return pgid
    raise AssertionError("no reward-server process found")


def _wait_steps(path: Path, steps: int, job: subprocess.Popen[bytes], timeout_s: float = 400.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(read_jsonl(path)) < steps:
        assert job.poll() is None, f"the job ended (exit {job.returncode}) before step {steps}"
        assert time.monotonic() < deadline, f"timed out waiting for step {steps}"
        time.sleep(0.2)


@pytest.mark.slow
def test_a_reward_server_stopped_then_killed_costs_a_delay_and_loses_nothing(
    tmp_path: Path, assert_nothing_lost
) -> None:
    model = _train_reward_model(tmp_path / "rm")
    run_dir = tmp_path / "run"
    overrides = [
        "reward.reward_model.enable=true",
        f"reward.reward_model.model_path={model}",
        "reward.reward_model.weight=0.5",
        "reward.reward_model.retries=0",
        "reward.timeout_s=2",
        "async_training.launcher.restart_backoff_s=0.5",
    ]
    cmd = launcher_command("smoke_grpo.yaml", run_dir, steps=STEPS, overrides=overrides)
    err = tmp_path / "launcher.err"
    with err.open("wb") as f:
        job = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=f, start_new_session=True)
    metrics_path = run_dir / "metrics.jsonl"
    try:
        _wait_steps(metrics_path, 2, job)
        group = _server_group(run_dir)
        os.killpg(group, signal.SIGSTOP)
        time.sleep(STOP_S)
        os.killpg(group, signal.SIGCONT)
        _wait_steps(metrics_path, 4, job)
        os.killpg(_server_group(run_dir), signal.SIGKILL)
        rc = job.wait(timeout=400)
    finally:
        if job.poll() is None:
            job.send_signal(signal.SIGTERM)
            job.wait(timeout=60)
    text = err.read_text()
    assert rc == 0, text[-4000:]
    assert "reward-server failed with exit code -9" in text and "restarted reward-server (restart 1 of 3)" in text
    metrics = read_jsonl(metrics_path)
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    ids = [i for rec in read_jsonl(run_dir / "trained_groups.jsonl") for i in rec["prompt_ids"]]
    assert len(ids) == len(set(ids)) == STEPS * BATCH  # nothing trained twice, nothing skipped
    assert_nothing_lost(metrics)
    last = metrics[-1]
    assert last["transport/actors/reward_model_timeouts_total"] >= 1  # the stop (and the kill) cost deadlines
    assert last["transport/actors/reward_model_refused_total"] == 0
    # every trained group was scored: the actor's exit summary has its final count (the heartbeat the last step's
    # metrics carry can be up to a report interval behind the groups it already sent)
    actor_log = (run_dir / "logs" / "actor-0.log").read_text()
    summaries = [line for line in actor_log.splitlines() if '"actor/reward_model/requests"' in line]
    assert len(summaries) == 1, actor_log[-3000:]
    summary = json.loads(summaries[0])
    assert summary["actor/reward_model/requests"] >= STEPS * BATCH
    assert summary["actor/reward_model/timeouts"] >= 1 and summary["actor/reward_model/refused"] == 0
    for m in metrics:  # every trained completion carries both components, and the reward is their weighted sum
        rule, model_score = m["rollout/reward/rule"], m["rollout/reward/reward_model"]
        assert m["rollout/reward_mean"] == pytest.approx(rule + 0.5 * model_score, abs=1e-4)
    assert len({round(m["rollout/reward/reward_model"], 6) for m in metrics}) > 1  # real, varying scores
    server_log = (run_dir / "logs" / "reward-server.log").read_text()
    assert server_log.count("reward server listening on tcp://127.0.0.1:") == 2
