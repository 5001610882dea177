"""Multi-turn episodes end to end: the tiny model plays the guessing game through the launcher, real everything.

Two vLLM actors play the game (``async_rl.envs.guessing`` in each actor's sandboxed environment worker) against a
2-rank FSDP learner; one actor is SIGKILLed while its episodes are in flight. The run must finish, with:

* episodes of several turns on the wire, and the loss mask intact at the learner: the tokens the learner trains
  (``learner/batch/sampled_length_mean``, from the collated ``loss_mask``) are exactly the tokens the actors
  sampled (``rollout/sampled_tokens_mean``, from the turns), fewer than the response tokens (observations are in
  the sequence but out of the loss). That observation tokens then get zero gradient is the unit test
  tests/learner/test_multiturn_loss_mask.py;
* exactly-once episodes: the killed actor's leased prompts are granted again, whole, no prompt is trained twice and
  the ledger loses none.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from _e2e_helpers import ROOT, launcher_command, read_jsonl

MAX_STEPS = 60  # an upper bound: the test stops the run
TINY_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '<eos>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)
MT = "actor_rollout_ref.rollout.multi_turn"


@pytest.mark.slow
def test_guessing_game_trains_masked_episodes_and_survives_an_actor_killed_mid_episode(
    tmp_path: Path, assert_nothing_lost
) -> None:
    run_dir = tmp_path / "run"
    overrides = [
        "data.train_files=builtin:guessing",
        "data.val_files=null",
        "data.max_prompt_length=192",  # the guessing prompt is ~150 characters = tokens for the char-level model
        "data.max_response_length=96",
        "data.train_batch_size=4",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.use_kl_loss=false",
        f"actor_rollout_ref.model.custom_chat_template={TINY_TEMPLATE}",
        f"{MT}.enable=true",
        f"{MT}.environment=async_rl.envs.guessing:GuessingEnv",
        f"{MT}.max_assistant_turns=4",
        "async_training.max_staleness=1",
        "async_training.launcher.actor_failure=continue",
        "async_training.transport.heartbeat_interval_s=0.5",
        "async_training.transport.peer_timeout_s=3.0",
        # 2 groups per actor: the in-flight cap ((K + 1) steps of 4 prompts) leaves leases for actor-1 too, so it
        # holds some when it is killed
        "async_training.actor.max_concurrent_groups=2",
    ]
    cmd = launcher_command("smoke_grpo.yaml", run_dir, steps=MAX_STEPS, actors=2, overrides=overrides)
    log = tmp_path / "launcher.log"
    with log.open("wb") as out:
        job = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    # The kill must land while actor-1 holds leases: the moment it logs its first group, that group's episodes are
    # being played (a group takes seconds; the log is polled every 0.1 s). Waiting for some step count first would let
    # it finish its groups and sit idle on the in-flight cap, holding nothing (seen in CI). The test, not a step count,
    # ends the run, with SIGTERM (a graceful stop at a step boundary) once the kill has been noticed and handled.
    killed_at = stop_after = None
    try:
        deadline = time.monotonic() + 900
        while job.poll() is None:
            assert time.monotonic() < deadline, "the run did not finish in 900 s"
            steps = [m for m in read_jsonl(run_dir / "metrics.jsonl") if "val/version" not in m]
            actor_log = run_dir / "logs" / "actor-1.log"
            if killed_at is None and actor_log.exists() and "started its first group" in actor_log.read_text():
                pid = re.search(r"started actor-1 \(pid (\d+)\)", log.read_text())
                assert pid, log.read_text()[-3000:]
                os.killpg(int(pid.group(1)), signal.SIGKILL)  # vLLM, the env worker and all: mid-episode
                killed_at = len(steps)
            handled = steps and steps[-1]["transport/actors_presumed_dead"] >= 1
            if killed_at is not None and handled and stop_after is None:
                stop_after = len(steps) + 2  # a few steps trained on the re-granted prompts
            if stop_after is not None and len(steps) >= stop_after:
                os.killpg(job.pid, signal.SIGTERM)
                job.wait(timeout=120)
            time.sleep(0.1 if killed_at is None else 0.5)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=60)
    text = log.read_text()
    assert job.returncode in (0, 128 + signal.SIGTERM), text[-4000:]
    assert killed_at is not None and stop_after is not None, "actor-1 was not killed, or its death went unnoticed"

    steps = [m for m in read_jsonl(run_dir / "metrics.jsonl") if "val/version" not in m]
    assert [m["step"] for m in steps] == list(range(1, len(steps) + 1)) and len(steps) >= stop_after
    # Episodes: several turns, and the learner trains exactly the sampled tokens of them.
    assert max(m["rollout/num_turns_max"] for m in steps) >= 2
    for m in steps:
        assert m["learner/batch/sampled_length_mean"] == pytest.approx(m["rollout/sampled_tokens_mean"])
        assert m["learner/batch/response_length_mean"] == pytest.approx(m["rollout/response_length_mean"])
    multi = [m for m in steps if m["rollout/num_turns_mean"] > 1]
    assert multi and all(
        m["learner/batch/sampled_length_mean"] < m["learner/batch/response_length_mean"] for m in multi
    )
    assert all(m["rollout/template_mismatches"] == 0 for m in steps)
    # Exactly once: the killed actor was noticed, its prompts granted again whole, none trained twice or lost.
    last = steps[-1]
    assert last["transport/actors_presumed_dead"] >= 1
    assert last["transport/lease_expiries"] >= 1  # the episode groups it was playing, granted again
    assert last["transport/duplicates"] == 0
    audit = read_jsonl(run_dir / "trained_groups.jsonl")
    ids = [i for rec in audit for i in rec["prompt_ids"]]
    assert len(ids) == len(set(ids)) and len(ids) in (len(steps) * 4, (len(steps) + 1) * 4)  # + a step cut by the stop
    assert_nothing_lost(steps)
