"""Shared-prompt micro-batches: each group's prompt computed once, with the log-probs, values and gradients of
separate sequences (against the padded layout, fp32, within 1e-5)."""

from __future__ import annotations

import pytest
import torch
from _learner_testlib import Prompts, collate, scripted_groups, tiny_critic, tiny_policy

from async_rl.learner.batching import local_group
from async_rl.learner.dist import local_context
from async_rl.learner.model import build_model
from async_rl.learner.partition import padding_waste, plan_forward, plan_updates, rank_shares, split_micro
from async_rl.learner.policy import build_micro_inputs, response_log_probs, response_values
from async_rl.learner.shared_prompt import (
    SHARED_PROMPT_ATTENTION,
    build_shared_layout,
    dense_shared_attention,
    math_attention,
    shared_prompt_enabled,
    use_shared_prompt_attention,
    varlen_shared_attention,
    varlen_supported,
)
from async_rl.transport.protocol import RolloutGroup, make_completion

CPU = torch.device("cpu")


def test_layout_by_hand() -> None:
    # piece 0: prompt of 2 tokens (row positions 0, 1), completions of 1 (2) and 2 tokens (3, 4)
    # piece 1: prompt of 1 token (5), one completion of 2 tokens (6, 7)
    lay = build_shared_layout([2, 1], [[1, 2], [2]])
    assert lay.prompt_index.tolist() == [[0, 1], [5, 0]]
    assert lay.comp_index.tolist() == [[2, 0], [3, 4], [6, 7]]
    assert lay.comp_group.tolist() == [0, 0, 1]
    # flattened outputs: prompts 2 x 2 slots (0..3), then completions 3 x 2 slots (4..9)
    assert lay.inverse.tolist() == [0, 1, 4, 6, 7, 2, 8, 9]
    # completion 1 (two tokens of piece 0): both see the whole prompt; its second token also sees its first
    assert lay.comp_mask[1, 0].int().tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    # completion 2 (piece 1, prompt of 1): the prompt's padding slot is out
    assert lay.comp_mask[2, 0].int().tolist() == [[1, 0, 1, 0], [1, 0, 1, 1]]
    # completion 0 (one token): its padded query sees the prompt and the real token, never the padding slot
    assert lay.comp_mask[0, 0].int().tolist() == [[1, 1, 1, 0], [1, 1, 1, 0]]
    # the variable-length form: segments prompt 0 | comp 0 | comp 1 | prompt 1 | comp 2, in row order
    assert lay.cu_seq_q.tolist() == [0, 2, 3, 5, 6, 8]
    assert lay.kv_index.tolist() == [0, 1, 0, 1, 2, 0, 1, 3, 4, 5, 5, 6, 7]
    assert lay.cu_seq_k.tolist() == [0, 2, 5, 9, 10, 13]
    assert lay.cu_seq_q.dtype == lay.cu_seq_k.dtype == torch.int32
    assert (lay.max_q, lay.max_k) == (2, 4)
    with pytest.raises(ValueError, match="at least one token"):
        build_shared_layout([2], [[]])


def _varlen_reference(q, k, v, lay):  # type: ignore[no-untyped-def]
    """The variable-length kernel's contract, written out: each query segment attends causally to its gathered keys,
    aligned so that its last query sees its last key (flash's bottom-right alignment)."""
    out = torch.empty(q.shape[2], q.shape[1], q.shape[3])
    kg, vg = k[0].index_select(1, lay.kv_index), v[0].index_select(1, lay.kv_index)
    for s in range(len(lay.cu_seq_q) - 1):
        q0, q1, k0, k1 = (int(x) for x in (lay.cu_seq_q[s], lay.cu_seq_q[s + 1], lay.cu_seq_k[s], lay.cu_seq_k[s + 1]))
        mask = torch.ones(q1 - q0, k1 - k0, dtype=torch.bool).tril(diagonal=(k1 - k0) - (q1 - q0))
        o = torch.nn.functional.scaled_dot_product_attention(
            q[0, :, q0:q1], kg[:, k0:k1], vg[:, k0:k1], attn_mask=mask, enable_gqa=True
        )
        out[q0:q1] = o.transpose(0, 1)
    return out[None]


def test_the_variable_length_segments_attend_as_the_dense_problems_do() -> None:
    torch.manual_seed(0)
    lay = build_shared_layout([3, 1, 4], [[2, 5], [1], [3, 1, 2]])
    length = int(lay.cu_seq_q[-1])
    q, k, v = torch.randn(1, 4, length, 8), torch.randn(1, 2, length, 8), torch.randn(1, 2, length, 8)
    torch.testing.assert_close(_varlen_reference(q, k, v, lay), dense_shared_attention(q, k, v, lay, None))


