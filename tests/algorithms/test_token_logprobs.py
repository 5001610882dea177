"""Chunked per-token log-probs and entropy: values and gradients against the whole-matrix reference and by hand."""

from __future__ import annotations

import math

import pytest
import torch

from async_rl.algorithms import (
    linear_token_log_probs_and_entropy,
    token_log_probs_and_entropy,
    token_log_probs_and_entropy_reference,
)


def _inputs(n: int, v: int, seed: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(n, v, generator=gen)).to(dtype)
    labels = torch.randint(0, v, (n,), generator=gen)
    return logits, labels


def _values_and_grad(fn, logits, labels, g_lp, g_ent, **kw):  # type: ignore[no-untyped-def]
    """Both outputs, and d(sum(g_lp * lp) + sum(g_ent * ent)) / d logits (g_ent=None: entropy not in the loss)."""
    leaf = logits.clone().requires_grad_(True)
    lp, ent = fn(leaf, labels, **kw)
    loss = (g_lp * lp).sum()
    if g_ent is not None:
        loss = loss + (g_ent * ent).sum()
    loss.backward()
    return lp.detach(), None if ent is None else ent.detach(), leaf.grad


def test_values_and_gradient_by_hand() -> None:
    # row 0: softmax([0, ln 3]) = [1/4, 3/4]; row 1: uniform over 2
    logits = torch.tensor([[0.0, math.log(3.0)], [5.0, 5.0]], requires_grad=True)
    labels = torch.tensor([1, 0])
    lp, ent = token_log_probs_and_entropy(logits, labels, entropy="grad", chunk_size=1, temperature=1.0)
    assert ent is not None
    h0 = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    torch.testing.assert_close(lp, torch.tensor([math.log(0.75), math.log(0.5)]))
    torch.testing.assert_close(ent, torch.tensor([h0, math.log(2.0)]))
    lp.sum().backward()
    # d log p_label / dz = onehot - p: row 0 [-1/4, 1/4]; row 1 [1/2, -1/2]
    torch.testing.assert_close(logits.grad, torch.tensor([[-0.25, 0.25], [0.5, -0.5]]))
    logits.grad = None
    lp, ent = token_log_probs_and_entropy(logits, labels, entropy="grad", chunk_size=1, temperature=1.0)
    assert ent is not None
    ent.sum().backward()
    # dH/dz_j = -p_j (log p_j + H); row 1 is uniform, so H is at its maximum: gradient 0
    g0 = [-p * (math.log(p) + h0) for p in (0.25, 0.75)]
    torch.testing.assert_close(logits.grad, torch.tensor([g0, [0.0, 0.0]]))


def test_temperature_by_hand() -> None:
    # [0, 2 ln 3] / 2 = [0, ln 3] -> p = [1/4, 3/4]; the gradient picks up a factor 1/T = 1/2
    logits = torch.tensor([[0.0, 2 * math.log(3.0)]], requires_grad=True)
    lp, _ = token_log_probs_and_entropy(logits, torch.tensor([1]), temperature=2.0)
    torch.testing.assert_close(lp, torch.tensor([math.log(0.75)]))
    lp.sum().backward()
    torch.testing.assert_close(logits.grad, torch.tensor([[-0.125, 0.125]]))


@pytest.mark.parametrize("chunk_size", [1, 4, 7, 19, 64])  # 19 = N; 7 does not divide N; 64 > N
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_matches_reference_values_and_gradients(chunk_size: int, temperature: float) -> None:
    logits, labels = _inputs(19, 300, seed=chunk_size)
    gen = torch.Generator().manual_seed(1)
    g_lp, g_ent = torch.randn(19, generator=gen), torch.randn(19, generator=gen)
    kw = {"temperature": temperature, "entropy": "grad"}
    lp, ent, grad = _values_and_grad(
        token_log_probs_and_entropy, logits, labels, g_lp, g_ent, chunk_size=chunk_size, **kw
    )
    lp_r, ent_r, grad_r = _values_and_grad(token_log_probs_and_entropy_reference, logits, labels, g_lp, g_ent, **kw)
    assert lp.dtype == ent.dtype == torch.float32 and grad.dtype == torch.float32
    torch.testing.assert_close(lp, lp_r, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, ent_r, atol=1e-5, rtol=0)
    torch.testing.assert_close(grad, grad_r, atol=1e-5, rtol=0)
    assert float(grad.abs().max()) > 0.1  # a real gradient, not zeros on both sides


