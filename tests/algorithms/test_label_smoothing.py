"""Label-smoothed SFT loss: the uniform term from the label's log-prob and the chunked mean logit, by hand and against
the direct cross-entropy with a smoothed target (values and gradients)."""

from __future__ import annotations

import math

import pytest
import torch

from async_rl.algorithms import label_smoothed_nll, masked_logit_mean, sft_loss, token_log_probs_and_entropy


def _smoothed(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, eps: float) -> torch.Tensor:
    log_probs, _ = token_log_probs_and_entropy(logits, labels, temperature=1.0)
    label_logits = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1).float()
    return label_smoothed_nll(log_probs, label_logits, masked_logit_mean(logits, mask), label_smoothing=eps)


def test_smoothed_nll_by_hand():
    # vocab 3, logits [0, 0, ln 2] -> p = [1/4, 1/4, 1/2]; label 2
    logits = torch.tensor([[0.0, 0.0, math.log(2.0)]])
    labels = torch.tensor([2])
    ids01 = torch.tensor([True, True, False])
    assert _smoothed(logits, labels, ids01, 0.0).item() == pytest.approx(math.log(2.0))  # -ln(1/2)
    # eps 0.5 over ids {0, 1}: 0.5 * ln 2 + 0.5 * mean(ln 4, ln 4) = 1.5 ln 2
    assert _smoothed(logits, labels, ids01, 0.5).item() == pytest.approx(1.5 * math.log(2.0))
    # eps 0.5 over all three: 0.5 * ln 2 + 0.5 * (ln 4 + ln 4 + ln 2) / 3 = 0.5 ln 2 + 5/6 ln 2
    everything = torch.ones(3, dtype=torch.bool)
    assert _smoothed(logits, labels, everything, 0.5).item() == pytest.approx((0.5 + 5 / 6) * math.log(2.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_smoothed_nll_equals_the_smoothed_target_cross_entropy_with_gradients(dtype):
    torch.manual_seed(0)
    n, vocab, eps = 37, 50, 0.3
    base = (torch.randn(n, vocab) * 4).to(dtype)
    labels = torch.randint(0, vocab, (n,))
    smooth = torch.rand(vocab) < 0.7
    smooth[labels[0]] = False  # a label outside the smoothing set is allowed
    weights = torch.rand(n)

    fast_in = base.clone().requires_grad_(True)
    fast = masked_logit_mean(fast_in, smooth, chunk_size=8)  # several chunks
    log_probs, _ = token_log_probs_and_entropy(fast_in, labels, temperature=1.0, chunk_size=8)
    label_logits = fast_in.gather(-1, labels.unsqueeze(-1)).squeeze(-1).float()
    loss = label_smoothed_nll(log_probs, label_logits, fast, label_smoothing=eps)
    (loss * weights).sum().backward()

    ref_in = base.clone().double().requires_grad_(True)
    logp = ref_in.log_softmax(-1)
    target = (eps * smooth.double() / smooth.sum()).expand(n, vocab).clone()
    target[torch.arange(n), labels] += 1 - eps
    ref = -(target * logp).sum(-1)
    (ref * weights.double()).sum().backward()

    tol = 1e-5 if dtype == torch.float32 else 1e-4  # bf16 inputs are exact; the math runs in fp32
    assert torch.allclose(loss.double(), ref.detach(), rtol=tol, atol=tol)
    assert fast_in.grad is not None and fast_in.grad.dtype == dtype
    gtol = 1e-5 if dtype == torch.float32 else 1e-2  # the gradient is rounded to bf16
    assert torch.allclose(fast_in.grad.double(), ref_in.grad, rtol=gtol, atol=gtol)


def test_masked_logit_mean_values_no_grad_path_and_errors():
    logits = torch.tensor([[1.0, 2.0, 3.0, 10.0], [0.0, -2.0, 4.0, 6.0]])
    mask = torch.tensor([True, False, True, False])
    with torch.no_grad():
        assert masked_logit_mean(logits, mask).tolist() == [2.0, 2.0]
    assert masked_logit_mean(logits.reshape(2, 1, 4), mask, chunk_size=1).shape == (2, 1)
    with pytest.raises(ValueError, match="mask must be a bool"):
        masked_logit_mean(logits, mask.float())
    with pytest.raises(ValueError, match="at least one"):
        masked_logit_mean(logits, torch.zeros(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="chunk_size"):
        masked_logit_mean(logits, mask, chunk_size=0)


def test_label_smoothing_out_of_range_and_sft_loss_token_mean():
    with pytest.raises(ValueError, match="label_smoothing"):
        label_smoothed_nll(torch.zeros(1), torch.zeros(1), torch.zeros(1), label_smoothing=1.0)
    # sft_loss: masked token sum over the global count (the masked token would add 100)
    nll = torch.tensor([[1.0, 3.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    assert sft_loss(nll, mask, global_num_tokens=4).item() == pytest.approx(1.0)
