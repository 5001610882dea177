"""Multi-turn episodes in the learner: observation tokens (tool output, template glue the model did not sample) are
context for the forward pass but get no loss, no gradient and no count; the behaviour log-probs written there (0 by
convention) are never read.

Every episode here is ``[a1 a2 | o1 o2 o3 | a3 a4]``: two model turns around three observation tokens.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
import torch
from _learner_testlib import START, Prompts, layout, settings, tiny_critic, tiny_policy

from async_rl.learner import Learner, local_context
from async_rl.learner.batching import collate_groups, local_group
from async_rl.learner.update import mini_batch_counts
from async_rl.transport.codec import WireCodec
from async_rl.transport.protocol import RolloutGroup, TurnSpan, make_completion

MASK = [1, 1, 0, 0, 0, 1, 1]
OBS, SAMPLED = [2, 3, 4], [0, 1, 5, 6]
PROMPT_LEN = 3


def _episodes(obs_logprob: float = 0.0) -> tuple[list[RolloutGroup], Prompts]:
    """2 groups x 2 episodes, distinct tokens per row, rewards 0 and 1 in each group (GRPO advantages -+0.707)."""
    groups, prompts = [], {}
    for g in range(2):
        completions = []
        for i in range(2):
            base = 10 + 8 * (2 * g + i)
            logprobs = [-4.0 - 0.1 * k if m else obs_logprob for k, m in enumerate(MASK)]
            tokens = [base + k for k in range(7)]
            completions.append(make_completion(tokens, logprobs, version_min=0, reward=float(i), loss_mask=MASK))
        groups.append(local_group(g, completions))
        prompts[g] = [1 + g, 2, 3]
    return groups, prompts


def _one_step_settings(**overrides: Any) -> Any:
    # the 4 rows are one mini-batch and one padded micro-batch: the update pass sees the batch's layout as it is
    # (the shared layout computes the same log-probs, see test_learner_shared_prompt.py)
    return settings(rollout_n=2, ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=4, **layout("padded"), **overrides)


def _grad_enabled_logits(model: torch.nn.Module) -> list[torch.Tensor]:
    """The logits of every forward pass run under grad (the update's), kept so their gradient can be read."""
    seen: list[torch.Tensor] = []

    def hook(module: torch.nn.Module, args: Any, out: Any) -> None:
        if torch.is_grad_enabled():
            out.logits.retain_grad()
            seen.append(out.logits)

    model.register_forward_hook(hook)
    return seen


def test_the_wire_mask_reaches_the_batch() -> None:
    completions = [
        make_completion(
            [10 + k for k in range(7)],
            [-1.0 if m else 0.0 for m in MASK],
            version_min=1,
            version_max=2,
            reward=1.0,
            loss_mask=MASK,
            turns=[TurnSpan(0, 2, 1, 1, "tool_call"), TurnSpan(5, 2, 2, 2, "stop")],
        ),
        make_completion([30, 31], [-1.0, -1.0], version_min=1),
    ]
    codec = WireCodec()  # as rank 0 gets it: decoded from the received bytes (numpy views of them)
    wire = codec.decode(codec.encode(RolloutGroup(prompt_id=4, lease_id=1, actor_id="a0", completions=completions)))
    assert isinstance(wire, RolloutGroup)
    batch = collate_groups([wire], {4: [1, 2, 3]}, pad_token_id=0, max_prompt_length=None, max_response_length=8)
    assert batch.loss_mask.tolist() == [[1, 1, 0, 0, 0, 1, 1, 0], [1, 1, 0, 0, 0, 0, 0, 0]]
    assert batch.response_mask.tolist() == [[1, 1, 1, 1, 1, 1, 1, 0], [1, 1, 0, 0, 0, 0, 0, 0]]
    assert batch.loss_mask.dtype == torch.int64
    assert mini_batch_counts(local_context(), batch, [0, 1]) == (6.0, 2.0)  # 4 + 2 sampled tokens, 2 sequences


@pytest.mark.parametrize(
    "overrides",
    [
        {"entropy_coeff": 0.01, "use_kl_loss": True, "kl_loss_coef": 0.1},
        {
            "adv_estimator": "gae",
            "critic": dict(ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=4),
        },
    ],
    ids=["grpo_entropy_kl", "gae"],
)
def test_observation_tokens_get_exactly_zero_gradient(overrides: dict[str, Any]) -> None:
    learner = Learner(_one_step_settings(**overrides), START, local_context(), tiny_policy, critic=tiny_critic)
    actor_logits = _grad_enabled_logits(learner.model)
    critic_logits = _grad_enabled_logits(learner.critic.model) if learner.critic is not None else []
    metrics = learner.train_step(*_episodes())
    assert len(actor_logits) == 1  # one update micro-batch: logits [4 rows, 7 response positions, V]
    grad = actor_logits[0].grad
    assert grad is not None and grad.shape[:2] == (4, 7)
    # the logits predicting an observation token: not one non-zero entry; those predicting a sampled one: all rows
    assert torch.count_nonzero(grad[:, OBS]) == 0
    assert bool((grad[:, SAMPLED].abs().amax(dim=-1) > 0).all())
    assert metrics["learner/batch/response_length_mean"] == 7.0
    assert metrics["learner/batch/sampled_length_mean"] == 4.0
    if learner.critic is not None:
        # the value head's output [4, P + T, 1]: the value of response token j is read at position P - 1 + j
        (values,) = critic_logits
        vgrad = values.grad[..., 0]
        assert torch.count_nonzero(vgrad[:, [PROMPT_LEN - 1 + j for j in OBS]]) == 0
        assert bool((vgrad[:, [PROMPT_LEN - 1 + j for j in SAMPLED]] != 0).all())


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"rollout_is": "sequence", "rollout_is_threshold": 2.0},
        {"rollout_rs": "seq_max_k2", "rollout_rs_threshold": 1.0},
        {"bypass_mode": True},
    ],
    ids=["plain", "sequence_is", "sequence_rs", "bypass"],
)
def test_behaviour_log_probs_at_observation_tokens_are_never_read(overrides: dict[str, Any]) -> None:
    # 0 (the convention) or -9 there: the same update and the same off-policy metrics. Read as behaviour log-probs,
    # either would make a sequence-level weight or rejection statistic blow up (|log ratio| > 4 per token).
    def first_step(obs_logprob: float) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        learner = Learner(_one_step_settings(**overrides), START, local_context(), tiny_policy)
        grads: list[dict[str, torch.Tensor]] = []
        learner.actor.grad_hook = lambda m: grads.append(
            {n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}
        )
        metrics = learner.train_step(*_episodes(obs_logprob))
        return grads[0], metrics

    (g0, m0), (g9, m9) = first_step(0.0), first_step(-9.0)
    assert max(float(g.abs().max()) for g in g0.values()) > 1e-3  # a real update
    for name in g0:
        assert torch.equal(g0[name], g9[name]), name
    for key in ("learner/offpolicy/ess", "learner/offpolicy/abs_log_ratio_mean", "learner/actor/pg_loss"):
        assert m0[key] == m9[key], key
    if "bypass_mode" not in overrides:  # (bypass: the behaviour policy is the old one, no gap to measure)
        # the sampled tokens' behaviour log-probs are -4.0 .. -4.6 against the tiny model's ~ -4.16: a small gap
        assert 0.0 < m0["learner/offpolicy/abs_log_ratio_mean"] < 0.6 and m0["learner/offpolicy/ess"] > 0.9
    if "rollout_rs" in overrides:
        assert m0["learner/rollout_corr/rollout_rs_masked_fraction"] == 0.0  # no episode rejected


def test_an_episode_that_ran_into_the_length_limit_leaves_the_loss_whole() -> None:
    groups, prompts = _episodes()
    first = groups[0].completions[0]
    groups[0].completions[0] = msgspec.structs.replace(first, finish_reason="length")
    learner = Learner(_one_step_settings(mask_truncated_responses=True), START, local_context(), tiny_policy)
    batch = collate_groups(groups, prompts, pad_token_id=0, max_prompt_length=None, max_response_length=None)
    assert mini_batch_counts(local_context(), batch, [0, 1, 2, 3]) == (16.0, 4.0)
    logits = _grad_enabled_logits(learner.model)
    metrics = learner.train_batch(batch, [0, 1])
    assert metrics["learner/batch/truncated_masked"] == 1.0
    assert batch.loss_mask.tolist() == [[0] * 7, MASK, MASK, MASK]  # the row is out, the others keep their mask
    assert mini_batch_counts(local_context(), batch, [0, 1, 2, 3]) == (12.0, 3.0)
    grad = logits[0].grad
    assert torch.count_nonzero(grad[:, OBS]) == 0
    assert int(torch.count_nonzero(grad[:, SAMPLED].abs().amax(dim=-1))) == 3 * 4  # 3 rows x 4 sampled tokens
