"""The learner's AdamW: its state is made when the optimizer is built, exactly as its first step would make it."""

from __future__ import annotations

import copy

import torch
from torch import nn

from async_rl.config.common import OptimConfig
from async_rl.learner.optim import build_optimizer, materialize_state


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        model(torch.randn(4, 6, generator=gen)).square().mean().backward()
        optimizer.step()


def test_state_exists_before_the_first_step_and_training_is_unchanged() -> None:
    optim = OptimConfig(lr=1e-2, weight_decay=0.1)
    model = _model()
    optimizer, _ = build_optimizer(model, optim, run_steps=3, section="actor_rollout_ref.actor.optim")
    for p in model.parameters():
        state = optimizer.state[p]
        assert float(state["step"]) == 0.0 and state["step"].dtype == torch.float32
        assert torch.count_nonzero(state["exp_avg"]) == 0 and torch.count_nonzero(state["exp_avg_sq"]) == 0
        assert state["exp_avg"].shape == p.shape
    # against torch's own lazy initialisation (the same AdamW, state made inside its first step)
    lazy_model = copy.deepcopy(model)
    group = optimizer.param_groups[0]  # the schedule's lr at step 0, the config's betas
    lazy = torch.optim.AdamW(
        lazy_model.parameters(), lr=group["lr"], betas=group["betas"], weight_decay=0.1, eps=group["eps"], fused=True
    )
    _train(model, optimizer, 3)
    _train(lazy_model, lazy, 3)
    for a, b in zip(model.parameters(), lazy_model.parameters(), strict=True):
        assert torch.equal(a, b)
    for p, q in zip(model.parameters(), lazy_model.parameters(), strict=True):
        assert optimizer.state[p].keys() == lazy.state[q].keys()
        assert float(optimizer.state[p]["step"]) == float(lazy.state[q]["step"]) == 3.0


def test_existing_state_is_left_alone() -> None:
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    _train(model, optimizer, 2)
    before = {k: v.clone() for k, v in optimizer.state[next(model.parameters())].items()}
    materialize_state(optimizer)
    after = optimizer.state[next(model.parameters())]
    assert float(after["step"]) == 2.0
    assert all(torch.equal(before[k], after[k]) for k in before)
