"""Per-token log-probs, entropy and values of response tokens, padded and packed, against per-sequence references."""

from __future__ import annotations

import pytest
import torch
from _learner_testlib import collate, scripted_groups, tiny_critic, tiny_policy

from async_rl.learner.policy import build_micro_inputs, response_log_probs, response_values
from async_rl.learner.shared_prompt import use_shared_prompt_attention


def _reference_log_probs(model: torch.nn.Module, batch, temperature: float = 1.0) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """Run each sequence alone, unpadded: log_softmax of the logits at positions pl-1 .. pl+tl-2."""
    out = torch.zeros_like(batch.rollout_log_probs)
    width = batch.prompt_width
    for i in range(len(batch)):
        pl, tl = int(batch.prompt_lengths[i]), int(batch.response_lengths[i])
        seq = batch.input_ids[i, width - pl : width + tl].unsqueeze(0)
        logits = model(input_ids=seq).logits[0].double() / temperature
        logp = torch.log_softmax(logits, dim=-1)
        for j in range(tl):
            out[i, j] = logp[pl - 1 + j, seq[0, pl + j]]
    return out


@pytest.fixture(scope="module")
def setup() -> tuple[torch.nn.Module, object]:
    model = tiny_policy(seed=4).eval()
    use_shared_prompt_attention(model)  # sdpa unless a call passes a shared layout
    batch = collate(*scripted_groups(3, 2, seed=9))
    return model, batch


@pytest.mark.parametrize("layout", ["padded", "packed", "shared"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_log_probs_match_per_sequence_reference(setup, layout: str, temperature: float) -> None:  # type: ignore[no-untyped-def]
    model, batch = setup
    rows = list(range(len(batch)))
    with torch.no_grad():
        expected = _reference_log_probs(model, batch, temperature)
        mi = build_micro_inputs(batch, rows, layout=layout, device=torch.device("cpu"))
        got, ent = response_log_probs(model, mi, temperature=temperature)
    assert ent is None
    assert got.shape == batch.responses.shape
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=0)
    assert bool((got[batch.response_mask == 0] == 0).all())
    assert float(got[batch.response_mask == 1].max()) < 0  # real log-probs, not the zero padding


def test_packed_rows_restart_positions_and_hold_whole_sequences(setup) -> None:  # type: ignore[no-untyped-def]
    _, batch = setup
    rows = list(range(len(batch)))
    mi = build_micro_inputs(batch, rows, layout="packed", device=torch.device("cpu"))
    lengths = (batch.prompt_lengths + batch.response_lengths).tolist()
    assert mi.attention_mask is None and mi.packed
    assert mi.input_ids.shape[1] == max(lengths)  # rows are capped at the longest sequence
    assert mi.input_ids.shape[0] < len(rows)  # ... and still hold several short sequences each
    # every row is a run of blocks whose positions count 0, 1, 2, ...: a restart is the only non-+1 step
    for r in range(mi.position_ids.shape[0]):
        pos = mi.position_ids[r].tolist()
        assert pos[0] == 0 and all(b == a + 1 or b == 0 for a, b in zip(pos, pos[1:], strict=False))
    assert mi.labels.tolist() == batch.responses[batch.response_mask.bool()].tolist()
    padded = build_micro_inputs(batch, rows, layout="padded", device=torch.device("cpu"))
    assert mi.num_slots < padded.num_slots


def test_entropy_modes(setup) -> None:  # type: ignore[no-untyped-def]
    model, batch = setup
    mi = build_micro_inputs(batch, [0, 1, 2], layout="padded", device=torch.device("cpu"))
    lp, ent = response_log_probs(model, mi, temperature=1.0, entropy="detached")
    assert lp.requires_grad and ent is not None and not ent.requires_grad
    _, ent_grad = response_log_probs(model, mi, temperature=1.0, entropy="grad")
    assert ent_grad is not None and ent_grad.requires_grad
    torch.testing.assert_close(ent, ent_grad.detach())
    mask = batch.response_mask[:3].bool()
    # entropy over a 64-token vocabulary lies in (0, ln 64]
    assert float(ent[mask].min()) > 0 and float(ent[mask].max()) <= torch.log(torch.tensor(64.0)).item() + 1e-5
    with pytest.raises(ValueError, match="entropy"):
        response_log_probs(model, mi, temperature=1.0, entropy="yes")


@pytest.mark.parametrize("layout", ["padded", "packed", "shared"])
def test_values_read_the_position_before_each_response_token(setup, layout: str) -> None:  # type: ignore[no-untyped-def]
    _, batch = setup
    critic = tiny_critic().eval()
    use_shared_prompt_attention(critic)
    width = batch.prompt_width
    with torch.no_grad():
        got = response_values(critic, build_micro_inputs(batch, [0, 2], layout=layout, device=torch.device("cpu")))
        for row, i in enumerate([0, 2]):
            pl, tl = int(batch.prompt_lengths[i]), int(batch.response_lengths[i])
            seq = batch.input_ids[i, width - pl : width + tl].unsqueeze(0)
            alone = critic(input_ids=seq).logits[0, :, 0]
            torch.testing.assert_close(got[row, :tl], alone[pl - 1 : pl + tl - 1], atol=2e-5, rtol=0)
            assert bool((got[row, tl:] == 0).all())
