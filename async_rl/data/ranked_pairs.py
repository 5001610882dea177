"""Preference pairs from ranked samples: a gold scorer ranks a policy's own samples of one prompt, and the best and
worst of them become (chosen, rejected) pairs, as reward-model over-optimisation studies build their data (Gao et al.,
"Scaling Laws for Reward Model Overoptimization"). Pure bookkeeping; ``tools/make_preference_pairs.py`` samples with
the actors' vLLM engine and scores with the configured reward function.

The rows are TRL's preference layout (:mod:`async_rl.data.preferences` reads it back): ``prompt`` (the prompt as the
dataset gives it: a string or chat messages), ``chosen`` and ``rejected`` (response strings), plus the gold scores
``chosen_gold`` and ``rejected_gold`` for inspection (the reader ignores other fields).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["ranked_pairs"]


def ranked_pairs(prompt: Any, samples: Sequence[tuple[str, float]], *, max_pairs: int) -> list[dict[str, Any]]:
    """Up to ``max_pairs`` rows for one prompt from its ``(text, gold score)`` samples: distinct texts ranked by
    score (ties keep sampling order), then the k-th best against the k-th worst, for k = 0, 1, ... while the k-th best
    scores strictly higher and the two are different samples. No pair when every sample scores the same."""
    if max_pairs < 1:
        raise ValueError(f"max_pairs must be >= 1, got {max_pairs}")
    seen: set[str] = set()
    distinct: list[tuple[str, float]] = []
    for text, score in samples:
        if text.strip() and text not in seen:
            seen.add(text)
            distinct.append((text, float(score)))
    ranked = sorted(distinct, key=lambda s: -s[1])  # stable: ties keep sampling order
    rows: list[dict[str, Any]] = []
    for k in range(max_pairs):
        best, worst = k, len(ranked) - 1 - k
        if best >= worst or ranked[best][1] <= ranked[worst][1]:
            break
        rows.append(
            {
                "prompt": prompt,
                "chosen": ranked[best][0],
                "rejected": ranked[worst][0],
                "chosen_gold": ranked[best][1],
                "rejected_gold": ranked[worst][1],
            }
        )
    return rows
