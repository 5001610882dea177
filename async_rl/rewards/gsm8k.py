"""GSM8K-style final-answer exact match.

The model is asked to end with ``#### <number>`` (GSM8K's own answer format). ``method="strict"`` reads only that
marker; ``method="flexible"`` falls back to the last number in the completion. Commas and a trailing ``.`` are
ignored, and ``12.0`` equals ``12``. Score: ``correct_score`` if the answer matches the ground truth, ``format_score``
if an answer was found but is wrong, 0 if none was found.
"""

from __future__ import annotations

import re
from typing import Any

_STRICT = re.compile(r"####\s*(-?[\d,]*\.?\d+)")
_NUMBER = re.compile(r"-?[\d,]*\.?\d+")


def extract_answer(text: str, method: str = "strict") -> str | None:
    """Return the final answer in ``text`` as a normalised number string, or None."""
    if method not in ("strict", "flexible"):
        raise ValueError(f"method must be 'strict' or 'flexible', got {method!r}")
    found = _STRICT.findall(text)
    if found:
        return _normalize(found[-1])
    if method == "flexible":
        numbers = [n for n in _NUMBER.findall(text) if n.strip(",.")]
        if numbers:
            return _normalize(numbers[-1])
    return None


def _normalize(number: str) -> str:
    number = number.replace(",", "").rstrip(".")
    try:
        value = float(number)
    except ValueError:
        return number
    return str(int(value)) if value.is_integer() else repr(value)


def compute_score(
    completion: str,
    ground_truth: str,
    prompt: str = "",
    extra: dict[str, Any] | None = None,
    method: str = "strict",
    format_score: float = 0.0,
    correct_score: float = 1.0,
) -> dict[str, float]:
    """Score a GSM8K completion; ``ground_truth`` may be the bare number or a full ``... #### 72`` solution."""
    answer = extract_answer(completion, method)
    target = extract_answer(ground_truth, "flexible") if "####" in ground_truth else _normalize(ground_truth.strip())
    if answer is None:
        return {"score": 0.0, "format": 0.0}
    return {"score": correct_score if answer == target else format_score, "format": 1.0}
