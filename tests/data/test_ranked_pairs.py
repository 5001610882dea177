"""Preference pairs from gold-ranked samples: best against worst, distinct texts, strict preferences only."""

from __future__ import annotations

import pytest

from async_rl.config.reward_model_train import RewardDataConfig
from async_rl.data.preferences import parse_pair
from async_rl.data.ranked_pairs import ranked_pairs

USER = [{"role": "user", "content": "What is 23 + 48? Answer with just the number."}]


def test_best_against_worst_then_the_next_ones() -> None:
    samples = [("23 + 48 = 71", 0.8), ("70", 0.0), ("71", 1.0), ("To solve this", 0.0), ("The sum is 71", 1.0)]
    rows = ranked_pairs(USER, samples, max_pairs=3)
    # ranked: "71" 1.0, "The sum is 71" 1.0, "23 + 48 = 71" 0.8, "70" 0.0, "To solve this" 0.0
    assert [(r["chosen"], r["rejected"]) for r in rows] == [("71", "To solve this"), ("The sum is 71", "70")]
    assert rows[0]["chosen_gold"] == 1.0 and rows[0]["rejected_gold"] == 0.0 and rows[0]["prompt"] == USER
    # every row reads back as a chat pair in TRL's layout (the gold fields are ignored)
    pair = parse_pair(rows[0], "pairs.jsonl:1", RewardDataConfig())
    assert (pair.prompt, pair.chosen, pair.rejected, pair.margin) == (USER, "71", "To solve this", 0.0)


def test_no_pair_without_a_strict_preference_and_duplicates_count_once() -> None:
    assert ranked_pairs("p", [("a", 1.0), ("b", 1.0), ("c", 1.0)], max_pairs=2) == []
    assert ranked_pairs("p", [("a", 1.0), ("a", 1.0), ("a", 0.0)], max_pairs=2) == []  # one distinct text
    assert ranked_pairs("p", [("a", 1.0), ("", 0.0), ("  ", 0.0)], max_pairs=2) == []  # empty replies are no pair
    rows = ranked_pairs("p", [("a", 1.0), ("b", 0.5), ("c", 0.0)], max_pairs=5)
    assert [(r["chosen"], r["rejected"]) for r in rows] == [("a", "c")]  # the middle one has no partner left
    with pytest.raises(ValueError, match="max_pairs must be >= 1"):
        ranked_pairs("p", [("a", 1.0)], max_pairs=0)
