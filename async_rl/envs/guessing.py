"""The guessing environment: find a secret integer in [1, hi] from "higher" / "lower" replies.

No tools: each assistant turn's last integer is its guess, and the environment answers with a role ``"user"`` message.
Its texts use only lowercase letters, digits and basic punctuation, so the tiny char-level test model (alphabet
``0123456789+-*/=()., ?:!\\nabcdefghijklmnopqrstuvwxyz``) can read and write a whole episode.

Reward: a correct guess on turn ``t`` (1-based, counting every assistant turn, invalid ones included) ends the
episode with ``max(min_reward, 1.0 - decay * (t - 1))``, by default ``1.0, 0.9, ..., 0.1, 0.1, ...``, so fewer turns
(binary search takes at most 7 for hi=100) earn more. An episode the driver ends at its turn limit gets
:meth:`GuessingEnv.final_reward`, 0. ``format_reward`` (default 0) adds ``format_reward * (turns that were just a
number) / turns`` to either: a dense signal for a small model that answers with sentences. ``feedback_reward``
(default 0) adds ``feedback_reward * (guesses that respected every earlier reply) / turns``: a guess counts when it
is one of the values the replies so far leave possible (for the first guess, any of [1, hi]), so a repeated guess
or one that ignores "higher" / "lower" does not. Every step's ``info["solved"]`` is 1 for the winning guess, else 0:
the actor reports it as the episode's ``solved`` reward component (``val/guessing/solved_mean`` is the win rate
whatever the shaping).
"""

from __future__ import annotations

import random
import re
import zlib
from typing import Any

from async_rl.envs.base import Message, StepResult

_INTEGER = re.compile(r"-?\d+")
_BARE_NUMBER = re.compile(r"\s*-?\d+\s*\.?\s*")


def last_integer(text: str) -> int | None:
    """The last integer written in ``text``, or None (also for one too long to convert)."""
    matches = _INTEGER.findall(text)
    if not matches:
        return None
    try:
        return int(matches[-1])
    except ValueError:  # longer than Python's int-string limit
        return None


class GuessingEnv:
    """A secret integer (the record's ground truth) in [1, hi]; replies "higher" or "lower" until it is guessed.

    ``hi`` defaults to the record's ``extra["hi"]``, else the constructor's. A turn with no integer gets a reply
    saying so and counts in ``info["tool_errors"]`` (the only error this env has).
    """

    tools: list[dict[str, Any]] = []

    def __init__(
        self,
        *,
        hi: int = 100,
        decay: float = 0.1,
        min_reward: float = 0.1,
        format_reward: float = 0.0,
        feedback_reward: float = 0.0,
    ) -> None:
        if format_reward < 0.0:
            raise ValueError(f"format_reward must be >= 0, got {format_reward}")
        if feedback_reward < 0.0:
            raise ValueError(f"feedback_reward must be >= 0, got {feedback_reward}")
        if hi < 1:
            raise ValueError(f"hi must be >= 1, got {hi}")
        if not 0.0 <= min_reward <= 1.0 or decay < 0.0:
            raise ValueError(f"need decay >= 0 and 0 <= min_reward <= 1, got decay={decay}, min_reward={min_reward}")
        self.hi = hi
        self.decay = decay
        self.min_reward = min_reward
        self.format_reward = format_reward
        self.feedback_reward = feedback_reward
        self.secret = 0
        self.turns = 0
        self.bare = 0  # turns that were just a number, as asked
        self.consistent = 0  # guesses inside the interval the replies so far leave open
        self.low, self.high = 1, hi  # that interval

    def reset(self, prompt: list[Message] | str, ground_truth: str, extra: dict[str, Any]) -> None:
        hi = int(extra.get("hi", self.hi))
        secret = int(ground_truth)
        if not 1 <= secret <= hi:
            raise ValueError(f"secret {secret} is outside [1, {hi}]")
        self.hi, self.secret, self.turns, self.bare, self.consistent = hi, secret, 0, 0, 0
        self.low, self.high = 1, hi

    def reward_for_turn(self, turn: int) -> float:
        """The reward of a correct guess on (1-based) ``turn``."""
        return max(self.min_reward, 1.0 - self.decay * (turn - 1))

    def _shaping(self) -> float:
        """The dense parts: ``format_reward`` and ``feedback_reward`` times their shares of the turns so far."""
        turns = max(self.turns, 1)
        return (self.format_reward * self.bare + self.feedback_reward * self.consistent) / turns

    def step(self, assistant_text: str) -> StepResult:
        self.turns += 1
        self.bare += _BARE_NUMBER.fullmatch(assistant_text) is not None
        guess = last_integer(assistant_text)
        if guess is None:
            reply = f"no number found. reply with one number from 1 to {self.hi}."
            info = {"tool_errors": 1.0, "solved": 0.0}
            return StepResult([{"role": "user", "content": reply}], reward=0.0, done=False, info=info)
        self.consistent += self.low <= guess <= self.high
        if guess == self.secret:
            reward = self.reward_for_turn(self.turns) + self._shaping()
            return StepResult([], reward=reward, done=True, info={"solved": 1.0})
        if guess < self.secret:
            reply, self.low = "higher", max(self.low, guess + 1)
        else:
            reply, self.high = "lower", min(self.high, guess - 1)
        return StepResult([{"role": "user", "content": reply}], reward=0.0, done=False, info={"solved": 0.0})

    def final_reward(self, assistant_text: str) -> float:
        """The driver ended the episode before a correct guess (a correct guess ends it in :meth:`step`): only the
        shaping parts, 0 unless ``format_reward`` or ``feedback_reward``."""
        return self._shaping()