@pytest.mark.parametrize("entropy", ["none", "detached", "grad"])
def test_entropy_modes_as_the_learner_uses_them(entropy: str) -> None:
    logits, labels = _inputs(10, 40, seed=3)
    g_lp = torch.linspace(-1, 1, 10)
    lp, ent, grad = _values_and_grad(
        token_log_probs_and_entropy, logits, labels, g_lp, None, temperature=1.0, entropy=entropy, chunk_size=3
    )
    lp_r, ent_r, grad_r = _values_and_grad(
        token_log_probs_and_entropy_reference, logits, labels, g_lp, None, temperature=1.0, entropy=entropy
    )
    torch.testing.assert_close(lp, lp_r, atol=1e-5, rtol=0)
    torch.testing.assert_close(grad, grad_r, atol=1e-5, rtol=0)  # an unused entropy output adds nothing
    if entropy == "none":
        assert ent is None and ent_r is None
    else:
        assert ent is not None and ent_r is not None
        torch.testing.assert_close(ent, ent_r, atol=1e-5, rtol=0)
    leaf = logits.clone().requires_grad_(True)
    _, ent_live = token_log_probs_and_entropy(leaf, labels, entropy=entropy, temperature=1.0)
    assert (ent_live is not None and ent_live.requires_grad) == (entropy == "grad")


def test_bf16_logits_give_fp32_outputs_and_bf16_gradient() -> None:
    logits, labels = _inputs(33, 257, seed=5, dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(2)
    g_lp, g_ent = torch.randn(33, generator=gen), torch.randn(33, generator=gen)
    kw = {"temperature": 0.6, "entropy": "grad"}
    lp, ent, grad = _values_and_grad(token_log_probs_and_entropy, logits, labels, g_lp, g_ent, chunk_size=8, **kw)
    lp_r, ent_r, grad_r = _values_and_grad(token_log_probs_and_entropy_reference, logits, labels, g_lp, g_ent, **kw)
    assert lp.dtype == ent.dtype == torch.float32 and grad.dtype == torch.bfloat16
    torch.testing.assert_close(lp, lp_r, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, ent_r, atol=1e-5, rtol=0)
    torch.testing.assert_close(grad, grad_r)  # bf16 tolerances: both round the same fp32 gradient to bf16
    exact = torch.log_softmax(logits.double() / 0.6, dim=-1).gather(1, labels[:, None]).squeeze(1)
    torch.testing.assert_close(lp.double(), exact, atol=1e-5, rtol=0)  # fp32 math on the bf16 values


def test_gradcheck_float64_both_outputs() -> None:
    logits, labels = _inputs(5, 7, seed=6, dtype=torch.float64)
    logits.requires_grad_(True)

    def both(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lp, ent = token_log_probs_and_entropy(z, labels, temperature=0.7, entropy="grad", chunk_size=2)
        assert ent is not None and lp.dtype == torch.float64
        return lp, ent

    assert torch.autograd.gradcheck(both, (logits,))


def test_leading_dims_no_grad_and_int32_labels() -> None:
    logits, labels = _inputs(12, 30, seed=7)
    lp_r, ent_r = token_log_probs_and_entropy_reference(logits, labels, entropy="detached", temperature=1.0)
    with torch.no_grad():
        lp, ent = token_log_probs_and_entropy(
            logits.view(3, 4, 30).requires_grad_(True),
            labels.view(3, 4).int(),
            temperature=1.0,
            entropy="grad",
            chunk_size=5,
        )
    assert ent is not None and lp.shape == ent.shape == (3, 4) and not lp.requires_grad
    torch.testing.assert_close(lp.reshape(-1), lp_r, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent.reshape(-1), ent_r, atol=1e-5, rtol=0)


def test_large_logits_keep_their_digits() -> None:
    # fp32 spacing at 5e4 is 0.004, so ``z - logsumexp(z)`` would be off by ~1e-3; the max is subtracted first
    logits = torch.tensor([[5e4, 5e4 - 1.0, -5e4], [1e4, 0.0, 0.0]], requires_grad=True)
    labels = torch.tensor([1, 0])
    lp, ent = token_log_probs_and_entropy(logits, labels, entropy="grad", chunk_size=1, temperature=1.0)
    assert ent is not None
    p = 1 / (1 + math.e)  # row 0: the two top logits differ by 1, the third has probability 0
    torch.testing.assert_close(lp, torch.tensor([math.log(p), 0.0]))
    torch.testing.assert_close(ent, torch.tensor([-(p * math.log(p) + (1 - p) * math.log(1 - p)), 0.0]))
    lp.sum().backward()
    torch.testing.assert_close(logits.grad, torch.tensor([[-(1 - p), 1 - p, 0.0], [0.0, 0.0, 0.0]]))


def test_backward_saves_no_vocab_sized_fp32_tensor() -> None:
    logits, labels = _inputs(64, 500, seed=8)
    leaf = logits.clone().requires_grad_(True)
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lp, ent = token_log_probs_and_entropy(leaf, labels, entropy="grad", chunk_size=16, temperature=1.0)
    # the logits themselves (no copy) plus per-row numbers: labels, max and log-sum-exp, entropy
    new = [t for t in saved if t.data_ptr() != leaf.data_ptr()]
    assert any(t.data_ptr() == leaf.data_ptr() for t in saved)
    assert sum(t.numel() for t in new) <= 4 * 64
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        token_log_probs_and_entropy_reference(leaf, labels, entropy="grad", temperature=1.0)
    assert sum(t.numel() for t in saved if t.data_ptr() != leaf.data_ptr()) >= 2 * 64 * 500  # what chunking avoids


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"entropy": "yes"}, "entropy"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"temperature": 0.0}, "temperature"),
    ],
)
def test_rejects_bad_arguments(kwargs: dict[str, object], match: str) -> None:
    logits, labels = _inputs(4, 5, seed=9)
    with pytest.raises(ValueError, match=match):
        token_log_probs_and_entropy(logits, labels, **{"temperature": 1.0, **kwargs})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="labels"):
        token_log_probs_and_entropy(logits, labels[:3], temperature=1.0)


