"""Reward of the embedded demo task (integer arithmetic, see :mod:`async_rl.data.arith`).

Score 1.0 for the exact answer. The ``digits`` component is the fraction of answer positions right (aligned from the
right, as in column arithmetic), a denser signal to look at while the exact-match score is still low.
"""

from __future__ import annotations

from typing import Any


def compute_score(completion: str, ground_truth: str, prompt: str = "", extra: dict[str, Any] | None = None) -> dict:
    """Exact match of the first line/whitespace-delimited token of ``completion`` against ``ground_truth``."""
    answer = completion.strip().split()[0] if completion.strip() else ""
    target = ground_truth.strip()
    width = max(len(answer), len(target), 1)
    a, t = answer.rjust(width), target.rjust(width)
    digits = sum(1 for x, y in zip(a, t, strict=True) if x == y and y != " ") / max(len(target), 1)
    return {"score": 1.0 if answer == target else 0.0, "digits": min(digits, 1.0)}
