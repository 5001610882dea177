"""A completion's finish reason reaches the learner as ``truncated`` (transport group -> rank 0's collation ->
tensors broadcast to the ranks -> ``batch.truncated``), and ``mask_truncated_responses`` takes those rows out of
the loss after the advantages: no gradient from them, and no token in the token-mean denominator."""

from __future__ import annotations

import msgspec
import pytest
import torch
from _learner_testlib import START, Prompts, layout, scripted_groups, settings, tiny_policy

from async_rl.learner import Learner, local_context
from async_rl.learner.batching import RolloutBatch, collate_groups, local_group, mask_truncated
from async_rl.learner.dist import share_batch
from async_rl.learner.update import mini_batch_counts
from async_rl.transport.codec import WireCodec
from async_rl.transport.protocol import Completion, RolloutGroup, make_completion, pack_array, unpack_array


def _wire_group() -> RolloutGroup:
    completions = [
        make_completion([5, 6], [-0.1, -0.2], version_min=1, finish_reason="stop", reward=1.0),
        make_completion([7, 8, 9], [-0.3, -0.4, -0.5], version_min=1, finish_reason="length", reward=0.5),
        make_completion([4], [-0.6], version_min=2, finish_reason="abort", reward=0.0),
    ]
    return RolloutGroup(prompt_id=3, lease_id=1, actor_id="a0", completions=completions)


def _collate(groups: list[RolloutGroup], prompts: Prompts) -> RolloutBatch:
    return collate_groups(groups, prompts, pad_token_id=0, max_prompt_length=None, max_response_length=None)


def test_the_finish_reason_flows_to_the_collated_batch() -> None:
    prompts = {3: [1, 2, 3]}
    batch = _collate([_wire_group()], prompts)
    assert batch.truncated.dtype == torch.bool
    assert batch.truncated.tolist() == [False, True, False]  # only "length" is truncation
    assert batch.versions.tolist() == [1, 1, 2]
    assert batch.select([1, 0]).truncated.tolist() == [True, False]
    shared, ids = share_batch(local_context(), batch, [3])  # the rank-0 -> every-rank tensor broadcast
    assert ids == [3] and shared.truncated.tolist() == [False, True, False]
    # as rank 0 gets the group (decoded from the received bytes: numpy views of them), the same tensors
    codec = WireCodec()
    received = codec.decode(codec.encode(_wire_group()))
    assert isinstance(received, RolloutGroup)
    expected = _collate([received], prompts)
    assert sorted(batch.tensors()) == sorted(expected.tensors())
    for key, value in expected.tensors().items():
        assert batch.tensors()[key].dtype == value.dtype, key
        assert torch.equal(batch.tensors()[key], value), key


def test_completions_default_to_not_truncated() -> None:
    group = local_group(0, [make_completion([2], [-1.0], version_min=0)])
    assert group.completions[0].finish_reason == "stop"
    assert _collate([group], {0: [1]}).truncated.tolist() == [False]


def _response(tokens: list[int], logprobs: list[float], reward: float, *, truncated: bool = False) -> Completion:
    return make_completion(
        tokens, logprobs, version_min=0, reward=reward, finish_reason="length" if truncated else "stop"
    )


def test_mask_truncated_zeroes_loss_rows_and_the_denominator() -> None:
    groups = [
        local_group(
            0,
            [_response([8, 9], [-1.0, -2.0], 1.0), _response([10, 11, 12], [-1.0] * 3, 0.0, truncated=True)],
        ),
        local_group(1, [_response([13], [-0.5], 0.5, truncated=True), _response([14, 15], [-1.0] * 2, 0.0)]),
    ]
    batch = _collate(groups, {0: [5, 6], 1: [7]})
    ctx = local_context()
    assert mini_batch_counts(ctx, batch, [0, 1, 2, 3]) == (8.0, 4.0)
    assert mask_truncated(batch) == 2
    assert batch.loss_mask.tolist() == [[1, 1, 0], [0, 0, 0], [0, 0, 0], [1, 1, 0]]
    assert batch.response_mask.tolist() == [[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]]  # forward layout kept
    assert mini_batch_counts(ctx, batch, [0, 1, 2, 3]) == (4.0, 2.0)  # tokens and sequences of the loss
    assert mask_truncated(batch) == 0  # already out: counted once


