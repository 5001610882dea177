"""The embedded demo task: integer arithmetic problems generated in code (nothing is downloaded).

A record is ``{"prompt": "37+45=", "ground_truth": "82"}``. Problems are drawn from a seeded generator, so a seed
fixes the data order; ``split`` separates training problems from held-out evaluation problems by a hash of the
operands so the two never overlap.
"""

from __future__ import annotations

import random
import zlib

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


ARITH_TRAIN_SIZE = 20000  # problems in the builtin sets' train split
ARITH_EVAL_SIZE = 200  # and in their eval split
# The chat task's eval split (builtin:arith-chat, the SmolLM2 recipes' greedy validation): 500 draws, so that one
# evaluation's standard error is about 0.02 at the accuracies RL reaches (sqrt(0.85 * 0.15 / 500)); its first 200
# problems are the 200 of ARITH_EVAL_SIZE (the same seeded draws). Drawn with replacement from the ~1,000 held-out
# pairs, as every split is: an unbiased estimate of accuracy over them.
CHAT_ARITH_EVAL_SIZE = 500


def _in_split(a: int, op: str, b: int, split: str) -> bool:
    bucket = zlib.crc32(f"{a}{op}{b}".encode()) % 10
    return (bucket == 0) == (split == "eval")


def make_arith_problems(
    n: int, *, seed: int, digits: int = 2, ops: str = "+", split: str = "train"
) -> list[dict[str, str]]:
    """``n`` problems ``a<op>b=`` with operands of up to ``digits`` digits; ``split`` is "train" or "eval" (10%)."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if digits < 1:
        raise ValueError(f"digits must be >= 1, got {digits}")
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    bad = [op for op in ops if op not in _OPS]
    if not ops or bad:
        raise ValueError(f"ops must be a non-empty string of {sorted(_OPS)}, got {ops!r}")
    rng = random.Random(seed)
    high = 10**digits - 1
    records: list[dict[str, str]] = []
    while len(records) < n:
        a, b, op = rng.randint(0, high), rng.randint(0, high), rng.choice(ops)
        if op == "-" and b > a:
            a, b = b, a
        if not _in_split(a, op, b, split):
            continue
        records.append({"prompt": f"{a}{op}{b}=", "ground_truth": str(_OPS[op](a, b))})
    return records


CHAT_QUESTION = "What is {a} {op} {b}? Answer with just the number."


def make_chat_arith_problems(
    n: int, *, seed: int, digits: int = 2, ops: str = "+", split: str = "train"
) -> list[dict[str, object]]:
    """The same problems as :func:`make_arith_problems`, asked in chat format for instruct models.

    ``prompt`` is one user message (``"What is 23 + 48? Answer with just the number."``) that goes through the
    tokenizer's chat template (46 tokens with SmolLM2's, which adds its default system prompt). The split is the same
    hash, so held-out problems never overlap. (A short system message instead, "Answer with just the number." with
    "What is 23 + 48?", is 30 tokens, but SmolLM2-135M-Instruct's greedy accuracy fell from 0.12 to 0.015 with it.)
    """
    out: list[dict[str, object]] = []
    for r in make_arith_problems(n, seed=seed, digits=digits, ops=ops, split=split):
        expr = r["prompt"].rstrip("=")
        op = next(o for o in _OPS if o in expr[1:])
        a, b = expr[0] + expr[1:].split(op, 1)[0], expr[1:].split(op, 1)[1]
        question = CHAT_QUESTION.format(a=a, op=op, b=b)
        out.append({"prompt": [{"role": "user", "content": question}], "ground_truth": r["ground_truth"]})
    return out
