"""The learner's activation memory: what the autograd graph saves for backward is one micro-batch's worth at a time,
within a per-token budget from the model's shape, and nothing of a step is still alive after it.

Counted deterministically (not resident memory, which depends on the allocator and the host): every tensor the graph
saves for backward is tallied by storage size while alive (parameters excluded, each tensor once). A regression that
keeps every micro-batch's graph, or the full-vocabulary logits in fp32, until the optimizer step shows up here.
"""

from __future__ import annotations

import random
import weakref

import pytest
import torch
from _learner_testlib import START, VOCAB, Prompts, layout, settings, tiny_config, tiny_policy

from async_rl.learner import Learner, local_context
from async_rl.learner.batching import local_group
from async_rl.transport.protocol import RolloutGroup, make_completion

PROMPTS, N, PROMPT_LEN, RESPONSE_LEN = 4, 4, 16, 32


class SavedBytes:
    """Bytes of the tensors the autograd graph holds for backward: now and at the peak."""

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0
        self.seen: set[int] = set()

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        if not (t.is_leaf and t.requires_grad) and id(t) not in self.seen:
            size = t.untyped_storage().nbytes()
            self.seen.add(id(t))
            self.live += size
            self.peak = max(self.peak, self.live)
            weakref.finalize(t, self._free, id(t), size)
        return t

    def _free(self, key: int, size: int) -> None:
        self.seen.discard(key)
        self.live -= size


def _groups() -> tuple[list[RolloutGroup], Prompts]:
    rng = random.Random(0)
    out, prompts = [], {}
    for g in range(PROMPTS):
        prompts[g] = [rng.randrange(1, VOCAB) for _ in range(PROMPT_LEN)]
        completions = [
            make_completion(
                [rng.randrange(1, VOCAB) for _ in range(RESPONSE_LEN)],
                [-3.0] * RESPONSE_LEN,
                version_min=0,
                reward=rng.random(),
            )
            for _ in range(N)
        ]
        out.append(local_group(g, completions))
    return out, prompts


def _step(name: str, micro: int) -> tuple[SavedBytes, float]:
    s = settings(
        ppo_mini_batch_size=PROMPTS,  # one optimizer step over the whole batch
        ppo_micro_batch_size_per_gpu=micro,
        log_prob_micro_batch_size_per_gpu=micro,
        rollout_n=N,
        max_prompt_length=PROMPT_LEN,
        max_response_length=RESPONSE_LEN,
        **layout(name),
    )
    learner = Learner(s, START, local_context(), lambda: tiny_policy())
    saved = SavedBytes()
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t):
        metrics = learner.train_step(*_groups())
    return saved, metrics["learner/batch/tokens_computed"]


@pytest.mark.parametrize("name", ["shared", "padded"])
def test_one_micro_batch_of_activations_at_a_time_within_a_per_token_budget(name):
    whole, tokens = _step(name, PROMPTS * N)  # one micro-batch of 16 sequences
    quarters, _ = _step(name, N)  # four micro-batches of 4
    assert whole.live == 0 and quarters.live == 0  # nothing the step saved outlives it
    # four micro-batches: a quarter of the activations at a time, plus what does not scale with the micro-batch
    assert quarters.peak <= 0.35 * whole.peak, (quarters.peak, whole.peak)
    # per token of the step: a few hidden- or MLP-sized fp32 vectors per layer, and a few vocabulary-sized ones (the
    # kept logits and the chunked log-softmax); measured 9.3 KB (shared) and 8.5 KB (padded) here, against 13.5 and
    # 12.6 KB with transformers' own RMSNorm and MLP (learner/lean_layers.py), which this bound (11.9 KB) rules out
    cfg = tiny_config()
    floats = 12 * cfg.num_hidden_layers * (cfg.hidden_size + cfg.intermediate_size) + 4 * cfg.vocab_size
    assert whole.peak / tokens <= 2.5 * floats, (whole.peak / tokens, 2.5 * floats)
    assert whole.peak / tokens >= 4 * cfg.num_hidden_layers * (cfg.hidden_size + cfg.intermediate_size)


def test_gradient_checkpointing_interval_checkpoints_every_kth_layer_with_the_same_gradients() -> None:
    """actor_rollout_ref.model.gradient_checkpointing_interval: layers 0, k, 2k, ... recompute, the others keep their
    activations; the gradients are those of full checkpointing (recomputation gives the same values)."""
    from async_rl.learner.model import build_model

    ctx = local_context()
    models = {
        k: build_model(
            tiny_policy,
            ctx,
            role=f"k{k}",
            seed=0,
            gradient_checkpointing=k,
            compute_dtype=torch.float32,
            shared_prompt=False,
            fused_output_layer=False,
            reshard_after_forward=True,
            min_num_params=0,
        )
        for k in (1, 2)
    }
    layers = {k: list(m.model.layers) for k, m in models.items()}
    assert [layer.gradient_checkpointing for layer in layers[1]] == [True, True]
    assert [layer.gradient_checkpointing for layer in layers[2]] == [True, False]
    ids = torch.randint(1, 64, (3, 9), generator=torch.Generator().manual_seed(0))
    grads = {}
    for k, model in models.items():
        model(input_ids=ids).logits.logsumexp(-1).mean().backward()
        grads[k] = {n: p.grad for n, p in model.named_parameters()}
    for name in grads[1]:
        assert torch.equal(grads[1][name], grads[2][name]), name