def _grpo_groups(truncate: bool, perturb: bool = False) -> tuple[list[RolloutGroup], Prompts]:
    """4 groups x 4; in groups 0 and 2 one response is truncated and its reward is the group mean (advantage 0)."""
    groups, prompts = scripted_groups(4, 4, seed=41)
    out = []
    for gi, g in enumerate(groups):
        completions = list(g.completions)
        if gi in (0, 2):
            rewards = [0.0, 1.0, 0.5, 0.5] if gi == 0 else [0.25, 0.5, 0.75, 0.5]
            completions = [msgspec.structs.replace(c, reward=w) for c, w in zip(completions, rewards, strict=True)]
            c = completions[3]
            if perturb:
                tokens = [(int(t) * 7 + 3) % 63 + 1 for t in unpack_array(c.token_ids)]
                c = msgspec.structs.replace(c, token_ids=pack_array(tokens, c.token_ids.dtype))
            completions[3] = msgspec.structs.replace(c, finish_reason="length" if truncate else "stop")
        out.append(local_group(g.prompt_id, completions))
    return out, prompts


def _first_grads(
    groups: tuple[list[RolloutGroup], Prompts], **overrides: object
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    # one mini-batch of all 16 rows (one optimizer step; ratio 1 on the first step), token-mean
    learner = Learner(
        settings(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=5, **overrides),
        START,
        local_context(),
        tiny_policy,
    )
    store: list[dict[str, torch.Tensor]] = []
    learner.actor.grad_hook = lambda m: store.append(
        {n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}
    )
    metrics = learner.train_step(*groups)
    return store[0], metrics


@pytest.mark.parametrize("lay", ["padded", "packed", "shared"])
def test_a_masked_truncated_row_adds_no_gradient_and_no_denominator_token(lay: str) -> None:
    groups = _grpo_groups(truncate=True)
    batch = _collate(*groups)
    total = float(batch.response_mask.sum())
    truncated_tokens = float(batch.response_mask[batch.truncated].sum())
    # Off: the truncated rows (advantage 0) add nothing to the numerator but count in the denominator.
    off, m_off = _first_grads(groups, **layout(lay))
    on, m_on = _first_grads(groups, **layout(lay), mask_truncated_responses=True)
    assert (m_off["learner/batch/truncated_masked"], m_on["learner/batch/truncated_masked"]) == (0.0, 2.0)
    assert max(float(g.abs().max()) for g in on.values()) > 1e-2  # a real update
    # On: the same numerator over only the kept tokens. The other rows' advantages are unchanged (the masked rows
    # still count in their groups' mean and std), so the gradient is exactly rescaled by total / kept tokens.
    scale = total / (total - truncated_tokens)
    for name in off:
        torch.testing.assert_close(on[name], off[name] * scale, atol=1e-6, rtol=1e-5, msg=name)


def test_a_masked_truncated_row_gives_no_gradient_whatever_its_tokens() -> None:
    # Give the truncated rows a non-zero advantage (the scripted rewards) and change their tokens: masked, the
    # gradient does not move; unmasked (the control), it does.
    def groups(perturb: bool, truncate: bool = True) -> tuple[list[RolloutGroup], Prompts]:
        out = []
        scripted, prompts = _grpo_groups(truncate=truncate, perturb=perturb)
        for g in scripted:
            out.append(
                local_group(
                    g.prompt_id,
                    [
                        msgspec.structs.replace(c, reward=c.token_ids.length % 3 / 2 + 0.1 * i)
                        for i, c in enumerate(g.completions)
                    ],
                )
            )
        return out, prompts

    a, _ = _first_grads(groups(perturb=False), mask_truncated_responses=True)
    b, _ = _first_grads(groups(perturb=True), mask_truncated_responses=True)
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-7, rtol=0, msg=name)
    c, _ = _first_grads(groups(perturb=False))
    d, _ = _first_grads(groups(perturb=True))
    assert max(float((c[n] - d[n]).abs().max()) for n in c) > 1e-4
