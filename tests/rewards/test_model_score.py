"""The reward model's scorer (batches, padding, truncation, normalisation, refusals) and the reward combination."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from _reward_model_fixture import PAD, STATS, VOCAB, export_reward_model

from async_rl.rewards import RewardResult
from async_rl.rewards.model_client import InlineRewardModel, RewardWeights, check_scores, combine
from async_rl.rewards.model_score import RewardModelScorer, UntrustedScore


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_reward_model(tmp_path_factory.mktemp("rm"))


def _alone(model_dir: Path, seq: list[int]) -> float:
    """The transformers model's own score of one unpadded sequence."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.inference_mode():
        return float(model(input_ids=torch.tensor([seq])).logits[0, 0])


SEQS = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15], [3, 30], [40, 41, 42, 43]]


def test_batched_scores_equal_each_sequence_scored_alone_and_are_normalised(rm_dir: Path) -> None:
    raw = RewardModelScorer(rm_dir, max_batch=3, max_length=64, normalize=False, dtype="float32", cpu_threads=None)
    scores = raw.raw_scores(SEQS)  # a batch of 3 (right-padded to 7 tokens) and a batch of 1
    alone = [_alone(rm_dir, s) for s in SEQS]
    assert scores == pytest.approx(alone, abs=1e-5)
    assert max(alone) - min(alone) > 0.1  # the sequences really score differently
    normalised = RewardModelScorer(
        rm_dir, max_batch=8, max_length=64, normalize=True, dtype="float32", cpu_threads=None
    ).scores(SEQS)
    assert normalised == pytest.approx([(a - STATS["mean"]) / STATS["std"] for a in alone], abs=1e-5)


def test_a_long_sequence_keeps_its_last_tokens(rm_dir: Path) -> None:
    scorer = RewardModelScorer(rm_dir, max_batch=4, max_length=3, normalize=False, dtype="float32", cpu_threads=None)
    long = [9, 10, 11, 12, 13, 14, 15]
    assert scorer.raw_scores([long]) == pytest.approx([_alone(rm_dir, long[-3:])], abs=1e-5)


def test_ids_outside_the_vocabulary_and_empty_sequences_are_refused(rm_dir: Path) -> None:
    scorer = RewardModelScorer(rm_dir, max_batch=4, max_length=64, normalize=False, dtype="float32", cpu_threads=None)
    with pytest.raises(UntrustedScore, match=rf"\[0, {VOCAB}\), got 1\.\.{VOCAB}"):
        scorer.scores([[1, VOCAB]])
    with pytest.raises(UntrustedScore, match="empty"):
        scorer.scores([[]])


