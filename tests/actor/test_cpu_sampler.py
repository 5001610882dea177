"""The inverse-CDF sampler for vLLM's CPU workers: the right distribution, never a masked token, seeds honoured."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from async_rl.actor import cpu_sampler
from async_rl.actor.cpu_sampler import block_size, row_uniforms, sample


def chi2_bound(dof: int, z: float = 3.72) -> float:
    """The chi-square quantile at one-sided normal deviate ``z`` (3.72: p = 1e-4), Wilson-Hilferty."""
    a = 2.0 / (9.0 * dof)
    return dof * (1.0 - a + z * math.sqrt(a)) ** 3


def chi2(tokens: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic of ``tokens`` against ``probs``: cells expecting at least 20 draws, the rest pooled."""
    n = tokens.numel()
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    expected = probs.double() * n
    big = expected >= 20
    obs = torch.cat([counts[big], counts[~big].sum().unsqueeze(0)])
    exp = torch.cat([expected[big], expected[~big].sum().unsqueeze(0)])
    keep = exp > 0
    stat = float((((obs - exp) ** 2)[keep] / exp[keep]).sum())
    return stat, int(keep.sum()) - 1


def test_block_size_prefers_a_divisor_near_1024() -> None:
    assert block_size(49152) == 1024  # SmolLM2
    assert block_size(151936) == 1187  # Qwen2.5: 128 x 1187
    assert block_size(32000) == 1000
    assert block_size(3001) == 1024  # a prime: 2 full blocks and a last one of 953
    assert block_size(64) == 64  # one block


@pytest.mark.parametrize("vocab", [3001, 4096, 64])
@pytest.mark.parametrize("normalized", [True, False])
def test_draws_follow_the_softmax_and_skip_masked_entries(vocab: int, normalized: bool) -> None:
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(vocab, generator=g) * 3.0
    masked = torch.zeros(vocab, dtype=torch.bool)
    masked[3 : vocab // 4] = True  # as top-k/top-p would leave them
    logits[masked] = -math.inf
    rows = 60_000
    x = logits.log_softmax(-1) if normalized else logits + 7.5  # raw logits: any shift
    batch = x.expand(rows, vocab).contiguous()
    tokens = sample(batch, torch.rand(rows, generator=g), normalized=normalized, overwrite=not normalized)
    assert tokens.shape == (rows,) and tokens.dtype == torch.int64
    assert int(masked[tokens].sum()) == 0
    stat, dof = chi2(tokens, logits.softmax(-1))
    assert stat < chi2_bound(dof), (stat, dof)


def test_the_ends_of_the_unit_interval_pick_the_first_and_last_allowed_entries() -> None:
    vocab = 2500  # blocks of 1024, 1024 and 452
    logits = torch.full((2, vocab), -math.inf)
    logits[:, [5, 700, 1500, 2400]] = torch.tensor([0.0, 1.0, 2.0, 3.0])
    logits[:, 2499] = -math.inf
    lp = logits.log_softmax(-1)
    lowest, highest = 0.0, float(torch.nextafter(torch.tensor(1.0), torch.tensor(0.0)))
    tokens = sample(lp, torch.tensor([lowest, highest]), normalized=True, overwrite=False)
    assert tokens.tolist() == [5, 2400]
    # a uniform just past the first entry's probability lands on the second entry
    p5 = float(lp[0, 5].exp())
    assert sample(lp[:1], torch.tensor([p5 * 1.0001]), normalized=True, overwrite=False).tolist() == [700]
    assert torch.equal(lp, logits.log_softmax(-1))  # overwrite=False left the input alone


def test_seeded_rows_repeat_and_the_rest_come_from_the_default_generator() -> None:
    gens = {1: torch.Generator().manual_seed(11), 3: torch.Generator().manual_seed(12)}
    torch.manual_seed(0)
    first = row_uniforms(4, gens)
    gens_again = {1: torch.Generator().manual_seed(11), 3: torch.Generator().manual_seed(12)}
    torch.manual_seed(1)
    second = row_uniforms(4, gens_again)
    assert first[1] == second[1] and first[3] == second[3]
    assert first[0] != second[0] and first[2] != second[2]
    assert bool(((first >= 0) & (first < 1)).all())


vllm = pytest.importorskip("vllm")


@pytest.mark.parametrize("mode", ["processed_logprobs", "processed_logits", "raw_logprobs"])
def test_the_vllm_forward_returns_what_each_logprobs_mode_asks_for(mode: str) -> None:
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 300, generator=g) * 2
    self = SimpleNamespace(use_fp64_gumbel=False, logprobs_mode=mode)
    k = torch.full((6,), 5, dtype=torch.long)  # top-5: only those can be drawn
    top5 = logits.topk(5, dim=-1).indices
    tokens, returned = cpu_sampler.sampling_forward(self, logits.clone(), {}, k, None)
    assert bool((top5 == tokens.unsqueeze(1)).any(1).all())
    kept = torch.full_like(logits, -math.inf).scatter(1, top5, logits.gather(1, top5))
    if mode == "processed_logprobs":
        assert returned is not None
        torch.testing.assert_close(returned, kept.log_softmax(-1))
    elif mode == "processed_logits":
        assert returned is not None
        torch.testing.assert_close(returned, kept)
    else:
        assert returned is None


def test_install_patches_vllms_cpu_path_once_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler

    original = TopKTopPSampler.forward_cpu
    monkeypatch.setattr(TopKTopPSampler, "forward_cpu", original)  # restored after the test
    monkeypatch.setattr(cpu_sampler, "_ORIGINAL", {})
    monkeypatch.delenv(cpu_sampler.ENV, raising=False)
    assert cpu_sampler.install() is False and TopKTopPSampler.forward_cpu is original
    monkeypatch.setenv(cpu_sampler.ENV, "vllm")
    assert cpu_sampler.install() is False and TopKTopPSampler.forward_cpu is original
    assert not cpu_sampler.installed()
    monkeypatch.setenv(cpu_sampler.ENV, "inverse_cdf")
    assert cpu_sampler.install() is True and cpu_sampler.install() is True
    assert TopKTopPSampler.forward_cpu is cpu_sampler.sampling_forward
    assert cpu_sampler._ORIGINAL["forward_cpu"] is original and cpu_sampler.installed()
