"""On-policy distillation's loss term: the per-token signal by hand, zero signal from an identical teacher, the clamps,
and how the objective combines it with the task's policy-gradient term."""

import dataclasses
import math

import pytest
import torch

from async_rl.algorithms.distillation import DistillSpec, distillation_estimate, distillation_loss
from async_rl.algorithms.objective import ActorMicroBatch, actor_objective
from async_rl.config import load_config
from async_rl.learner.objective_spec import objective_spec

OPD = DistillSpec(
    loss_mode="k1",
    use_policy_gradient=True,
    policy_loss_mode="vanilla",
    use_task_rewards=True,
    distillation_loss_coef=1.0,
    task_loss_coef=1.0,
    loss_max_clamp=10.0,
    log_prob_min_clamp=-10.0,
    clip_ratio=0.2,
    clip_ratio_low=0.2,
    clip_ratio_high=0.2,
)
GKD = dataclasses.replace(OPD, loss_mode="k3", use_policy_gradient=False)


def _loss(spec: DistillSpec, student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor, **kw):
    return distillation_loss(
        student,
        student.detach(),  # on-policy: the old policy is the current one (ratio 1)
        teacher,
        mask,
        spec,
        loss_agg_mode=kw.get("agg", "token-mean"),
        loss_scale_factor=None,
        is_weights=kw.get("is_weights"),
        global_num_tokens=kw.get("tokens"),
        global_num_seqs=None,
    )