def test_default_chunk_is_32_mib_of_fp32_rows_and_changes_no_value() -> None:
    from async_rl.algorithms import LOGPROB_CHUNK_BYTES, default_chunk_rows

    assert LOGPROB_CHUNK_BYTES == 32 * 2**20
    assert default_chunk_rows(49_152) == 170  # SmolLM2
    assert default_chunk_rows(151_936) == 55  # Qwen2.5
    assert default_chunk_rows(10**9) == 1  # never zero rows
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(400, 49_152, generator=gen).bfloat16().requires_grad_()  # 3 default chunks of 170 rows
    labels = torch.randint(0, 49_152, (400,), generator=gen)
    lp, ent = token_log_probs_and_entropy(logits, labels, temperature=0.7, entropy="grad")
    (grad,) = torch.autograd.grad((lp + ent).sum(), logits)
    lp1, ent1 = token_log_probs_and_entropy(logits, labels, temperature=0.7, entropy="grad", chunk_size=400)
    (grad1,) = torch.autograd.grad((lp1 + ent1).sum(), logits)
    # rows are independent: the chunking changes no value
    assert torch.equal(lp, lp1) and torch.equal(ent, ent1) and torch.equal(grad, grad1)


# linear_token_log_probs_and_entropy: the output layer's product and the log-softmax in one, logits never kept


def _linear_inputs(n: int, h: int, v: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randn(n, h, generator=gen),
        torch.randn(v, h, generator=gen) / 2,
        torch.randint(0, v, (n,), generator=gen),
    )


