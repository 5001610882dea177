"""Rollout correction (verl 0.9.1 semantics): TIS / IcePop weights, rejection masks. The threshold strings are
parsed at the config boundary (``async_rl.config.correction``, tested in tests/config); the math takes numbers.

What was compared against verl 0.9.1 ``verl/trainer/ppo/rollout_corr_helper.py`` and how: every expected value below
was derived by hand from verl's definitions, read in ``_parse_rollout_is_threshold``,
``_parse_rollout_rs_thresholds``, ``compute_rollout_correction_weights`` and ``compute_rollout_rejection_mask``:

- IS weights: ``exp(clamp(d, -20, 20))`` per token or ``exp(clamp(sum_row d, -20, 20))`` per sequence, padding 0;
  a single threshold truncates (TIS), ``"lower_upper"`` zeroes weights outside the bounds (IcePop); batch
  normalisation divides by the mean over valid tokens (token) or over non-empty rows' weights (sequence).
- Rejection: ``k1 = -d`` compared with ``[log lower, log upper]`` (so the bounds apply to ``pi_rollout / pi_train``;
  the cases below are chosen so the opposite reading would give a different mask), ``k2 = d^2 / 2`` and
  ``k3 = exp(d) - 1 - d`` against an upper bound, per token or as a row sum / mean / max; options are ANDed.
- Errors: the same specs verl rejects raise ``ValueError`` here (verl raises ``TypeError`` for bools/other types).

``tools/verl_crosscheck.py`` runs verl's functions on random inputs and compares weights, masks and metrics.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from async_rl.algorithms import ROLLOUT_IS_LEVELS, normalize_is_weights, rejection_mask, rollout_is_weights
from async_rl.config.correction import parse_rs_spec

# ------------------------------------------------------------------------------------------------------ IS weights

# d = old - rollout: row 0 [1, -1, pad], row 1 [.2, .3, .1]
OLD = torch.zeros(2, 3)
ROLLOUT = -torch.tensor([[1.0, -1.0, 99.0], [0.2, 0.3, 0.1]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])


def test_token_tis_weights_and_metrics() -> None:
    w, m = rollout_is_weights(OLD, ROLLOUT, MASK, level="token", upper=2.0, lower=None)
    e = math.exp
    expected = torch.tensor([[2.0, e(-1.0), 0.0], [e(0.2), e(0.3), e(0.1)]])  # e^1 = 2.718 truncated to 2
    torch.testing.assert_close(w, expected)
    valid = [2.0, e(-1.0), e(0.2), e(0.3), e(0.1)]
    mean = sum(valid) / 5
    assert m["rollout_is_mean"].item() == pytest.approx(mean, rel=1e-6)  # 1.208862
    assert m["rollout_is_max"].item() == pytest.approx(2.0)
    assert m["rollout_is_min"].item() == pytest.approx(e(-1.0))
    assert m["rollout_is_ratio_fraction_high"].item() == pytest.approx(0.2)  # raw e > 2
    assert m["rollout_is_ratio_fraction_low"].item() == pytest.approx(0.2)  # raw e^-1 < 1/2
    ess = mean**2 / (sum(v * v for v in valid) / 5)  # 0.842694
    assert m["rollout_is_eff_sample_size"].item() == pytest.approx(ess, rel=1e-6)
    assert "rollout_is_oob_ratio" not in m and "rollout_is_batch_norm_factor" not in m
    assert not w.requires_grad and all(v.ndim == 0 for v in m.values())


def test_token_icepop_zeroes_outside_bounds() -> None:
    w, m = rollout_is_weights(OLD, ROLLOUT, MASK, level="token", upper=2.0, lower=0.5)
    e = math.exp
    # e (> 2) and e^-1 (< .5) are zeroed, not truncated; kept weights keep their value
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.0, 0.0], [e(0.2), e(0.3), e(0.1)]]))
    assert m["rollout_is_oob_ratio"].item() == pytest.approx(0.4)
    assert m["rollout_is_min"].item() == 0.0


def test_sequence_icepop_zeroes_whole_rows() -> None:
    # row 0: d = [ln 2, ln 2, 0] -> raw 4 > 3, the whole row is zeroed; row 1: d = [0] -> raw 1, kept (padding garbage)
    ln2 = math.log(2.0)
    old = torch.zeros(2, 3)
    rollout = torch.tensor([[-ln2, -ln2, 0.0], [0.0, 5.0, -5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    w, m = rollout_is_weights(old, rollout, mask, level="sequence", upper=3.0, lower=0.5)
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]))
    assert m["rollout_is_oob_ratio"].item() == pytest.approx(0.75)  # of valid tokens
    assert m["rollout_is_ratio_fraction_high"].item() == pytest.approx(0.5)  # of non-empty rows
    assert m["rollout_is_ratio_fraction_low"].item() == 0.0
    assert (m["rollout_is_min"].item(), m["rollout_is_max"].item()) == pytest.approx((1.0, 4.0))  # raw row weights


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), level=st.sampled_from(sorted(ROLLOUT_IS_LEVELS)))
def test_truncated_weights_are_bounded_with_ess_in_unit_interval(seed: int, level: str) -> None:
    gen = torch.Generator().manual_seed(seed)
    old = torch.randn(4, 5, generator=gen)
    rollout = (old + torch.randn(4, 5, generator=gen)).requires_grad_(True)
    mask = (torch.rand(4, 5, generator=gen) > 0.2).float()
    mask[0, 0] = 1.0
    w, m = rollout_is_weights(old, rollout, mask, level=level, upper=4.0, lower=None)
    assert 0.0 < m["rollout_is_eff_sample_size"].item() <= 1.0
    assert 0.0 <= w.min().item() and w.max().item() <= 4.0
    assert bool((w[mask.bool()] > 0).all())  # truncation never zeroes a valid token
    assert not w.requires_grad


def test_sequence_level_weights_and_batch_normalize() -> None:
    # row sums of d: 0 -> weight 1; .6 -> e^.6 = 1.822 truncated to 1.5
    w, m = rollout_is_weights(OLD, ROLLOUT, MASK, level="sequence", upper=1.5, lower=None)
    torch.testing.assert_close(w, torch.tensor([[1.0, 1.0, 0.0], [1.5, 1.5, 1.5]]))
    assert m["rollout_is_ratio_fraction_high"].item() == pytest.approx(0.5)  # one of two rows
    assert m["rollout_is_ratio_fraction_low"].item() == 0.0
    assert m["rollout_is_max"].item() == pytest.approx(math.exp(0.6), rel=1e-6)  # the raw row weight
    assert m["rollout_is_min"].item() == pytest.approx(1.0)
    # normalised by the mean of the *row* weights (1 + 1.5) / 2 = 1.25, not the token mean 6.5 / 5 = 1.3
    wn, mn = rollout_is_weights(OLD, ROLLOUT, MASK, level="sequence", upper=1.5, lower=None, batch_normalize=True)
    torch.testing.assert_close(wn, torch.tensor([[0.8, 0.8, 0.0], [1.2, 1.2, 1.2]]))
    assert mn["rollout_is_batch_norm_factor"].item() == pytest.approx(1.25)
    # a fully padded row is not a sequence: same factor
    pad = torch.zeros(1, 3)
    wp, mp = rollout_is_weights(
        torch.cat([OLD, pad]),
        torch.cat([ROLLOUT, pad]),
        torch.cat([MASK, pad]),
        level="sequence",
        upper=1.5,
        lower=None,
        batch_normalize=True,
    )
    assert mp["rollout_is_batch_norm_factor"].item() == pytest.approx(1.25)
    assert torch.equal(wp[2], torch.zeros(3))
    # a global mean through all_reduce: another rank holds rows with weights 1.5 and 2 -> (2.5 + 3.5) / 4 = 1.5
    wg, mg = rollout_is_weights(
        OLD,
        ROLLOUT,
        MASK,
        level="sequence",
        upper=1.5,
        lower=None,
        batch_normalize=True,
        all_reduce=lambda t: t + torch.tensor([3.5, 2.0], dtype=t.dtype),
    )
    assert mg["rollout_is_batch_norm_factor"].item() == pytest.approx(1.5)
    torch.testing.assert_close(wg, torch.tensor([[1 / 1.5, 1 / 1.5, 0.0], [1.0, 1.0, 1.0]]))


def test_token_batch_normalize_and_all_zero_weights() -> None:
    w, m = rollout_is_weights(OLD, ROLLOUT, MASK, level="token", upper=2.0, lower=None, batch_normalize=True)
    assert ((w * MASK).sum() / MASK.sum()).item() == pytest.approx(1.0, rel=1e-6)
    e = math.exp
    assert m["rollout_is_batch_norm_factor"].item() == pytest.approx((2 + e(-1) + e(0.2) + e(0.3) + e(0.1)) / 5)
    # every weight zeroed by IcePop: the mean is 0 <= 1e-8, so the weights are left as they are (factor 1)
    wz, mz = rollout_is_weights(OLD, ROLLOUT, MASK, level="token", upper=4.0, lower=3.0, batch_normalize=True)
    assert torch.equal(wz, torch.zeros_like(wz))
    assert mz["rollout_is_batch_norm_factor"].item() == 1.0
    assert mz["rollout_is_eff_sample_size"].item() == 0.0


def test_normalize_is_weights_for_precomputed_weights() -> None:
    # weights from elsewhere may hold anything on padding (here 1); only valid tokens / non-empty rows enter the mean
    w = torch.tensor([[1.0, 1.0, 1.0], [1.5, 1.5, 1.5]])
    ws, fs = normalize_is_weights(w, MASK, level="sequence")
    assert fs.item() == pytest.approx(1.25)  # rows 1 and 1.5
    torch.testing.assert_close(ws, w / 1.25)
    wt, ft = normalize_is_weights(w, MASK, level="token")
    assert ft.item() == pytest.approx(6.5 / 5)
    torch.testing.assert_close(wt, w / 1.3)
    # "geometric" (the other per-row level) normalises like "sequence"
    geo, _ = rollout_is_weights(OLD, ROLLOUT, MASK, level="geometric", upper=1.5, lower=None)
    _, fg = normalize_is_weights(geo, MASK, level="geometric")
    # row log-ratio means 0 and .2 -> weights 1 and e^.2 = 1.2214 (under the cap)
    assert fg.item() == pytest.approx((1 + math.exp(0.2)) / 2, rel=1e-6)
    # the helper is what rollout_is_weights(batch_normalize=True) applies
    raw, _ = rollout_is_weights(OLD, ROLLOUT, MASK, level="token", upper=2.0, lower=None)
    normed, m = rollout_is_weights(OLD, ROLLOUT, MASK, level="token", upper=2.0, lower=None, batch_normalize=True)
    again, f = normalize_is_weights(raw, MASK)
    torch.testing.assert_close(normed, again)
    assert m["rollout_is_batch_norm_factor"].item() == f.item()
    with pytest.raises(ValueError, match="level"):
        normalize_is_weights(w, MASK, level="row")
    with pytest.raises(ValueError, match="response_mask"):
        normalize_is_weights(w, MASK[:1])


def test_identical_log_probs_give_unit_weights_and_bad_arguments() -> None:
    w, m = rollout_is_weights(OLD, OLD, MASK, level="sequence", upper=2.0, lower=0.5)
    assert torch.equal(w, MASK)
    assert m["rollout_is_eff_sample_size"].item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="level.*sequence.*token"):
        rollout_is_weights(OLD, OLD, MASK, level="batch", upper=2.0, lower=None)
    with pytest.raises(ValueError, match="rollout_log_prob"):
        rollout_is_weights(OLD, OLD[:1], MASK, level="token", upper=2.0, lower=None)
    with pytest.raises(ValueError, match="0 < lower <= upper"):
        rollout_is_weights(OLD, OLD, MASK, level="token", upper=1.0, lower=2.0)
    with pytest.raises(ValueError, match="batch_normalize"):
        rollout_is_weights(OLD, OLD, MASK, level="token", upper=2.0, lower=None, batch_normalize=1)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------- rejection mask

# d = old - rollout per valid token; row 3 is fully padded:
#   row 0 [.1, -.2, .05]   row 1 [1, 0]   row 2 [-.5, .4, .3, .2]   row 3 []
D = torch.tensor([[0.1, -0.2, 0.05, 7.0], [1.0, 0.0, 7.0, 7.0], [-0.5, 0.4, 0.3, 0.2], [7.0, 7.0, 7.0, 7.0]])
RS_MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.float32)
RS_OLD = torch.zeros(4, 4)
RS_ROLLOUT = -D


def _rows(*kept: int) -> torch.Tensor:
    """The mask with only the listed rows kept."""
    keep = torch.zeros(4, 1)
    keep[list(kept)] = 1.0
    return RS_MASK * keep


# Hand-derived per option (k1 = -d, k2 = d^2 / 2, k3 = e^d - 1 - d):
CASES = [
    # token_k1 "0.9_1.5": log .9 <= -d <= log 1.5  <=>  -.405 <= d <= .105; row 1 token 0 and all of row 2 fail
    # (reading the bounds on r instead would keep .4, .3, .2 and reject -.2)
    ("token_k1", "0.9_1.5", RS_MASK * torch.tensor([[1, 1, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]])),
    # token_k2 .03: k2 = .005 .02 .00125 | .5 0 | .125 .08 .045 .02
    ("token_k2", "0.03", RS_MASK * torch.tensor([[1, 1, 1, 0], [0, 1, 0, 0], [0, 0, 0, 1], [0, 0, 0, 0]])),
    # token_k3 .1: k3 = .00517 .01873 .00127 | .71828 0 | .10653 .09182 .04986 .02140
    ("token_k3", 0.1, RS_MASK * torch.tensor([[1, 1, 1, 0], [0, 1, 0, 0], [0, 1, 1, 1], [0, 0, 0, 0]])),
    # seq_sum_k1 "0.8_3.0": sum(-d) = .05 | -1 | -.4 within [log .8, log 3] = [-.223, 1.099]: only row 0
    ("seq_sum_k1", "0.8_3.0", _rows(0)),
    # seq_mean_k1 1.5 (lower 1/1.5): mean(-d) = .0167 | -.5 | -.1 within [-.405, .405]: row 1 fails
    ("seq_mean_k1", 1.5, _rows(0, 2)),
    # seq_sum_k2 .1: .02625 | .5 | .27
    ("seq_sum_k2", "0.1", _rows(0)),
    # seq_mean_k2 .07: .00875 | .25 | .0675
    ("seq_mean_k2", "0.07", _rows(0, 2)),
    # seq_max_k2 .1: .02 | .5 | .125
    ("seq_max_k2", "0.1", _rows(0)),
    # seq_sum_k3 .3: .02517 | .71828 | .26962
    ("seq_sum_k3", "0.3", _rows(0, 2)),
    # seq_mean_k3 .05: .00839 | .35914 | .06740
    ("seq_mean_k3", "0.05", _rows(0)),
    # seq_max_k3 .11: .01873 | .71828 | .10653
    ("seq_max_k3", "0.11", _rows(0, 2)),
]


@pytest.mark.parametrize(("option", "threshold", "expected"), CASES, ids=[c[0] for c in CASES])
def test_each_rejection_option(option: str, threshold: str | float, expected: torch.Tensor) -> None:
    new_mask, m = rejection_mask(RS_OLD, RS_ROLLOUT, RS_MASK, bounds=parse_rs_spec(option, threshold))
    torch.testing.assert_close(new_mask, expected)
    rejected_tokens = (RS_MASK - expected).sum().item()
    rejected_rows = sum(1 for i in range(3) if (RS_MASK[i] - expected[i]).sum().item() > 0)  # of the 3 non-empty rows
    assert m[f"rollout_rs_{option}_masked_fraction"].item() == pytest.approx(rejected_tokens / 9)
    assert m[f"rollout_rs_{option}_seq_masked_fraction"].item() == pytest.approx(rejected_rows / 3)
    assert m["rollout_rs_masked_fraction"].item() == pytest.approx(rejected_tokens / 9)
    assert m["rollout_rs_seq_masked_fraction"].item() == pytest.approx(rejected_rows / 3)


def test_options_are_anded_with_per_option_thresholds() -> None:
    new_mask, m = rejection_mask(
        RS_OLD, RS_ROLLOUT, RS_MASK, bounds=parse_rs_spec("token_k1, seq_max_k3", "0.9_1.5,0.11")
    )
    # token_k1 rejects row 1 token 0 and all of row 2; seq_max_k3 rejects row 1: only row 0 survives
    torch.testing.assert_close(new_mask, _rows(0))
    assert m["rollout_rs_token_k1_masked_fraction"].item() == pytest.approx(5 / 9)
    assert m["rollout_rs_seq_max_k3_masked_fraction"].item() == pytest.approx(2 / 9)
    assert m["rollout_rs_masked_fraction"].item() == pytest.approx(6 / 9)
    assert m["rollout_rs_seq_masked_fraction"].item() == pytest.approx(2 / 3)
    # a shared threshold is broadcast to every option
    shared, _ = rejection_mask(RS_OLD, RS_ROLLOUT, RS_MASK, bounds=parse_rs_spec("seq_sum_k2,seq_max_k2", 0.1))
    torch.testing.assert_close(shared, _rows(0))


def test_rejection_keeps_dtype_clamps_and_rejects_nan() -> None:
    bool_mask = RS_MASK.bool()
    new_mask, _ = rejection_mask(RS_OLD, RS_ROLLOUT, bool_mask, bounds=parse_rs_spec("seq_max_k2", 0.1))
    assert new_mask.dtype == torch.bool
    assert torch.equal(new_mask, _rows(0).bool())
    # log-ratio 50 is clamped to 20: k2 = 200 (not 1250) passes an upper bound of 300
    big = torch.tensor([[50.0]])
    kept, _ = rejection_mask(torch.zeros(1, 1), -big, torch.ones(1, 1), bounds=parse_rs_spec("token_k2", 300.0))
    assert kept.item() == 1.0
    nan = torch.tensor([[float("nan"), 0.0]])
    out, _ = rejection_mask(torch.zeros(1, 2), nan, torch.ones(1, 2), bounds=parse_rs_spec("token_k3", 1.0))
    assert out.tolist() == [[0.0, 1.0]]
    with pytest.raises(ValueError, match="unknown rejection option 'seq_k2'"):
        rejection_mask(RS_OLD, RS_ROLLOUT, RS_MASK, bounds={"seq_k2": (None, 0.1)})
    with pytest.raises(ValueError, match="bad bounds for 'token_k1'"):
        rejection_mask(RS_OLD, RS_ROLLOUT, RS_MASK, bounds={"token_k1": (None, 2.0)})  # k1 needs a lower bound
    with pytest.raises(ValueError, match="at least one option"):
        rejection_mask(RS_OLD, RS_ROLLOUT, RS_MASK, bounds={})
    with pytest.raises(ValueError, match="response_mask"):
        rejection_mask(RS_OLD, RS_ROLLOUT, RS_MASK[:2], bounds=parse_rs_spec("token_k2", 0.1))


def test_geometric_level_is_the_per_token_geometric_mean() -> None:
    """Not in verl (this project's extension): one weight per row, exp(mean of d over its valid tokens)."""
    old = torch.tensor([[0.3, -0.1, 0.4, 9.0], [0.2, -7.0, 5.0, 9.0]])  # padding holds garbage
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    w, _ = rollout_is_weights(old, torch.zeros_like(old), mask, level="geometric", upper=2.0, lower=None)
    # row 0: mean(0.3, -0.1, 0.4) = 0.2 -> e^0.2 = 1.2214 on its 3 tokens; row 1: e^0.2 as well; padding 0
    e02 = 1.2214027581601699
    assert w.flatten().tolist() == pytest.approx([e02, e02, e02, 0.0, e02, 0.0, 0.0, 0.0])
    capped, _ = rollout_is_weights(old, torch.zeros_like(old), mask, level="geometric", upper=1.1, lower=None)
    assert capped[0, 0].item() == pytest.approx(1.1)
