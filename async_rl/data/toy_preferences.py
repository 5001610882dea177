"""A separable toy preference set generated in code: for ``a+b=``, the correct sum is chosen over a wrong one.

Every pair is ``{"prompt", "chosen", "rejected"}`` in TRL's layout, as plain text (``"3+4="``, ``"7"`` over ``"9"``,
for the tiny char-level model) or as chat (a user question, then one assistant message each, for instruct models).
The pairs are all (problem, wrong answer) combinations of one-digit operands with wrong answers within 3 of the sum,
shuffled once with a fixed seed; the eval split is its first ``EVAL_PAIRS``, the train split the rest, so no pair is in
both (problems are shared: a held-out pair asks the model to prefer a correct sum over a wrong answer it never saw
against that problem). ``tools/make_toy_preferences.py`` writes them to jsonl files.
"""

from __future__ import annotations

import random
from typing import Any

__all__ = ["EVAL_PAIRS", "make_toy_preferences"]

EVAL_PAIRS = 100
_SPLIT_SEED = 20261205
_MAX_OFF = 3


def _all_pairs() -> list[tuple[int, int, int]]:
    out: list[tuple[int, int, int]] = []
    for a in range(10):
        for b in range(10):
            out.extend((a, b, a + b + d) for d in range(-_MAX_OFF, _MAX_OFF + 1) if d and a + b + d >= 0)
    random.Random(_SPLIT_SEED).shuffle(out)
    return out


def make_toy_preferences(*, split: str, chat: bool, seed: int) -> list[dict[str, Any]]:
    """The ``split`` ("train" or "eval") pairs, in an order drawn from ``seed``; ``chat`` = chat messages."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    pairs = _all_pairs()
    pairs = pairs[:EVAL_PAIRS] if split == "eval" else pairs[EVAL_PAIRS:]
    random.Random(seed).shuffle(pairs)
    out: list[dict[str, Any]] = []
    for a, b, wrong in pairs:
        right = str(a + b)
        if chat:
            prompt: Any = [{"role": "user", "content": f"What is {a} + {b}? Answer with just the number."}]
            chosen: Any = [{"role": "assistant", "content": right}]
            rejected: Any = [{"role": "assistant", "content": str(wrong)}]
        else:
            prompt, chosen, rejected = f"{a}+{b}=", right, str(wrong)
        out.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
    return out
