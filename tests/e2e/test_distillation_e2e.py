"""On-policy distillation end to end on the tiny model (launchers/local.py, a real vLLM actor with a real vLLM teacher
engine, ZeroMQ, FSDP2 on 2 ranks, the weight sync): the teacher scores exactly the tokens the student sampled, and a
teacher identical to the student gives no signal. The teacher on the learner runs end to end in the pipeline test
(tests/launchers/test_pipeline_launcher.py, an 'opd' stage)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from _e2e_helpers import ROOT, launcher_command, read_jsonl

STEPS = 3
TEACHER = [
    "distillation.enabled=true",
    "distillation.teacher_model.placement=actor",  # a teacher engine on the actor (the learner's: the pipeline test)
    "distillation.distillation_loss.loss_mode=k1",
    "distillation.distillation_loss.use_task_rewards=false",  # the teacher's signal alone
]
FP32 = [
    "actor_rollout_ref.rollout.dtype=float32",
    "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
]


@pytest.mark.slow
def test_a_teacher_identical_to_the_student_scores_its_exact_tokens_and_gives_no_signal(
    tmp_path: Path, e2e_processes
) -> None:
    """The teacher is the student's own initial model, in fp32 on both sides: on the samples of version 0 the teacher's
    prefill log-probs must equal the actor's sampling log-probs token for token (an off-by-one alignment would be off
    by nats), and the distillation term and its gradient are ~0, so the student stays where it is."""
    run_dir = tmp_path / "run"
    cmd = launcher_command(
        "smoke_grpo.yaml",
        run_dir,
        steps=STEPS,
        overrides=[*TEACHER, "distillation.teacher_model.model_path=builtin:tiny-arith", *FP32],
    )
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    steps = [m for m in read_jsonl(run_dir / "metrics.jsonl") if "learner/distillation/reverse_kl" in m]
    assert [m["step"] for m in steps] == list(range(1, STEPS + 1))
    first = steps[0]
    assert first["learner/staleness/max"] == 0  # every sample of step 1 is version 0's: the teacher's own weights
    assert abs(first["learner/distillation/reverse_kl"]) < 1e-5  # teacher log-prob == behaviour log-prob
    for m in steps:
        assert m["learner/distillation/abs_estimate"] < 0.05  # the learner's student vs the teacher, per token
        assert abs(m["learner/distillation/loss"]) < 1e-3
        assert m["learner/actor/pg_loss"] == 0.0  # use_task_rewards=false: the task term is not trained ...
        assert m["transport/drops/invalid_bad_teacher_logprobs"] == 0  # ... and every group came scored
    assert first["learner/actor/grad_norm"] < 0.01
    # the teacher engine ran on the actor and scored every trained sample; the actor prints its exit summary as its
    # loop ends, before its two engines shut down (which under load can outlast the launcher's grace period)
    actor_log = (run_dir / "logs" / "actor-0.log").read_text()
    assert "teacher engine up" in actor_log
    summaries = [line for line in actor_log.splitlines() if '"actor/teacher/requests"' in line]
    assert len(summaries) == 1, actor_log[-3000:]
    summary = json.loads(summaries[0])
    trained = STEPS * 8 * 6  # steps x train_batch_size x rollout.n
    assert summary["actor/teacher/requests"] >= trained and summary["actor/teacher/tokens"] > trained