@pytest.mark.parametrize("chunk_size", [1, 7, 64])  # 7 does not divide N = 19; 64 > N
@pytest.mark.parametrize("entropy", ["none", "detached", "grad"])
def test_linear_matches_the_logits_path_values_and_gradients(chunk_size: int, entropy: str) -> None:
    hidden, weight, labels = _linear_inputs(19, 24, 300, seed=chunk_size)
    gen = torch.Generator().manual_seed(2)
    g_lp, g_ent = torch.randn(19, generator=gen), torch.randn(19, generator=gen)
    results = []
    for fused in (True, False):
        h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
        kw = {"temperature": 0.7, "entropy": entropy}
        if fused:
            lp, ent = linear_token_log_probs_and_entropy(h, w, labels, chunk_size=chunk_size, **kw)
        else:
            lp, ent = token_log_probs_and_entropy_reference(h @ w.T, labels, **kw)
        loss = (g_lp * lp).sum() + ((g_ent * ent).sum() if entropy == "grad" else 0)
        loss.backward()
        results.append((lp.detach(), ent, h.grad, w.grad))
    (lp, ent, gh, gw), (lp_r, ent_r, gh_r, gw_r) = results
    torch.testing.assert_close(lp, lp_r, atol=1e-5, rtol=0)
    torch.testing.assert_close(gh, gh_r, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gw, gw_r, atol=1e-5, rtol=1e-5)
    assert float(gh.abs().max()) > 0.1 and float(gw.abs().max()) > 0.1
    if entropy == "none":
        assert ent is None
    else:
        assert ent is not None and ent_r is not None
        torch.testing.assert_close(ent.detach(), ent_r.detach(), atol=1e-5, rtol=0)
        assert ent.requires_grad == (entropy == "grad")


def test_linear_gradcheck_float64_both_operands() -> None:
    hidden, weight, labels = (t.double() if t.is_floating_point() else t for t in _linear_inputs(6, 5, 11, seed=4))
    hidden.requires_grad_(True)
    weight.requires_grad_(True)

    def f(h: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lp, ent = linear_token_log_probs_and_entropy(h, w, labels, temperature=0.8, entropy="grad", chunk_size=4)
        assert ent is not None
        return lp, ent

    assert torch.autograd.gradcheck(f, (hidden, weight))


def test_linear_product_runs_in_bf16_like_f_linear() -> None:
    hidden, weight, labels = _linear_inputs(9, 16, 50, seed=5)
    hb, wb = hidden.bfloat16().requires_grad_(True), weight.bfloat16().requires_grad_(True)
    lp, _ = linear_token_log_probs_and_entropy(hb, wb, labels, temperature=1.0, chunk_size=4)
    expected, _ = token_log_probs_and_entropy(torch.nn.functional.linear(hb, wb), labels, temperature=1.0)
    assert lp.dtype == torch.float32
    torch.testing.assert_close(lp, expected.detach(), atol=0, rtol=0)  # the same bf16 logits, row by row
    lp.sum().backward()
    assert hb.grad is not None and wb.grad is not None and hb.grad.dtype == wb.grad.dtype == torch.bfloat16
    # under autocast fp32 operands are multiplied in bf16, as F.linear would, and get fp32 gradients
    h32, w32 = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp_ac, _ = linear_token_log_probs_and_entropy(h32, w32, labels, temperature=1.0, chunk_size=4)
    torch.testing.assert_close(lp_ac, lp.detach(), atol=0, rtol=0)
    lp_ac.sum().backward()
    assert h32.grad is not None and w32.grad is not None and h32.grad.dtype == w32.grad.dtype == torch.float32
    torch.testing.assert_close(w32.grad, wb.grad.float(), atol=0, rtol=0)


def test_linear_leading_dims_and_no_grad() -> None:
    hidden, weight, labels = _linear_inputs(12, 8, 30, seed=6)
    lp, ent = linear_token_log_probs_and_entropy(
        hidden.view(3, 4, 8), weight, labels.view(3, 4), temperature=1.0, entropy="detached"
    )
    flat, flat_ent = linear_token_log_probs_and_entropy(hidden, weight, labels, temperature=1.0, entropy="detached")
    assert lp.shape == (3, 4) and ent is not None and ent.shape == (3, 4) and not lp.requires_grad
    torch.testing.assert_close(lp.reshape(-1), flat, atol=0, rtol=0)
    torch.testing.assert_close(ent.reshape(-1), flat_ent, atol=0, rtol=0)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((torch.zeros(4, 8), torch.zeros(30, 7), torch.zeros(4, dtype=torch.long)), "hidden must be"),
        ((torch.zeros(4, 8), torch.zeros(30), torch.zeros(4, dtype=torch.long)), "weight must be"),
        ((torch.zeros(4, 8), torch.zeros(30, 8), torch.zeros(3, dtype=torch.long)), "labels has shape"),
        ((torch.zeros(4, 8), torch.zeros(30, 8), torch.zeros(4)), "labels must be an integer"),
    ],
)
def test_linear_rejects_bad_arguments(args: tuple[torch.Tensor, ...], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        linear_token_log_probs_and_entropy(*args, temperature=1.0)