SYSTEM = "you are playing a number guessing game."
QUESTION = (
    "i am thinking of a number from 1 to {hi}. guess it. after each guess i will say higher or lower. "
    "reply with one number."
)


def demonstration(hi: int, secret: int | None = None) -> list[Message]:
    """One whole game played by binary search, as chat turns to put before the real question: the user's question,
    then bare-number guesses answered "higher" / "lower", ending on the assistant's winning guess (the caller's next
    user message says so and starts the real game). ``secret`` defaults to about two thirds of ``hi``."""
    secret = max(1, min(hi, round(hi * 2 / 3))) if secret is None else secret
    messages: list[Message] = [{"role": "user", "content": QUESTION.format(hi=hi)}]
    low, high = 1, hi
    while True:
        guess = (low + high) // 2
        messages.append({"role": "assistant", "content": str(guess)})
        if guess == secret:
            return messages
        reply = "higher" if guess < secret else "lower"
        messages.append({"role": "user", "content": reply})
        low, high = (guess + 1, high) if guess < secret else (low, guess - 1)


def make_guessing_problems(
    n: int, *, seed: int, split: str = "train", hi: int = 100, demonstration_game: bool = False
) -> list[dict[str, Any]]:
    """``n`` games for :class:`GuessingEnv`: secrets drawn (seeded) from [1, hi]; ``split`` "train" or "eval".

    Plain games (``[system, user]`` prompts, the same for every secret): the split is a hash of the secret (about a
    quarter of the secrets are "eval", 4 of 20 for hi=20), so held-out games never share a secret with training ones.

    With ``demonstration_game`` the prompt is ``[system, *demonstration(hi, d), user]``: one game played by binary
    search on a secret ``d`` drawn for each record, then "right. new game." and the question. Here both splits draw
    secrets from all of [1, hi] ("eval" from its own seeded stream): the secret is the only thing a game's policy
    cannot see, so held-out secrets would make a policy that learned which numbers come up in training look worse
    on the held-out ones, and a demonstration that varies keeps copying it from paying.

    Each record is ``{"prompt": [...], "ground_truth": "37", "extra": {"data_source": "guessing", "hi": hi}}``.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if hi < 1:
        raise ValueError(f"hi must be >= 1, got {hi}")
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    question = {"role": "user", "content": QUESTION.format(hi=hi)}
    extra = {"data_source": "guessing", "hi": hi}
    if demonstration_game:
        rng = random.Random(f"guessing-demo:{seed}:{split}")
        again = {"role": "user", "content": "right. new game. " + question["content"]}
        records = []
        for _ in range(n):
            demo = demonstration(hi, rng.randint(1, hi))
            prompt = [{"role": "system", "content": SYSTEM}, *demo, again]
            records.append({"prompt": prompt, "ground_truth": str(rng.randint(1, hi)), "extra": dict(extra)})
        return records
    secrets = [s for s in range(1, hi + 1) if (zlib.crc32(f"guess:{hi}:{s}".encode()) % 4 == 0) == (split == "eval")]
    if not secrets and n:
        raise ValueError(f"no secret in [1, {hi}] falls in split {split!r}; use a larger hi")
    rng = random.Random(seed)
    prompt = [{"role": "system", "content": SYSTEM}, question]
    return [
        {"prompt": [dict(m) for m in prompt], "ground_truth": str(rng.choice(secrets)), "extra": dict(extra)}
        for _ in range(n)
    ]