def test_a_non_finite_score_is_refused(rm_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scorer = RewardModelScorer(rm_dir, max_batch=4, max_length=64, normalize=False, dtype="float32", cpu_threads=None)
    monkeypatch.setattr(scorer, "raw_scores", lambda seqs: [1.0, float("nan")])
    with pytest.raises(UntrustedScore, match=r"non-finite scores for sequences \[1\]"):
        scorer.scores([[5], [6]])
    monkeypatch.setattr(scorer, "_prefix_scores", lambda *args: [1.0, float("inf")])  # the group path's
    inline = InlineRewardModel(scorer)
    with pytest.raises(UntrustedScore, match=r"sequences \[1\]"):
        inline.score([5], [[6], [7]])
    assert inline.stats.untrusted == 1 and inline.stats.requests == 0


def test_bad_exports_are_named(tmp_path: Path) -> None:
    two = export_reward_model(tmp_path / "two", num_labels=2)
    with pytest.raises(ValueError, match="one label"):
        RewardModelScorer(two, max_batch=4, max_length=64, normalize=False, dtype="float32", cpu_threads=None)
    one = export_reward_model(tmp_path / "one")
    (one / "reward_stats.json").unlink()
    with pytest.raises(ValueError, match="reward_stats.json"):
        RewardModelScorer(one, max_batch=4, max_length=64, normalize=True, dtype="float32", cpu_threads=None)
    (one / "reward_stats.json").write_text(json.dumps({"mean": 0.0}))
    with pytest.raises(ValueError, match="normalize=false"):
        RewardModelScorer(one, max_batch=4, max_length=64, normalize=True, dtype="float32", cpu_threads=None)
    # raw scores need no statistics
    RewardModelScorer(one, max_batch=4, max_length=64, normalize=False, dtype="float32", cpu_threads=None)
    with pytest.raises(ValueError, match="smaller than the policy's"):
        RewardModelScorer(
            one, max_batch=4, max_length=64, normalize=False, dtype="float32", vocab_size=VOCAB + 1, cpu_threads=None
        )


def test_a_groups_prompt_computed_once_gives_the_whole_sequences_scores(rm_dir: Path) -> None:
    scorer = RewardModelScorer(rm_dir, max_batch=3, max_length=64, normalize=True, dtype="float32", cpu_threads=None)
    prompt, responses = [5, 6, 7, 8], [[9], [10, 11, 12, 13, 14], [3, 30, 31], [40, 41]]
    whole = scorer.scores([prompt + r for r in responses])
    assert scorer.group_scores(prompt, responses) == pytest.approx(whole, abs=1e-5)  # chunks of 3 and 1
    assert max(whole) - min(whole) > 0.1
    # a final EOS that is also the pad token: both paths read the score at the token before it
    ended = [[9, PAD], [10, 11, PAD, PAD]]
    assert scorer.group_scores(prompt, ended) == pytest.approx(scorer.scores([prompt + r for r in ended]), abs=1e-5)
    assert scorer.group_scores(prompt, ended) == pytest.approx(scorer.group_scores(prompt, [[9], [10, 11]]), abs=1e-6)
    # a group that would be truncated is scored as whole (truncated) sequences
    short = RewardModelScorer(rm_dir, max_batch=8, max_length=6, normalize=True, dtype="float32", cpu_threads=None)
    assert short.group_scores(prompt, responses) == pytest.approx(
        short.scores([prompt + r for r in responses]), abs=1e-6
    )
    with pytest.raises(UntrustedScore, match=rf"\[0, {VOCAB}\)"):
        scorer.group_scores(prompt, [[9], [VOCAB]])


def test_inline_scores_a_group_as_prompt_plus_each_response(rm_dir: Path) -> None:
    scorer = RewardModelScorer(rm_dir, max_batch=8, max_length=64, normalize=True, dtype="float32", cpu_threads=None)
    inline = InlineRewardModel(scorer)
    got = inline.score([5, 6], [[7, 8], [9]])
    assert got == pytest.approx(scorer.scores([[5, 6, 7, 8], [5, 6, 9]]))
    assert (inline.stats.requests, inline.stats.sequences) == (1, 2)
    assert PAD == scorer.pad_token_id


def test_combine_weights_rule_and_model_and_keeps_every_component() -> None:
    rule = RewardResult(score=1.0, components={"format": 0.5})
    out = combine(rule, -0.5, RewardWeights(model=2.0, rule=0.5))
    assert out.score == pytest.approx(0.5 * 1.0 + 2.0 * -0.5)
    assert out.components == {"format": 0.5, "rule": 1.0, "reward_model": -0.5}
    model_only = combine(rule, 3.0, RewardWeights(model=1.0, rule=0.0))
    assert model_only.score == 3.0 and model_only.components["rule"] == 1.0


def test_check_scores_refuses_wrong_counts_and_non_finite_values() -> None:
    assert check_scores([1, 2.5], 2) == [1.0, 2.5]
    with pytest.raises(UntrustedScore, match="3 scores for 2"):
        check_scores([1.0, 2.0, 3.0], 2)
    with pytest.raises(UntrustedScore, match=r"completions \[0\]"):
        check_scores([float("inf"), 0.0], 2)


def test_a_response_is_finished_as_the_trainers_sequences_ended(tmp_path: Path) -> None:
    eos, turn_end = 1, [7, 8]  # SmolLM2's would be <|im_end|> and a newline
    rm = export_reward_model(tmp_path / "rm", stats={**STATS, "turn_end_ids": turn_end})
    config = json.loads((rm / "config.json").read_text())
    (rm / "config.json").write_text(json.dumps({**config, "eos_token_id": eos}))
    scorer = RewardModelScorer(rm, max_batch=4, max_length=64, normalize=True, dtype="float32", cpu_threads=None)
    assert scorer.turn_end == turn_end
    assert scorer.finish([9, 10, eos]) == [9, 10, 7, 8]  # stopped at EOS
    assert scorer.finish([9, 10, eos, PAD, PAD]) == [9, 10, 7, 8]
    assert scorer.finish([9, 10]) == [9, 10, 7, 8]  # cut at the length limit: finished the same way
    prompt, responses = [5, 6, 7], [[9, eos], [10, 11, eos], [12]]
    expected = scorer.scores([prompt + r[:-1] + turn_end if r[-1] == eos else prompt + r + turn_end for r in responses])
    assert scorer.group_scores(prompt, responses) == pytest.approx(expected, abs=1e-5)
    # an export that records nothing scores responses as sampled, only trailing padding dropped
    old = RewardModelScorer(
        export_reward_model(tmp_path / "old"),
        max_batch=4,
        max_length=64,
        normalize=True,
        dtype="float32",
        cpu_threads=None,
    )
    assert old.turn_end is None and old.finish([9, eos, PAD]) == [9, eos]
    (rm / "reward_stats.json").write_text(json.dumps({**STATS, "turn_end_ids": "im_end"}))
    with pytest.raises(ValueError, match="turn_end_ids must be a list of token ids"):
        RewardModelScorer(rm, max_batch=4, max_length=64, normalize=True, dtype="float32", cpu_threads=None)


def test_cpu_threads_sets_the_scorers_torch_threads(rm_dir: Path) -> None:
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        RewardModelScorer(rm_dir, max_batch=4, max_length=64, normalize=True, dtype="float32", cpu_threads=1)
        assert torch.get_num_threads() == 1
        RewardModelScorer(
            rm_dir, max_batch=4, max_length=64, normalize=True, dtype="float32", cpu_threads=None
        )  # null: left alone
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_groups_of_one_are_scored_together_and_a_bad_group_alone(rm_dir: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    scorer = RewardModelScorer(rm_dir, max_batch=4, max_length=64, normalize=True, dtype="float32", cpu_threads=None)
    items = [([5, 6], [[9]]), ([5, 6, 7], [[10, 11], [12]]), ([5], [[VOCAB]]), ([8], [[13, 14]]), ([2], [[3]])]
    expected = (
        [scorer.group_scores(p, r) for p, r in items[:2]] + [None] + [scorer.group_scores(p, r) for p, r in items[3:]]
    )
    batches: list[int] = []
    real = scorer.raw_scores

    def recording(seqs):  # type: ignore[no-untyped-def]
        batches.append(len(seqs))
        return real(seqs)

    monkeypatch.setattr(scorer, "raw_scores", recording)
    results = scorer.score_groups(items)
    assert batches == [3]  # the three valid groups of one completion, in one call (one padded pass of 3)
    assert isinstance(results[2], UntrustedScore) and "token ids must be in" in str(results[2])
    for got, want in zip(results, expected, strict=True):
        if want is not None:
            assert got == pytest.approx(want, abs=1e-5)
