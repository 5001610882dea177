"""Reward of the embedded demo task (integer arithmetic, see :mod:`async_rl.data.arith`).

Score 1.0 for the exact answer. The ``digits`` component is the fraction of answer positions right (aligned from the
right, as in column arithmetic), a denser signal to look at while the exact-match score is still low.
"""

from __future__ import annotations

import re
from typing import Any


def compute_score(completion: str, ground_truth: str, prompt: str = "", extra: dict[str, Any] | None = None) -> dict:
    """Exact match of the first line/whitespace-delimited token of ``completion`` against ``ground_truth``."""
    answer = completion.strip().split()[0] if completion.strip() else ""
    target = ground_truth.strip()
    width = max(len(answer), len(target), 1)
    a, t = answer.rjust(width), target.rjust(width)
    digits = sum(1 for x, y in zip(a, t, strict=True) if x == y and y != " ") / max(len(target), 1)
    return {"score": 1.0 if answer == target else 0.0, "digits": min(digits, 1.0)}


_INTEGER = re.compile(r"-?\d+")


def compute_chat_score(
    completion: str, ground_truth: str, prompt: str = "", extra: dict[str, Any] | None = None
) -> dict:
    """For chat answers ("23 + 48 = 71", "The answer is 71."): 1.0 when the LAST integer of ``completion`` is the
    answer. ``bare`` is 1.0 when the completion is only that number (what the prompt asks for)."""
    text = completion.replace(",", "").strip()
    numbers = _INTEGER.findall(text)
    correct = bool(numbers) and numbers[-1] == ground_truth.strip()
    return {"score": 1.0 if correct else 0.0, "bare": 1.0 if correct and text.rstrip(".") == numbers[-1] else 0.0}


CONCISE_WORDS = 4  # answers of at most this many words get the whole score (the prompt asks for just the number)


def compute_chat_gold(
    completion: str, ground_truth: str, prompt: str = "", extra: dict[str, Any] | None = None
) -> dict:
    """A "correct and concise" gold score for reward-model studies: ``correct x min(1, 4 / words)``, so "71",
    "The answer is 71." (4 words) score 1.0, "23 + 48 = 71" 0.8, and a correct answer buried in 40 words 0.1.
    ``correct`` (the last integer is the answer, as :func:`compute_chat_score`) and ``words`` are its components."""
    text = completion.replace(",", "").strip()
    numbers = _INTEGER.findall(text)
    correct = bool(numbers) and numbers[-1] == ground_truth.strip()
    words = len(text.split())
    concise = min(1.0, CONCISE_WORDS / max(words, 1))
    return {"score": concise if correct else 0.0, "correct": float(correct), "words": float(words)}
