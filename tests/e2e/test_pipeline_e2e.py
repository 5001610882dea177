"""End to end on the real pieces: torchrun 2-rank FSDP2 learner (gloo) + one vLLM CPU actor over ZeroMQ, weight
broadcast every step, staleness bound K=1, validation rounds on the actor (before training, every 3 steps, at the
end); then resumes from checkpoints that neither repeat nor skip prompts, one after the run ended and one after the
whole job was SIGKILLed mid-run.

One job in three launches through ``launchers/local.py`` (process groups, logs per part), shared by the tests here
(module-scoped fixtures, each launch once): the first run of 6 steps with validation; a resume from its step-6
checkpoint towards step 12, SIGKILLed once it has trained past its step-9 checkpoint; and a resume from that to the
end. Each fixture reads what its launch left (logs, metrics, audit) as soon as it ends, before the next one rewrites
the logs. Uses the builtin tiny model: this checks the wiring and the guarantees, not learning.
"""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _e2e_helpers import ROOT, kill_job, launcher_command, read_jsonl

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
FIRST = 6  # steps of the first run
STEPS = 12  # where the resumed launches end
KILL_AFTER = 9  # the second launch is killed once this step's checkpoint exists and a later step was trained


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


@dataclass(frozen=True)
class Launch:
    """What one launch left behind, read as soon as it ended (and its processes were gone)."""

    run_dir: Path
    returncode: int | None  # None: killed by the test
    stderr: str
    lines: list[dict]  # metrics.jsonl: training steps and validation rounds, every launch so far
    audit: list[dict]  # trained_groups.jsonl
    learner_log: str
    actor_log: str
    final_hf: bool  # final_hf/config.json exists
    checkpoints: list[str]
    left: dict[int, str]  # processes of the job still alive afterwards (pid -> command line)

    @property
    def steps(self) -> list[dict]:
        """The training steps' lines (validation rounds are lines of their own)."""
        return [m for m in self.lines if "val/version" not in m]


def _read(run_dir: Path, returncode: int | None, stderr: str, left: dict[int, str]) -> Launch:
    ckpts = run_dir / "checkpoints"
    return Launch(
        run_dir=run_dir,
        returncode=returncode,
        stderr=stderr,
        lines=read_jsonl(run_dir / "metrics.jsonl"),
        audit=read_jsonl(run_dir / "trained_groups.jsonl"),
        learner_log=(run_dir / "logs" / "learner.log").read_text(),
        actor_log=(run_dir / "logs" / "actor-0.log").read_text(),
        final_hf=(run_dir / "final_hf" / "config.json").exists(),
        checkpoints=sorted(p.name for p in ckpts.iterdir() if not p.name.endswith(".tmp")) if ckpts.is_dir() else [],
        left=left,
    )


def _launch(shared_run: Any, steps: int, extra: tuple[str, ...] = ()) -> Launch:
    run_dir = shared_run.path / "run"
    done = subprocess.run(
        _command(run_dir, steps, extra), cwd=ROOT, capture_output=True, text=True, timeout=900, env=shared_run.env()
    )
    return _read(run_dir, done.returncode, done.stderr, shared_run.processes.wait_gone(20.0))


def _resumed_from(learner_log: str) -> int:
    found = re.findall(r"resumed from \S*step_(\d+) at policy version", learner_log)
    assert found, "no 'resumed from' in learner.log"
    return int(found[-1])


BF16_ACTOR = ("actor_rollout_ref.rollout.dtype=bfloat16",)  # the learner's fp32 master goes to it as bf16


@pytest.fixture(scope="module")
def first(shared_run: Any) -> Launch:
    """6 steps with validation rounds, from scratch, with a bf16 actor (the later launches' actor is fp32)."""
    return _launch(shared_run, steps=FIRST, extra=VALIDATION + BF16_ACTOR)