@pytest.mark.parametrize("masked", [False, True])
def test_the_written_out_attention_equals_sdpa_with_its_gradients(masked: bool) -> None:
    gen = torch.Generator().manual_seed(1)
    rows, t, s = (3, 5, 9) if masked else (2, 7, 7)
    q, k, v = (torch.randn(rows, h, t if h == 6 else s, 8, generator=gen).requires_grad_() for h in (6, 2, 2))
    mask = None
    if masked:  # a random pattern in which every query row sees at least its first key
        mask = torch.rand(rows, 1, t, s, generator=gen) < 0.5
        mask[..., 0] = True
    ours = math_attention(q, k, v, mask, 0.3)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=not masked, scale=0.3, enable_gqa=True
    )
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    weights = torch.randn(ref.shape, generator=gen)
    g_ours = torch.autograd.grad((ours * weights).sum(), (q, k, v))
    g_ref = torch.autograd.grad((ref * weights).sum(), (q, k, v))
    for a, b in zip(g_ours, g_ref, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_bf16_rows_on_cpu_are_attended_written_out_and_agree_with_fp32(monkeypatch: pytest.MonkeyPatch) -> None:
    import async_rl.learner.shared_prompt as shared

    calls: list[torch.dtype] = []

    def spy(q, k, v, mask, scaling):  # type: ignore[no-untyped-def]
        calls.append(q.dtype)
        return math_attention(q, k, v, mask, scaling)

    monkeypatch.setattr(shared, "math_attention", spy)
    torch.manual_seed(0)
    lay = build_shared_layout([46, 30], [[12, 3, 16], [9, 14]])
    length = int(lay.cu_seq_q[-1])
    q, k, v = torch.randn(1, 9, length, 64), torch.randn(1, 3, length, 64), torch.randn(1, 3, length, 64)
    ref = dense_shared_attention(q, k, v, lay, None)
    assert calls == []  # fp32 keeps the flash kernel, which is as fast there
    out = dense_shared_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), lay, None)
    assert calls == [torch.bfloat16, torch.bfloat16]  # the prompts' problem and the completions'
    torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=2e-2)  # bf16 inputs: 8 mantissa bits
    monkeypatch.setattr(shared, "MATH_ATTENTION_MAX_SCORES", 9 * 2 * 46 * 46 - 1)  # both problems over the limit
    flash = dense_shared_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), lay, None)
    assert len(calls) == 2
    torch.testing.assert_close(flash.float(), ref, atol=3e-2, rtol=2e-2)


def _cuda_row(seed: int = 0):  # type: ignore[no-untyped-def]
    """A GSM8K-like row on CUDA in bf16 (two groups of 8, prompts of different lengths), Qwen2.5-0.5B's heads."""
    gen = torch.Generator().manual_seed(seed)
    t_lens = torch.randint(1, 200, (2, 8), generator=gen).tolist()
    lay = build_shared_layout([160, 97], t_lens).to(torch.device("cuda"))
    length = int(lay.cu_seq_q[-1])

    def leaf(heads: int) -> torch.Tensor:
        x = torch.randn(1, heads, length, 64, generator=gen).to("cuda", torch.bfloat16)
        return x.requires_grad_()

    return lay, leaf(14), leaf(2), leaf(2)


@pytest.mark.gpu
def test_the_flash_kernel_equals_the_dense_problems_on_cuda() -> None:
    lay, q, k, v = _cuda_row()
    assert varlen_supported(q)
    out_v = varlen_shared_attention(q, k, v, lay, None)
    grads_v = torch.autograd.grad(out_v.float().square().sum(), (q, k, v))
    out_d = dense_shared_attention(q, k, v, lay, None)
    grads_d = torch.autograd.grad(out_d.float().square().sum(), (q, k, v))
    torch.testing.assert_close(out_v.float(), out_d.float(), atol=2e-2, rtol=2e-2)  # bf16: 8 mantissa bits
    for gv, gd in zip(grads_v, grads_d, strict=True):  # bf16 rounding of two summation orders: 1% of the norm
        assert float(gd.float().norm()) > 1.0
        assert float((gv.float() - gd.float()).norm()) < 1e-2 * float(gd.float().norm())
    # the bottom-right alignment matters: a completion's first token sees the whole prompt, not the prompt's first key
    first = int(lay.cu_seq_q[1])
    assert float((out_v[0, first] - out_d[0, first]).abs().max()) < 2e-2


