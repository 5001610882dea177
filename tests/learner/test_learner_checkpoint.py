"""Single-process checkpoint commit protocol, pruning and round trip; HF export and the weight iterator."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _learner_testlib import START, scripted_groups, settings, tiny_policy

from async_rl.learner import Learner, export_hf, iter_full_state, latest, list_checkpoints, local_context
from async_rl.learner.checkpoint import COMMITTED


def test_latest_ignores_incomplete_checkpoints(tmp_path: Path) -> None:
    (tmp_path / "step_3").mkdir()
    (tmp_path / "step_3" / COMMITTED).write_text("ok")
    (tmp_path / "step_5").mkdir()  # renamed but no marker: not a checkpoint
    (tmp_path / "step_7.tmp").mkdir()  # killed mid-save
    (tmp_path / "step_7.tmp" / COMMITTED).write_text("ok")  # even with a marker, a .tmp never counts
    (tmp_path / "notes").mkdir()
    assert latest(tmp_path) == tmp_path / "step_3"
    assert latest(tmp_path / "missing") is None


def test_save_load_round_trip_prunes_and_resumes_exactly(tmp_path: Path) -> None:
    learner = Learner(settings(shuffle=True), START, local_context(), tiny_policy)
    learner.train_step(*scripted_groups(4, 4, seed=1))
    (tmp_path / "step_0.tmp").mkdir()  # a leftover from an older crash is cleaned by the next save
    learner.save_checkpoint(tmp_path, extra=b"ledger-bytes", keep_last=2)
    learner.train_step(*scripted_groups(4, 4, seed=2))
    learner.save_checkpoint(tmp_path, extra={"cursor": 2}, keep_last=2)
    expected = learner.train_step(*scripted_groups(4, 4, seed=3))
    learner.save_checkpoint(tmp_path, extra=None, keep_last=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 3]  # step_1 pruned (keep_last=2)
    assert not (tmp_path / "step_0.tmp").exists()

    fresh = Learner(settings(shuffle=True), START, local_context(), tiny_policy)
    assert fresh.load_checkpoint(tmp_path / "step_2") == {"cursor": 2}
    assert fresh.version == 2
    got = fresh.train_step(*scripted_groups(4, 4, seed=3))
    for key in ("learner/actor/pg_loss", "learner/actor/grad_norm", "learner/actor/loss"):
        assert got[key] == expected[key], key  # bit-identical (fp32 CPU)
    for (name, a), (_, b) in zip(learner.model.state_dict().items(), fresh.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    learner.train_step(*scripted_groups(4, 4, seed=4))
    learner.save_checkpoint(tmp_path, extra=None, keep_last=None)  # the config's default: keep every checkpoint
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 3, 4]
    with pytest.raises(ValueError, match="not a committed checkpoint"):
        fresh.load_checkpoint(tmp_path / "step_9")


@pytest.mark.parametrize("tie", [False, True])
def test_export_hf_reloads_with_transformers(tmp_path: Path, tie: bool) -> None:
    from transformers import AutoModelForCausalLM

    ctx = local_context()
    model = tiny_policy(seed=3, tie=tie)
    names = [n for n, _ in iter_full_state(model, ctx, dtype=None)]
    assert ("lm_head.weight" in names) is (not tie)  # a tied output embedding is sent once, under its input name
    assert len(names) == len(set(names))
    out = export_hf(model, ctx, tmp_path / "hf", dtype=torch.bfloat16 if tie else None)
    assert not (tmp_path / "hf.tmp").exists()
    loaded = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    ids = torch.tensor([[1, 5, 9, 2]])
    with torch.no_grad():
        want = model(input_ids=ids).logits
        have = loaded(input_ids=ids).logits
    if tie:
        assert loaded.config.tie_word_embeddings
        torch.testing.assert_close(have, want, atol=5e-2, rtol=0)  # bf16 round trip
    else:
        assert torch.equal(have, want)