def test_policy_gradient_signal_by_hand() -> None:
    # two rows; the last token of row 1 is padding
    student = torch.tensor([[math.log(0.5), math.log(0.25)], [math.log(0.8), -3.0]], requires_grad=True)
    teacher = torch.tensor([[math.log(0.25), math.log(0.5)], [math.log(0.4), 0.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    loss, metrics = _loss(OPD, student, teacher, mask)
    # A_t = log pi_teacher - log pi_student: -ln2, +ln2, -ln2; ratio 1, so the PPO term is mean(-A) over 3 tokens
    advantage = torch.tensor([[-math.log(2), math.log(2)], [-math.log(2), 0.0]])
    assert loss.item() == pytest.approx(math.log(2) / 3, abs=1e-6)
    (grad,) = torch.autograd.grad(loss, student)
    # d(-A * exp(lp - old)) / d lp = -A at ratio 1, divided by the 3 tokens; nothing on padding
    torch.testing.assert_close(grad, -advantage * mask / 3)
    assert metrics["estimate_max"].item() == pytest.approx(math.log(2), abs=1e-6)
    assert metrics["estimate_min"].item() == pytest.approx(-math.log(2), abs=1e-6)
    assert metrics["abs_estimate"].item() == pytest.approx(math.log(2), abs=1e-6)
    assert metrics["pg_clipfrac"].item() == 0.0


@pytest.mark.parametrize("spec", [OPD, GKD, dataclasses.replace(GKD, loss_mode="k2")], ids=["k1-pg", "k3", "k2"])
def test_a_student_identical_to_the_teacher_gets_no_signal(spec: DistillSpec) -> None:
    torch.manual_seed(0)
    student = torch.log_softmax(torch.randn(3, 5, 7), -1)[..., 0].clone().requires_grad_(True)
    teacher = student.detach().clone()
    mask = torch.ones(3, 5, dtype=torch.long)
    loss, metrics = _loss(spec, student, teacher, mask)
    (grad,) = torch.autograd.grad(loss, student)
    assert loss.item() == 0.0
    assert torch.count_nonzero(grad) == 0
    assert metrics["abs_estimate"].item() == 0.0


def test_direct_k3_loss_and_gradient_by_hand() -> None:
    student = torch.tensor([[math.log(0.5), math.log(0.25)]], requires_grad=True)
    teacher = torch.tensor([[math.log(0.25), math.log(0.5)]])
    loss, _ = _loss(GKD, student, teacher, torch.ones(1, 2))
    # k3 = exp(d) - d - 1, d = teacher - student: token 0 d = -ln2 -> .5 + ln2 - 1; token 1 d = ln2 -> 1 - ln2
    assert loss.item() == pytest.approx(((0.5 + math.log(2) - 1) + (1 - math.log(2))) / 2, abs=1e-6)
    (grad,) = torch.autograd.grad(loss, student)
    # d k3 / d student = 1 - exp(d): token 0: 1 - .5, token 1: 1 - 2; token mean over 2
    torch.testing.assert_close(grad, torch.tensor([[0.5 / 2, -1.0 / 2]]))


def test_log_prob_floor_and_estimate_clamp() -> None:
    student = torch.tensor([[-1.0, -12.0]])
    teacher = torch.tensor([[-30.0, -11.0]])
    estimate = distillation_estimate(student, teacher, OPD)
    # token 0: -1 - max(-30, -10) = 9; token 1: max(-12, -10) - max(-11, -10) = 0
    torch.testing.assert_close(estimate, torch.tensor([[9.0, 0.0]]))
    tight = dataclasses.replace(OPD, loss_max_clamp=5.0, log_prob_min_clamp=None)
    torch.testing.assert_close(distillation_estimate(student, teacher, tight), torch.tensor([[5.0, -1.0]]))


def test_importance_weights_scale_the_policy_gradient_term() -> None:
    student = torch.tensor([[math.log(0.5), math.log(0.25)]], requires_grad=True)
    teacher = torch.tensor([[math.log(0.25), math.log(0.25)]])
    weights = torch.tensor([[0.5, 2.0]])
    loss, _ = _loss(OPD, student, teacher, torch.ones(1, 2), is_weights=weights)
    # A = (-ln2, 0): token mean of -A * w = (ln2 * .5 + 0) / 2
    assert loss.item() == pytest.approx(math.log(2) * 0.5 / 2, abs=1e-6)


def _micro(teacher: torch.Tensor | None) -> ActorMicroBatch:
    log_prob = torch.tensor([[math.log(0.5), math.log(0.25)]], requires_grad=True)
    return ActorMicroBatch(
        log_prob=log_prob,
        entropy=torch.zeros(1, 2),
        old_log_prob=log_prob.detach(),
        rollout_log_prob=log_prob.detach(),
        advantages=torch.tensor([[1.0, 1.0]]),
        loss_mask=torch.ones(1, 2, dtype=torch.bool),
        is_weights=None,
        ref_log_prob=None,
        global_num_tokens=2.0,
        global_num_seqs=1.0,
        teacher_log_prob=teacher,
    )


def _spec(*overrides: str):
    cfg = load_config(
        [],
        [
            "distillation.enabled=true",
            "distillation.teacher_model.model_path=builtin:tiny-arith",
            "distillation.distillation_loss.loss_mode=k1",
            *overrides,
        ],
    )
    return objective_spec(cfg.actor_rollout_ref.actor, cfg.algorithm.rollout_correction, cfg.distillation)


def test_the_objective_adds_the_term_to_the_task_loss_with_its_coefficients() -> None:
    # task term: A = 1 at ratio 1 -> -1; distillation term: A_d = (-ln2, -ln2) -> +ln2
    teacher = torch.tensor([[math.log(0.25), math.log(0.125)]])
    combined = actor_objective(
        _micro(teacher),
        _spec(
            "distillation.distillation_loss.distillation_loss_coef=0.5",
            "distillation.distillation_loss.task_loss_coef=2.0",
        ),
    )
    assert combined.pg_loss.item() == pytest.approx(-1.0)
    assert combined.distill_metrics["loss"].item() == pytest.approx(math.log(2), abs=1e-6)
    assert combined.loss.item() == pytest.approx(2.0 * -1.0 + 0.5 * math.log(2), abs=1e-6)
    alone = actor_objective(_micro(teacher), _spec("distillation.distillation_loss.use_task_rewards=false"))
    assert alone.loss.item() == pytest.approx(math.log(2), abs=1e-6)


def test_the_objective_refuses_a_batch_without_teacher_log_probs() -> None:
    with pytest.raises(ValueError, match="teacher"):
        actor_objective(_micro(None), _spec())
