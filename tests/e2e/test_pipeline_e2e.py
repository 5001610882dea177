"""End to end on the real pieces: torchrun 2-rank FSDP2 learner (gloo) + one vLLM CPU actor over ZeroMQ, weight
broadcast every step, staleness bound K=1, validation rounds on the actor (before training, every 3 steps, at the
end); then a resume from the checkpoint that neither repeats nor skips prompts.

Started through ``launchers/local.py`` (process groups, logs per part). Uses the builtin tiny model: this checks the
wiring and the guarantees, not learning.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from _e2e_helpers import ROOT, launcher_command, read_jsonl

K = 1
BATCH = 8
VAL_PROMPTS = 8
# Validation: 8 of the arithmetic task's held-out problems, greedy, on versions 0 (before training), 3 and 6.
VALIDATION = (
    "data.val_files=builtin:arith",
    f"data.val_max_samples={VAL_PROMPTS}",
    "trainer.val_before_train=true",
    "trainer.test_freq=3",
)


def _command(run_dir: Path, steps: int, extra: tuple[str, ...] = ()) -> list[str]:
    overrides = [
        f"async_training.max_staleness={K}",
        "async_training.stale_policy=regrant",  # over-stale groups go back to the queue, so no prompt is skipped
        f"data.train_batch_size={BATCH}",
        "async_training.checkpoint.save_every_n_steps=3",
        "async_training.weight_sync.timeout_s=120",
        *extra,
    ]
    return launcher_command("smoke_grpo.yaml", run_dir, steps=steps, overrides=overrides)


def _launch(run_dir: Path, steps: int, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_command(run_dir, steps, extra), cwd=ROOT, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_async_grpo_pipeline_and_resume(tmp_path, assert_nothing_lost):
    run_dir = tmp_path / "run"
    first = _launch(run_dir, steps=6, extra=VALIDATION)
    assert first.returncode == 0, f"launcher failed:\n{first.stderr[-4000:]}"

    lines = read_jsonl(run_dir / "metrics.jsonl")
    metrics = [m for m in lines if "val/version" not in m]  # training steps; validation rounds are lines of their own
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5, 6]
    # Each round is logged at the step of the version it evaluated, before any later step's line.
    val = [m for m in lines if "val/version" in m]
    assert [(m["step"], m["val/version"]) for m in val] == [(0, 0), (3, 3), (6, 6)]
    assert [m["step"] for m in lines] == sorted(m["step"] for m in lines)
    for m in val:  # every prompt came back generated under exactly the pinned version (else it is granted again)
        assert m["val/num_samples"] == m["val/num_prompts"] == VAL_PROMPTS and m["val/prompts_missing"] == 0, m
        assert 0.0 <= m["val/reward_mean"] <= 1.0 and m["val/arith/reward_mean"] == m["val/reward_mean"]
        assert m["val-core/arith/reward/mean@1"] == m["val/reward_mean"]
        assert 0 < m["val/response_length_mean"] <= 8 and m["val/wall_s"] > 0
    assert metrics[-1]["transport/eval/rounds"] == 3 and metrics[-1]["transport/eval/wrong_version"] == 0
    for m in metrics:
        assert m["rollout/staleness_max"] <= K, m  # every trained group within the bound
        assert m["transport/duplicates"] == 0
        assert m["learner/batch/size"] == BATCH * 6  # rollout.n = 6 in the demo config
        assert m["sync/actors"] == 1.0 and m["sync/failures"] == 0.0  # weights reached the actor every step
    audit = read_jsonl(run_dir / "trained_groups.jsonl")
    for rec in audit:
        assert all(rec["step"] - 1 - v <= K for v in rec["start_versions"])
    first_ids = [i for rec in audit for i in rec["prompt_ids"]]
    assert len(first_ids) == len(set(first_ids)) == 6 * BATCH
    actor_log = (run_dir / "logs" / "actor-0.log").read_text()
    assert "now on policy version 5" in actor_log  # the actor loaded every published version it was sent
    assert (run_dir / "final_hf" / "config.json").exists()
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir() if not p.name.endswith(".tmp"))

    # Resume: the same run continues from the step-6 checkpoint to step 9.
    second = _launch(run_dir, steps=9)  # smoke_grpo.yaml alone: val_before_train false, test_freq -1, no rounds
    assert second.returncode == 0, f"resume failed:\n{second.stderr[-4000:]}"
    metrics = [m for m in read_jsonl(run_dir / "metrics.jsonl") if "val/version" not in m]
    assert [m["step"] for m in metrics][6:] == [7, 8, 9]
    audit = read_jsonl(run_dir / "trained_groups.jsonl")
    all_ids = [i for rec in audit for i in rec["prompt_ids"]]
    assert len(all_ids) == len(set(all_ids)) == 9 * BATCH  # no prompt group trained twice
    # Nothing skipped: the restored ledger still accounts for every prompt granted before the stop, and for all since.
    assert_nothing_lost(metrics)
    assert metrics[-1]["transport/dropped_total"] == 0

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(run_dir / "final_hf")
    assert sum(p.numel() for p in model.parameters()) > 0


@pytest.mark.slow
def test_learner_killed_mid_run_resumes_without_repeating_or_skipping(tmp_path, assert_nothing_lost, e2e_processes):
    """SIGKILL the whole job mid-run: the launcher, torchrun and the actor by process group. The learner ranks, each in
    a session of its own, are not in those groups: they leave because their parent died (runtime/parent_watch.py).
    A new launch then resumes from the last checkpoint."""
    import os
    import signal
    import time

    run_dir = tmp_path / "run"
    job = subprocess.Popen(
        _command(run_dir, steps=12), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while not (run_dir / "checkpoints" / "step_6").exists() or len(read_jsonl(run_dir / "metrics.jsonl")) < 7:
            assert job.poll() is None, "the job ended before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        # The launcher keeps every part in its own process group: kill those first, then the launcher's.
        for line in subprocess.run(["ps", "-eo", "pid,pgid,ppid"], capture_output=True, text=True).stdout.split("\n"):
            fields = line.split()
            if len(fields) == 3 and fields[2] == str(job.pid):
                try:
                    os.killpg(int(fields[1]), signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=60)
    # No orphan: the ranks stop (a stop checkpoint if a step was trained since the last one) and exit.
    left = e2e_processes.wait_gone(15.0)
    assert not left, f"still alive 15 s after the job was killed: {left}"
    killed_after = len(read_jsonl(run_dir / "metrics.jsonl"))
    assert killed_after >= 7

    resumed = _launch(run_dir, steps=12)
    assert resumed.returncode == 0, f"resume failed:\n{resumed.stderr[-4000:]}"
    assert "resumed from" in (run_dir / "logs" / "learner.log").read_text()
    audit = read_jsonl(run_dir / "trained_groups.jsonl")
    assert [rec["step"] for rec in audit] == list(range(1, 13))  # steps after the checkpoint were redone once
    ids = [i for rec in audit for i in rec["prompt_ids"]]
    assert len(ids) == len(set(ids)) == 12 * BATCH  # no prompt group trained twice in the model's history
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    # the resumed run's ledger (restored at step 6, or at the stop checkpoint the orphaned ranks wrote on their way)
    assert_nothing_lost([m for m in metrics if m["step"] > 6])
    assert metrics[-1]["transport/dropped_total"] == 0
