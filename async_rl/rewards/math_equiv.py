"""Mathematical-answer equivalence with HuggingFace's maintained ``math-verify`` library (no hand-written parser).

``math_verify.parse`` extracts LaTeX/plain answers (``\\boxed{}``, fractions, sets, intervals) and ``verify`` checks
symbolic equivalence, so ``\\frac{1}{2}`` and ``0.5`` match. math-verify guards its own parsing with time limits
that need the main thread; the reward worker runs functions in its child's main thread, so they apply.
"""

from __future__ import annotations

from typing import Any


def compute_score(completion: str, ground_truth: str, prompt: str = "", extra: dict[str, Any] | None = None) -> float:
    """1.0 when the completion's final answer is mathematically equivalent to ``ground_truth``, else 0.0."""
    from math_verify import parse, verify

    gold = parse(ground_truth if "$" in ground_truth or "\\" in ground_truth else f"${ground_truth}$")
    answer = parse(completion)
    if not gold or not answer:
        return 0.0
    return 1.0 if verify(gold, answer) else 0.0
