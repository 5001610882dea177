"""End to end with an emulated actor: launcher + 2-rank FSDP2 learner (gloo) + coordinator + weight broadcast every
step, and one ``--emulate-tokens-per-s`` actor (real actor loop, rollout client and weight receiver; no vLLM).

The actor's rate is set so that generation, not the learner, limits the run: the measured throughput must then be
close to the configured generation capacity (loosely: the machine is shared), every trained group within K, every
completion exactly the emulated length, and every published version received by the actor. With validation rounds that
outlast learner steps, the actor holds back the versions published during a round and the learner never waits.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from _e2e_helpers import ROOT, launcher_command, read_jsonl

K = 1
BATCH = 8
N = 2
LENGTH = 8
STEPS = 8
WARMUP = 2
TOKENS_PER_S = 256.0  # 8 groups x 2 x 8 tokens = 128 tokens per step: 2 steps/s of generation, 16 groups/s
FLAGS = ["--emulate-tokens-per-s", str(TOKENS_PER_S), "--emulate-response-len", str(LENGTH)]
SHAPE = [  # BATCH prompts x N completions a step, one optimizer step, one micro-batch per rank, lag <= K
    f"data.train_batch_size={BATCH}",
    f"actor_rollout_ref.rollout.n={N}",
    f"actor_rollout_ref.actor.ppo_mini_batch_size={BATCH}",
    f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={BATCH * N // 2}",
    f"async_training.max_staleness={K}",
]


@pytest.mark.slow
def test_emulated_actor_drives_the_real_pipeline_at_its_rate(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    overrides = [
        *SHAPE,
        "trainer.val_before_train=false",  # no validation rounds at the emulated 256 tokens/s
        "trainer.test_freq=-1",
    ]
    cmd = launcher_command("demo_grpo.yaml", run_dir, steps=STEPS, flags=FLAGS, overrides=overrides)
    # subprocess.run kills only the launcher on timeout; the launcher's own SIGTERM handling stops its parts.
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"launcher failed:\n{done.stderr[-4000:]}"

    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    for m in metrics:
        assert m["rollout/staleness_max"] <= K, m  # every trained group within the bound
        assert m["learner/batch/size"] == BATCH * N
        assert m["rollout/response_length_mean"] == LENGTH
        assert m["sync/actors"] == 1.0 and m["sync/failures"] == 0.0
        assert 0.0 <= m["rollout/reward_mean"] < 1.0  # the emulated scorer's pseudo-random rewards
    audit = read_jsonl(run_dir / "trained_groups.jsonl")
    assert all(rec["step"] - 1 - v <= K for rec in audit for v in rec["start_versions"])
    ids = [i for rec in audit for i in rec["prompt_ids"]]
    assert len(ids) == len(set(ids)) == STEPS * BATCH

    # Generation limits the run: groups/s after warm-up near the configured capacity (loose: a shared 2-core box,
    # plus the actor's pause while it receives each update).
    capacity = TOKENS_PER_S / (N * LENGTH)
    wall = {m["step"]: m["time/wall_s"] for m in metrics}
    measured = (STEPS - WARMUP) * BATCH / (wall[STEPS] - wall[WARMUP])
    assert 0.5 * capacity <= measured <= 1.3 * capacity, (measured, capacity)

    actor_log = (run_dir / "logs" / "actor-0.log").read_text()
    assert f"now on policy version {STEPS - 1}" in actor_log  # every published version was received and verified
    summary = json.loads([line for line in actor_log.splitlines() if line.startswith("{")][-1])
    assert summary["actor/groups_sent"] >= STEPS * BATCH
    assert summary["actor/update_failures"] == 0.0
    assert summary["actor/emulated/tokens_per_s"] == TOKENS_PER_S


@pytest.mark.slow
def test_versions_published_during_a_round_are_held_back_and_the_learner_never_waits(tmp_path: Path) -> None:
    """Validation rounds of 32 prompts (1 s of the emulated actor's generation, several learner steps): the learner
    publishes every version without waiting for the round on the actor, which receives each one at once and loads it
    only once the round is done, so every round completes on its own version's weights."""
    run_dir = tmp_path / "run"
    steps, every, prompts = 6, 2, 32
    overrides = [
        *SHAPE,
        "trainer.val_before_train=true",
        f"trainer.test_freq={every}",
        f"data.val_max_samples={prompts}",
        "actor_rollout_ref.rollout.val_kwargs.n=1",
    ]
    cmd = launcher_command("demo_grpo.yaml", run_dir, steps=steps, flags=FLAGS, overrides=overrides)
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"launcher failed:\n{done.stderr[-4000:]}"

    records = read_jsonl(run_dir / "metrics.jsonl")
    metrics = [m for m in records if "val/version" not in m]
    rounds = [m for m in records if "val/version" in m]
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))
    assert all(m["learner/validation_wait_s"] == 0.0 for m in metrics)  # no publish waited for a round
    assert sorted(int(m["val/version"]) for m in rounds) == list(range(0, steps + 1, every))
    for m in rounds:  # every round complete, on its own version (a sample from a later one would be granted again)
        assert m["val/num_prompts"] == prompts and m["val/prompts_missing"] == 0.0 and m["val/num_samples"] == prompts
    assert metrics[-1]["transport/eval/wrong_version"] == 0 and metrics[-1]["transport/eval/duplicates"] == 0

    actor_log = (run_dir / "logs" / "actor-0.log").read_text()
    assert "until its validation round on version" in actor_log  # a version arrived while a round ran: held
    summary = json.loads([line for line in actor_log.splitlines() if line.startswith("{")][-1])
    assert summary["actor/updates_held"] >= 1 and summary["actor/update_failures"] == 0.0
    assert summary["actor/eval_groups_sent"] == prompts * len(rounds)  # each prompt once: no round was re-granted