@pytest.mark.gpu
def test_shared_log_probs_on_cuda_equal_separate_sequences() -> None:
    batch = collate(*_groups())
    model = tiny_policy(seed=4).to("cuda", torch.bfloat16)
    use_shared_prompt_attention(model)
    cuda = torch.device("cuda")
    rows = list(range(13))
    with torch.no_grad():
        padded, _ = response_log_probs(
            model, build_micro_inputs(batch, rows, layout="padded", device=cuda), temperature=1.0
        )
        shared, _ = response_log_probs(
            model, build_micro_inputs(batch, rows, layout="shared", device=cuda), temperature=1.0
        )
    mask = batch.response_mask.bool().to(cuda)
    diff = (shared[mask].float() - padded[mask].float()).abs()
    assert float(padded[mask].float().abs().mean()) > 1.0  # real log-probs over a 512-token vocabulary
    assert float(diff.max()) < 0.1 and float(diff.mean()) < 0.02  # bf16 rounding of two summation orders


def _groups() -> tuple[list[RolloutGroup], Prompts]:
    """Prompts of different lengths (3..9 tokens), 4 completions each, plus a group with n = 1."""
    groups, prompts = scripted_groups(3, 4, seed=9)
    lone = make_completion([5, 6, 7], [-1.0] * 3, version_min=0, reward=1.0)
    return [*groups, local_group(3, [lone])], {**prompts, 3: [3, 1, 4, 1, 5]}


def _log_probs_and_grads(model: torch.nn.Module, batch, rows: list[list[int]], layout: str):  # type: ignore[no-untyped-def]
    """Log-probs over the micro-batches ``rows`` and the gradient of a loss touching every token."""
    model.zero_grad()
    out = torch.zeros_like(batch.rollout_log_probs)
    for micro in rows:
        mi = build_micro_inputs(batch, micro, layout=layout, device=CPU)
        lp, ent = response_log_probs(model, mi, temperature=0.7, entropy="grad")
        assert ent is not None
        weights = torch.linspace(0.5, 1.5, lp.shape[1])
        (lp * weights).sum().add(0.1 * ent.sum()).backward()
        out[micro] = lp.detach()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads


@pytest.mark.parametrize(
    "micro",
    [
        [list(range(13))],  # the whole batch in one row
        [[0, 1, 2], [3, 4, 5, 6, 7], [8, 9, 10, 11, 12]],  # groups straddle the cuts
        [[12, 5, 0], [1, 2, 3, 4], [6, 7, 8, 9, 10, 11]],  # any row order: n = 1 group first
    ],
)
def test_log_probs_and_gradients_equal_separate_sequences(micro: list[list[int]]) -> None:
    batch = collate(*_groups())
    model = tiny_policy(seed=4)
    assert use_shared_prompt_attention(model) and shared_prompt_enabled(model)
    expected, g_expected = _log_probs_and_grads(model, batch, [list(range(13))], "padded")
    got, g_got = _log_probs_and_grads(model, batch, micro, "shared")
    assert float(expected[batch.response_mask.bool()].max()) < 0  # real log-probs
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    assert g_got.keys() == g_expected.keys()
    assert max(float(g.abs().max()) for g in g_expected.values()) > 1e-2
    for name, grad in g_expected.items():
        torch.testing.assert_close(g_got[name], grad, atol=1e-5, rtol=0, msg=name)


def test_values_equal_separate_sequences() -> None:
    batch = collate(*_groups())
    critic = tiny_critic().eval()
    use_shared_prompt_attention(critic)
    rows = list(range(13))
    with torch.no_grad():
        expected = response_values(critic, build_micro_inputs(batch, rows, layout="padded", device=CPU))
        got = response_values(critic, build_micro_inputs(batch, rows[::-1], layout="shared", device=CPU))
    torch.testing.assert_close(got, expected[rows[::-1]], atol=1e-5, rtol=0)


def test_each_prompt_is_computed_once_per_micro_batch() -> None:
    batch = collate(*_groups())
    p_lens, t_lens = batch.prompt_lengths.tolist(), batch.response_lengths.tolist()
    mi = build_micro_inputs(batch, list(range(13)), layout="shared", device=CPU)
    prompts_once = sum(p_lens[g * 4] for g in range(3)) + p_lens[12]
    assert mi.input_ids.shape == (1, prompts_once + sum(t_lens))
    assert mi.labels.tolist() == batch.responses[batch.response_mask.bool()].tolist()
    # every completion's positions continue from the end of its prompt
    first = mi.position_ids[0, mi.shared.comp_index[:, 0]].tolist() if mi.shared is not None else []
    assert first == [p_lens[i] for i in range(13)]
    groups = batch.index.tolist()
    micro = [[0, 1, 2], [3, 4, 5, 6, 7]]  # group 0 straddles the cut: its prompt is computed twice
    real, slots = padding_waste(p_lens, t_lens, micro, "shared", groups)
    assert real == slots == 2 * p_lens[0] + p_lens[4] + sum(t_lens[:8])