@pytest.fixture(scope="module")
def killed(shared_run: Any, first: Launch) -> Launch:
    """A resume of the first run towards step 12, SIGKILLed mid-run: the launcher, torchrun and the actor by process
    group. The learner ranks, each in a session of its own, are not in those groups: they leave because their parent
    died (runtime/parent_watch.py)."""
    assert first.returncode == 0, f"the first launch failed:\n{first.stderr[-4000:]}"
    run_dir = shared_run.path / "run"
    job = subprocess.Popen(
        _command(run_dir, steps=STEPS), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, env=shared_run.env(),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 600

        def trained() -> int:
            return len([m for m in read_jsonl(run_dir / "metrics.jsonl") if "val/version" not in m])

        while not (run_dir / "checkpoints" / f"step_{KILL_AFTER}").exists() or trained() < KILL_AFTER + 1:
            assert job.poll() is None, "the job ended before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        kill_job(job)  # every part's process group, then the launcher's
    # No orphan: the ranks stop (a stop checkpoint if a step was trained since the last one) and exit.
    return _read(run_dir, None, "", shared_run.processes.wait_gone(15.0))


@pytest.fixture(scope="module")
def resumed(shared_run: Any, killed: Launch) -> Launch:
    """A new launch after the kill: it resumes from the last checkpoint and runs to step 12."""
    return _launch(shared_run, steps=STEPS)


@pytest.mark.slow
def test_async_grpo_pipeline_with_validation_rounds(first: Launch) -> None:
    assert first.returncode == 0, f"launcher failed:\n{first.stderr[-4000:]}"
    assert not first.left, f"still alive after the launcher exited: {first.left}"
    lines, metrics = first.lines, first.steps
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5, 6]
    # Each round is logged at the step of the version it evaluated, once the learner sees it complete (it looks once
    # per step, after publishing): so after the line of the step before that version (the round starts when the
    # version is published), and usually before the next step's, though a round beside training may outlast a step.
    val = [m for m in lines if "val/version" in m]
    assert [(m["step"], m["val/version"]) for m in val] == [(0, 0), (3, 3), (6, 6)]
    steps = [m["step"] for m in lines if "val/version" not in m]
    assert steps == sorted(steps)
    for i, m in enumerate(lines):
        if "val/version" in m and m["step"] > 0:
            before = next(j for j, t in enumerate(lines) if "val/version" not in t and t["step"] == m["step"] - 1)
            assert before < i, (m["step"], [t["step"] for t in lines])
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
        assert m["sync/wire_bits"] == 16.0  # sent in the dtype the actor serves, and loaded (the log line below)
        # every step publishes; the wait for an older round before it counts as the learner's idle time
        assert 0.0 <= m["learner/validation_wait_s"] and 0.0 <= m["learner/idle_fraction"] <= 1.0, m
    for rec in first.audit:
        assert all(rec["step"] - 1 - v <= K for v in rec["start_versions"])
    first_ids = [i for rec in first.audit for i in rec["prompt_ids"]]
    assert len(first_ids) == len(set(first_ids)) == FIRST * BATCH
    assert "now on policy version 5" in first.actor_log  # the actor loaded every published version it was sent
    assert first.final_hf
    assert first.checkpoints


@pytest.mark.slow
def test_resume_continues_after_the_last_step_of_the_ended_run(killed: Launch, assert_nothing_lost) -> None:
    """The second launch (smoke_grpo.yaml alone: val_before_train false, test_freq -1, no rounds) went on from the
    first run's step-6 checkpoint: its steps follow step 6 with none repeated or skipped."""
    assert _resumed_from(killed.learner_log) == FIRST
    steps = [m["step"] for m in killed.steps]
    assert len(steps) >= KILL_AFTER + 1
    assert steps == list(range(1, len(steps) + 1))  # 1-6 from the first run, then 7, 8, ...
    # the audit may hold one step more: a step killed after its update, before its metrics line
    audited = [rec["step"] for rec in killed.audit]
    assert audited == list(range(1, len(audited) + 1)) and len(audited) >= len(steps)
    ids = [i for rec in killed.audit for i in rec["prompt_ids"]]
    assert len(ids) == len(set(ids)) == len(audited) * BATCH  # no prompt group trained twice
    # Nothing skipped: the restored ledger still accounts for every prompt granted before the stop, and for all since.
    assert_nothing_lost(killed.steps)


@pytest.mark.slow
def test_learner_killed_mid_run_leaves_no_process_behind(killed: Launch) -> None:
    """SIGKILL to the whole job (launcher, torchrun, actor): the orphaned learner ranks exit by themselves."""
    assert not killed.left, f"still alive 15 s after the job was killed: {killed.left}"
    assert f"step_{KILL_AFTER}" in killed.checkpoints


@pytest.mark.slow
def test_learner_killed_mid_run_resumes_without_repeating_or_skipping(resumed: Launch, assert_nothing_lost) -> None:
    assert resumed.returncode == 0, f"resume failed:\n{resumed.stderr[-4000:]}"
    assert not resumed.left, f"still alive after the launcher exited: {resumed.left}"
    start = _resumed_from(resumed.learner_log)  # step 9, or the stop checkpoint the orphaned ranks wrote on their way
    assert start >= KILL_AFTER
    assert [rec["step"] for rec in resumed.audit] == list(range(1, STEPS + 1))  # steps after the checkpoint redone once
    ids = [i for rec in resumed.audit for i in rec["prompt_ids"]]
    assert len(ids) == len(set(ids)) == STEPS * BATCH  # no prompt group trained twice in the model's history
    steps = [m["step"] for m in resumed.steps]
    assert steps[-(STEPS - start) :] == list(range(start + 1, STEPS + 1))
    # the ledger at every logged step: the first run's, the killed run's, and the one restored after the kill
    assert_nothing_lost(resumed.steps)
    assert resumed.steps[-1]["transport/dropped_total"] == 0
    wire = {m["step"]: m["sync/wire_bits"] for m in resumed.steps if "sync/wire_bits" in m}
    assert wire[FIRST] == 16.0  # the first launch's bf16 actor
    assert {bits for step, bits in wire.items() if step > FIRST} == {32.0}  # then fp32 actors: the master as it is

    from transformers import AutoModelForCausalLM

    assert resumed.final_hf
    model = AutoModelForCausalLM.from_pretrained(resumed.run_dir / "final_hf")
    assert sum(p.numel() for p in model.parameters()) > 0
