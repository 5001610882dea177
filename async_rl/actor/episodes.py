"""Multi-turn episodes: one grant's ``n`` episodes, each a conversation between the model and an environment.

One episode, in order::

    env.reset(prompt)                                   (in the environment's child process)
    loop:
        generate one model turn from prompt + episode tokens   (vLLM; the prefix cache keeps earlier turns' KV)
        append its tokens as sampled: loss mask 1, behaviour log-probs, the turn's version span
        env.step(turn text) -> observations, reward, done
        done, or a turn limit, or no room for another turn -> stop
        append the observations rendered through the chat template (ChatRenderer): loss mask 0, log-prob 0
    template check (the whole conversation rendered at once must give the same tokens), env.close

The episode's response (everything after the prompt) is at most ``sampling.max_tokens`` tokens (the configured
response length): each turn generates at most what is left, and observations that leave no room for a model turn
end the episode as truncated (finish reason ``length``). It always ends on a token the model sampled, where the
learner puts the reward: the environment's reward when it said done, else its ``final_reward`` of the last turn.
An environment whose steps report ``info["solved"]`` (the guessing game does) gets the last step's value as the
episode's ``solved`` reward component: a success rate beside a shaped reward (``val/<source>/solved_mean``).

Finish reasons: ``stop`` (the environment ended it), ``length`` (out of room), ``turn_limit`` (``max_assistant_turns``
or ``max_user_turns``). A failed environment (error, timeout, crash) is an observation or a done from the environment
worker, never an exception here. The group goes out whole, under the grant's one lease, so exactly-once accounting is
per episode group, as it is for single completions.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
import numpy as np

from async_rl import metric_catalog as mc
from async_rl.actor.chat_render import ChatRenderer
from async_rl.actor.engine import EngineOutput
from async_rl.transport.protocol import Completion, EpisodeStats, GroupSampling, PromptGrant, TurnSpan, make_completion

if TYPE_CHECKING:
    from async_rl.config.actor_rollout_ref import MultiTurnConfig

logger = logging.getLogger(__name__)

__all__ = ["EnvClient", "EpisodeRunner"]


class StepLike(Protocol):
    observations: list[dict[str, str]]
    reward: float
    done: bool
    info: dict[str, float]


class EnvClient(Protocol):
    """The environment worker as the runner uses it (``async_rl.envs.sandbox.EnvWorker``); blocking calls."""

    def reset(self, episode_id: str, prompt: Any, ground_truth: str, extra: dict[str, Any]) -> None: ...

    def step(self, episode_id: str, assistant_text: str) -> StepLike: ...

    def final_reward(self, episode_id: str, assistant_text: str) -> float: ...

    def close(self, episode_id: str) -> None: ...

    def shutdown(self) -> None: ...

    def metrics(self) -> dict[str, float]: ...


class Generator(Protocol):
    async def generate(self, prompt_token_ids: list[int], sampling: GroupSampling) -> list[EngineOutput]: ...


@dataclass
class _Turn:
    sampled: np.ndarray
    observations: list[dict[str, str]]


class EpisodeRunner:
    """Runs a grant's episodes against ``engine`` and ``envs``; returns wire completions (None: a turn was aborted)."""

    def __init__(
        self, engine: Generator, renderer: ChatRenderer, envs: EnvClient, settings: MultiTurnConfig, *, threads: int = 4
    ) -> None:
        self.engine = engine
        self.renderer = renderer
        self.envs = envs
        self.settings = settings
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="env")
        self._ids = itertools.count()
        self.template_mismatches = 0
        self.retokenized = 0
        self.episodes = 0

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.envs.shutdown()

    async def _call(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def run_group(self, grant: PromptGrant, prompt_ids: Sequence[int]) -> list[Completion] | None:
        """The grant's ``sampling.n`` episodes, concurrently; None when vLLM aborted any turn (weights broke)."""
        n = grant.sampling.n
        results = await asyncio.gather(*(self._episode(grant, list(prompt_ids), i) for i in range(n)))
        if any(r is None for r in results):
            return None
        return [r for r in results if r is not None]

    def _turn_sampling(self, sampling: GroupSampling, index: int, turn: int, left: int) -> GroupSampling:
        seed = None if sampling.seed is None else sampling.seed + index + turn * sampling.n
        return msgspec.structs.replace(sampling, n=1, max_tokens=left, seed=seed)

    async def _episode(self, grant: PromptGrant, prompt_ids: list[int], index: int) -> Completion | None:
        extras = dict(grant.extras)
        messages = extras.get("messages")
        prompt = messages if messages is not None else str(extras.get("prompt", ""))
        episode_id = f"{grant.prompt_id}.{grant.lease_id}.{index}.{next(self._ids)}"
        await self._call(
            self.envs.reset, episode_id, prompt, str(extras.get("ground_truth", "")), extras.get("extra") or {}
        )
        try:
            return await self._play(grant, prompt_ids, index, episode_id, messages)
        finally:
            await self._call(self.envs.close, episode_id)

    async def _play(
        self, grant: PromptGrant, prompt_ids: list[int], index: int, episode_id: str, messages: Any
    ) -> Completion | None:
        s = self.settings
        budget = grant.sampling.max_tokens
        tokens: list[int] = []
        mask: list[int] = []
        logprobs: list[float] = []
        spans: list[TurnSpan] = []
        turns: list[_Turn] = []
        tool_calls = tool_errors = 0
        reward, finish, last_text = 0.0, "length", ""
        solved: float | None = None  # the last step's info["solved"], for environments that report one
        for turn in itertools.count():
            sampling = self._turn_sampling(grant.sampling, index, turn, budget - len(tokens))
            out = (await self.engine.generate(prompt_ids + tokens, sampling))[0]
            if out.finish_reason == "abort":
                return None
            spans.append(TurnSpan(len(tokens), len(out.token_ids), out.min_version, out.max_version, out.finish_reason))
            tokens.extend(int(t) for t in out.token_ids)
            mask.extend([1] * len(out.token_ids))
            logprobs.extend(float(x) for x in out.logprobs)
            turns.append(_Turn(out.token_ids, []))
            last_text = out.text
            step = await self._call(self.envs.step, episode_id, out.text)
            spans[-1].reward = float(step.reward)  # the wire's per-turn reward (the learner trains on the final one)
            tool_calls += int(step.info.get("tool_calls", 0))
            tool_errors += int(step.info.get("tool_errors", 0))
            solved = step.info.get("solved", solved)
            if step.done:
                reward, finish = float(step.reward), "stop"
                break
            if out.finish_reason == "length":  # the turn used up the budget
                finish = "length"
                break
            # Limits end the episode on this turn's last sampled token, before any observation is appended.
            if (s.max_assistant_turns is not None and turn + 1 >= s.max_assistant_turns) or (
                s.max_user_turns is not None and turn + 1 > s.max_user_turns
            ):
                finish = "turn_limit"
                break
            obs = self.renderer.observation_ids(out.token_ids.tolist(), step.observations)
            if len(tokens) + len(obs) >= budget:  # no room for another model token
                finish = "length"
                break
            turns[-1].observations = list(step.observations)
            tokens.extend(obs)
            mask.extend([0] * len(obs))
            logprobs.extend([0.0] * len(obs))
        if finish != "stop":  # ended by a limit, not by the environment: its final_reward scores the last turn
            reward = float(await self._call(self.envs.final_reward, episode_id, last_text))
        self.episodes += 1
        verdict = self._check(messages, turns, prompt_ids + tokens)
        self.template_mismatches += verdict == "mismatch"
        self.retokenized += verdict == "retokenized"
        return make_completion(
            token_ids=np.asarray(tokens, dtype=np.int32),
            logprobs=np.asarray(logprobs, dtype=np.float32),
            version_min=min(t.version_min for t in spans),
            version_max=max(t.version_max for t in spans),
            finish_reason=finish,
            reward=reward,
            reward_components=None if solved is None else {"solved": float(solved)},
            loss_mask=np.asarray(mask, dtype=np.uint8),
            turns=spans,
            episode=EpisodeStats(
                tool_calls=tool_calls,
                tool_errors=tool_errors,
                template_mismatch=verdict == "mismatch",
                retokenization_drift=verdict == "retokenized",
            ),
        )

    def _check(self, messages: Any, turns: list[_Turn], token_ids: list[int]) -> str:
        """The template check's verdict (ChatRenderer.check); "unchecked" when disabled or the prompt has no
        messages."""
        mode = self.settings.tokenization_sanity_check_mode
        if mode == "disable" or not isinstance(messages, list):
            return "unchecked"
        verdict = self.renderer.check(
            _messages(messages),
            [(t.sampled.tolist(), t.observations) for t in turns],
            token_ids,
            ignore_strippable=mode == "ignore_strippable",
        )
        if verdict == "mismatch" and self.template_mismatches == 0:
            logger.warning("multi-turn template check: the whole conversation renders to other text (counted)")
        return verdict

    def metrics(self) -> dict[str, float]:
        out = {
            mc.ACTOR_EPISODES: float(self.episodes),
            mc.ACTOR_TEMPLATE_MISMATCHES: float(self.template_mismatches),
            mc.ACTOR_RETOKENIZATION_DRIFT: float(self.retokenized),
        }
        out.update({mc.actor_env_counter_key(k): float(v) for k, v in self.envs.metrics().items()})
        return out


def _messages(raw: Sequence[Any]) -> list[Mapping[str, str]]:
    return [{"role": str(m["role"]), "content": str(m["content"])} for m in raw]
