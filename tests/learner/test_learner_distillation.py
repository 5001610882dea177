"""On-policy distillation with the teacher on the learner (``distillation.teacher_model.placement: learner``): the
teacher's log-probs are those of the teacher model on the exact response tokens, a teacher equal to the student gives
no gradient, and the placement needs a teacher."""

from __future__ import annotations

import pytest
import torch
from _learner_testlib import START, scripted_groups, settings, tiny_policy

from async_rl.config import Config
from async_rl.learner import Learner, local_context


def _distilling(placement: str = "learner") -> Config:
    cfg = settings(ppo_mini_batch_size=4)  # one optimizer step per train step
    cfg.actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype = "fp32"  # exact comparisons on any host
    d = cfg.distillation
    d.enabled = True
    d.teacher_model.model_path = "unused: the test passes the model"
    d.teacher_model.placement = placement  # type: ignore[assignment]
    d.distillation_loss.loss_mode = "k1"
    d.distillation_loss.use_task_rewards = False
    return cfg


def _reference_log_probs(model: torch.nn.Module, batch) -> torch.Tensor:
    """Each row's response log-probs from a plain forward of prompt + response (no padding, no packing)."""
    out = torch.zeros_like(batch.rollout_log_probs)
    for i in range(len(batch)):
        p, t = int(batch.prompt_lengths[i]), int(batch.response_lengths[i])
        ids = batch.input_ids[i, batch.prompt_width - p : batch.prompt_width + t][None]
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
        out[i, :t] = logp[p - 1 : p + t - 1].gather(1, ids[0, p:, None])[:, 0]
    return out


def test_the_teachers_log_probs_are_the_teacher_models_on_the_sampled_tokens() -> None:
    learner = Learner(_distilling(), START, local_context(), tiny_policy, teacher=lambda: tiny_policy(seed=1))
    groups, prompts = scripted_groups(4, 4, seed=5)
    batch = learner.collate(groups, prompts)
    metrics = learner.train_batch(batch, [g.prompt_id for g in groups])
    assert batch.teacher_log_probs is not None
    expected = _reference_log_probs(tiny_policy(seed=1), batch)
    torch.testing.assert_close(batch.teacher_log_probs, expected, atol=1e-5, rtol=0)
    gap = (batch.rollout_log_probs - expected)[batch.response_mask.bool()].mean()
    assert metrics["learner/distillation/reverse_kl"] == pytest.approx(float(gap), abs=1e-5)
    assert metrics["learner/distillation/abs_estimate"] > 0.01 and metrics["learner/actor/grad_norm"] > 0


def _first_gradient(teacher: object) -> tuple[float, dict[str, float]]:
    learner = Learner(_distilling(), START, local_context(), tiny_policy, teacher=teacher)
    grads: list[float] = []
    learner.actor.grad_hook = lambda m: grads.append(
        sum(float(p.grad.abs().sum()) for p in m.parameters() if p.grad is not None)
    )
    metrics = learner.train_step(*scripted_groups(4, 4, seed=5))
    assert len(grads) == 1
    return grads[0], metrics


def test_a_teacher_equal_to_the_student_gives_no_gradient() -> None:
    same, metrics = _first_gradient(tiny_policy)
    other, _ = _first_gradient(lambda: tiny_policy(seed=1))
    # the same weights in another micro-batch layout: log-probs equal to float rounding, so the signal is rounding
    assert metrics["learner/distillation/abs_estimate"] < 1e-6
    assert same < 1e-6 * other and other > 1.0


def test_the_learner_placement_needs_the_teacher() -> None:
    with pytest.raises(ValueError, match="placement=learner"):
        Learner(_distilling(), START, local_context(), tiny_policy)
    # with the teacher on the actors the learner builds none, and a batch without the teacher's scores is refused
    learner = Learner(_distilling("actor"), START, local_context(), tiny_policy)
    assert learner.teacher is None
    with pytest.raises(ValueError, match="no teacher log-probs"):
        learner.train_step(*scripted_groups(2, 4, seed=5))
