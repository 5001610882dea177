"""tools/make_preference_pairs.py's scoring and pairing, with the real sandboxed reward worker and the gold scorer
(the sampling is the actors' GenerationEngine, tested with the actor; the tool runs end to end in the recipe)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))

from make_preference_pairs import score_and_pair  # noqa: E402

from async_rl.rewards.worker import RewardWorker  # noqa: E402

USER = [{"role": "user", "content": "What is 23 + 48? Answer with just the number."}]


def test_gold_ranked_pairs_and_counts() -> None:
    rows = [
        {"prompt": USER, "ground_truth": "71", "extra": {}},
        {"prompt": USER, "ground_truth": "71", "extra": {}},  # every sample wrong: no pair
    ]
    texts = [["23 + 48 = 71", "70", "71", "To solve this, we need to add 23"], ["70", "72", "69", "1"]]
    with RewardWorker("async_rl.rewards.arith:compute_chat_gold", timeout_s=30.0) as worker:
        result = score_and_pair(rows, ["p", "p"], texts, worker, max_pairs=2)
    pairs = result.pop("pairs")
    assert [(p["chosen"], p["rejected"]) for p in pairs] == [
        ("71", "To solve this, we need to add 23"),
        ("23 + 48 = 71", "70"),
    ]
    assert pairs[1]["chosen_gold"] == 0.8 and pairs[0]["prompt"] == USER
    assert result == {"prompts": 2, "samples": 8, "gold_mean": 0.225, "num_pairs": 2, "prompts_with_a_pair": 1}
    json.dumps(pairs)  # the rows are JSON as written
