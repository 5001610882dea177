"""launchers/slurm_hetjob.sbatch against a running Slurm: preempted and requeued, cancelled, resubmitted, finished.

A local cluster (tests/e2e/_slurm_cluster.py: munged, slurmctld, 3 slurmd on loopback) runs the script as a
heterogeneous job on a CPU-only partition: 2 learner nodes (torchrun, FSDP2 on gloo, world size 2) and 1 actor node
(its actor), on the smoke config. One job, three lives:

1. a higher-priority job preempts it: Slurm sends SIGTERM (the partition's grace), every learner rank stops at a step
   boundary with a checkpoint, and the script requeues the job (``sbatch --requeue``);
2. the requeued job (same id, same RUN_DIR) resumes from that checkpoint; ``scancel`` stops it again, with a
   checkpoint, and it stays cancelled;
3. the same command submitted again resumes and trains to the end.

The first two lives run emulated actors (``ACTOR_FLAGS``: the real actor loop, rollout client and weight receiver
with a fixed-rate generator) to spare two vLLM start-ups; the last one runs a real vLLM actor.

Across the three, every prompt id of the run is trained exactly once (the audit log), and every part logged under
RUN_DIR/logs. Skipped, with the reason, where Slurm cannot be installed or started.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _e2e_helpers import ROOT, free_port, read_jsonl
from _slurm_cluster import SlurmCluster, SlurmUnavailable, unavailable

from async_rl.runtime.run_state import AUDIT_FILE

pytestmark = pytest.mark.slow

STEPS = 14
BATCH = 8  # configs/smoke_grpo.yaml: data.train_batch_size
EMULATED_TOKENS_PER_S = 512
LIFE_S = 240.0  # one life of the job: Slurm scheduling, vLLM start-up (about a minute here), a few steps


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    try:
        socket.gethostbyname(socket.gethostname())  # the nodes' host name, and the learners' MASTER_ADDR
    except OSError as exc:
        pytest.skip(f"this machine's host name {socket.gethostname()!r} does not resolve: {exc}")
    daemon_env = {k: v for k, v in os.environ.items() if k != "ASYNC_RL_E2E_TEST"}  # not a test's process
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"), daemon_env)
    try:
        cluster.start()
    except SlurmUnavailable as exc:
        cluster.stop()
        pytest.skip(str(exc))
    yield cluster
    cluster.stop()


def _submit(slurm: SlurmCluster, run_dir: Path, ports: dict[str, str], *sbatch: str, vllm: bool = True) -> int:
    host = socket.gethostname()
    env = {
        **os.environ,
        "CONFIGS": "configs/smoke_grpo.yaml", "RUN_DIR": str(run_dir), "PYTHON": sys.executable,
        "NPROC_PER_NODE": "1", "ACTORS_PER_NODE": "1",  # a CPU-only partition
        "MASTER_ADDR": host,  # getfqdn() may say localhost, which 2 learner nodes cannot share
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",  # torchrun of this environment
        **ports,
    }  # fmt: skip
    if not vllm:  # the real actor loop, client and weight sync; a fixed-rate generator instead of vLLM's start-up
        env["ACTOR_FLAGS"] = f"--emulate-tokens-per-s {EMULATED_TOKENS_PER_S}"
    if socket.gethostbyname(host).startswith("127."):
        env["COORD_BIND"] = "127.0.0.1"  # every "node" is this machine: keep the coordinator on loopback
    argv = [
        "sbatch", "--parsable", "--gpus-per-node=0", "--cpus-per-task=1", f"--output={run_dir}/slurm-%j.out",
        *sbatch, str(ROOT / "launchers" / "slurm_hetjob.sbatch"),
        f"trainer.total_training_steps={STEPS}", "trainer.logger=['jsonl']",
        "async_training.checkpoint.save_every_n_steps=1000",  # configured; only the stops write checkpoints here
    ]  # fmt: skip
    res = slurm.run(*argv, env=env, check=False)  # sbatch hands this environment to the job
    assert res.returncode == 0, res.stderr
    return int(res.stdout.strip().split(";")[0])


def _trained_steps(run_dir: Path) -> int:
    return len(read_jsonl(run_dir / "out" / "metrics.jsonl"))


def _wait_for(what: str, predicate, slurm: SlurmCluster, job: int, timeout_s: float = LIFE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        state = slurm.job(job)["JobState"]
        assert state in ("PENDING", "RUNNING", "CONFIGURING"), f"job {job} is {state} before {what}"
        assert time.monotonic() < deadline, f"job {job}: no {what} within {timeout_s:.0f} s"
        time.sleep(0.5)


def _stopped_at(run_dir: Path) -> int:
    """The step of the last 'stopped by signal' line, checking that its checkpoint was committed."""
    logs = "".join(p.read_text(errors="replace") for p in sorted((run_dir / "logs").glob("learner-node*.log")))
    assert "did not stop within" not in logs
    # the newest by its timestamp: rank 0, which logs it, may run on another node in each life of the job
    lines = sorted(ln for ln in logs.splitlines() if "stopped by signal after step" in ln)
    assert lines, logs[-3000:]
    step = int(lines[-1].split("after step ")[1].split(";")[0])
    assert (run_dir / "out" / "checkpoints" / f"step_{step}" / "COMMITTED").exists()
    return step


def test_preempted_cancelled_and_resubmitted_job_trains_every_prompt_once(slurm: SlurmCluster, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    ports = {"RDZV_PORT": str(free_port()), "COORD_PORT": str(free_port()), "WS_PORT": str(free_port())}
    job = _submit(slurm, run_dir, ports, "--requeue", "--partition=low", vllm=False)

    # 1. preempted by a job of the higher-priority partition: stopped with a checkpoint, requeued by the script
    _wait_for("step 3", lambda: _trained_steps(run_dir) >= 3, slurm, job)
    slurm.run("sbatch", "--partition=high", "--nodes=3", "--exclusive", f"--output={tmp_path}/high.out", "--wrap=true")
    fields = slurm.wait_job(job, {"PENDING"}, timeout_s=90)
    assert fields["Restarts"] == "1", fields
    first = _stopped_at(run_dir)
    assert 3 <= first < STEPS
    # Skip Slurm's 2-minute requeue delay, but not its reason: a job restarted within the second its old allocation
    # was released is refused ("Job credential revoked", measured), so wait for idle nodes and a further 2 s.
    slurm.wait_idle(timeout_s=60)
    time.sleep(2.0)
    slurm.run("scontrol", "update", f"JobId={job}", "StartTime=now")

    # 2. the requeued job resumes from that checkpoint; scancel stops it with another
    _wait_for("3 steps after the resume", lambda: _trained_steps(run_dir) >= first + 3, slurm, job)
    slurm.run("scancel", str(job))
    assert slurm.wait_job(job, {"CANCELLED"}, timeout_s=90)["Restarts"] == "1"
    second = _stopped_at(run_dir)
    assert first + 3 <= second < STEPS

    # 3. submitted again (a new job id, the same RUN_DIR), with a vLLM actor: resumes and trains to the end
    again = _submit(slurm, run_dir, ports)
    fields = slurm.wait_job(again, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout_s=LIFE_S)
    assert fields["JobState"] == "COMPLETED", (run_dir / f"slurm-{again}.out").read_text()[-3000:]

    logs = {p.name for p in (run_dir / "logs").iterdir()}
    assert {"learner-node0.log", "learner-node1.log", "actor-node0.log", "actor-0.log"} <= logs
    resumed = [ln for ln in (run_dir / "logs" / "learner-node0.log").read_text().splitlines() if "resumed from" in ln]
    assert len(resumed) == 2 and f"step_{first} " in resumed[0] and f"step_{second} " in resumed[1], resumed
    assert [m["step"] for m in read_jsonl(run_dir / "out" / "metrics.jsonl")] == list(range(1, STEPS + 1))
    ids = [i for rec in read_jsonl(run_dir / "out" / AUDIT_FILE) for i in rec["prompt_ids"]]
    assert sorted(ids) == list(range(STEPS * BATCH))  # none lost, none trained twice
    assert (run_dir / "out" / "final_hf" / "config.json").exists()