def test_a_row_whose_prompt_differs_from_its_group_gets_a_piece_of_its_own() -> None:
    # never produced by the actors, but the layout must stay exact for any batch
    batch = collate(*scripted_groups(2, 3, seed=3))
    batch.index[3:] = 0  # both groups claim to be group 0, with different prompts
    model = tiny_policy(seed=2).eval()
    use_shared_prompt_attention(model)
    rows = list(range(6))
    with torch.no_grad():
        padded, _ = response_log_probs(
            model, build_micro_inputs(batch, rows, layout="padded", device=CPU), temperature=1.0
        )
        mi = build_micro_inputs(batch, rows, layout="shared", device=CPU)
        shared, _ = response_log_probs(model, mi, temperature=1.0)
    assert mi.shared is not None and mi.shared.prompt_index.shape[0] == 2
    torch.testing.assert_close(shared, padded, atol=1e-5, rtol=0)


def test_without_a_layout_the_attention_is_sdpa() -> None:
    ids = torch.tensor([[3, 9, 4, 1, 7, 2]])
    plain = tiny_policy(seed=1).eval()
    switched = tiny_policy(seed=1).eval()
    use_shared_prompt_attention(switched)
    assert switched.config._attn_implementation == SHARED_PROMPT_ATTENTION
    with torch.no_grad():
        torch.testing.assert_close(switched(input_ids=ids).logits, plain(input_ids=ids).logits, atol=0, rtol=0)


def test_a_model_without_the_attention_interface_keeps_separate_sequences(caplog) -> None:  # type: ignore[no-untyped-def]
    class Plain(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(2, 2)

    with caplog.at_level("WARNING"):
        model = build_model(
            Plain,
            local_context(),
            role="actor",
            shared_prompt=True,
            seed=0,
            compute_dtype=torch.float32,
            gradient_checkpointing=0,
            fused_output_layer=False,
            reshard_after_forward=True,
            min_num_params=0,
        )
    assert not shared_prompt_enabled(model)
    assert "use_shared_prompt has no effect" in caplog.text


def test_partitions_keep_groups_together() -> None:
    groups = [g for g in range(6) for _ in range(4)]  # 6 groups of 4 rows
    lengths = [10 + (i * 7) % 5 for i in range(24)]
    shares = rank_shares(range(24), lengths, 2, groups)
    assert sorted(len(s) for s in shares) == [12, 12]
    for share in shares:  # whole groups on each rank
        assert all(sum(groups[i] == groups[j] for i in share) == 4 for j in share)
    micro = split_micro(shares[0], lengths, 5, groups=groups)
    order = [i for m in micro for i in m]
    assert sorted(order) == sorted(shares[0])
    runs = [groups[i] for i in order]
    assert sum(a != b for a, b in zip(runs, runs[1:], strict=False)) == 2  # 3 groups, each contiguous
    # 5 groups do not split evenly over 2 ranks: rows are balanced instead, and every row still goes somewhere once
    odd = rank_shares(range(20), lengths[:20], 2, groups[:20])
    assert sorted(i for s in odd for i in s) == list(range(20)) and len(odd[0]) == len(odd[1]) == 10
    fwd = [i for r in range(2) for m in plan_forward(lengths, 2, r, 4, groups=groups) for i in m]
    assert sorted(fwd) == list(range(24))


def test_shuffling_moves_whole_groups() -> None:
    groups = [g for g in range(8) for _ in range(4)]
    lengths = [12] * 32
    plan = plan_updates(
        lengths,
        mini_size=8,
        micro_size=8,
        epochs=2,
        world_size=1,
        rank=0,
        shuffle=True,
        seed=5,
        groups=groups,
        skip=None,
    )
    for epoch in plan.epochs:
        for mini in epoch:
            rows = [i for m in mini for i in m]
            assert len({groups[i] for i in rows}) == 2  # two whole groups of 4 per mini-batch of 8
    first = [groups[m[0][0]] for m in plan.epochs[0]]
    assert first != sorted(first)  # the groups were shuffled
