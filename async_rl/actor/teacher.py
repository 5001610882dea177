"""On-policy distillation's teacher: a frozen model in a second vLLM engine of the actor, scoring what was sampled.

Why here and not on the learner: on real models the learner is the pipeline's bottleneck and the actor idles much of
each step, so the teacher's one prefill per completion goes where there is slack, and the learner's step is unchanged
(it reads the teacher's log-probs from the group, as it reads the behaviour log-probs). On a GPU actor both engines
share the device (``distillation.teacher_model.inference.gpu_memory_utilization`` next to the rollout's).

:meth:`TeacherEngine.score` prefill-scores ``prompt + completion`` with prompt log-probs (``prompt_logprobs=0``: the
log-prob of each given token, at temperature 1, from the raw logits) and returns, per completion, the log-prob of each
of its tokens under the teacher: the exact tokens sampled, aligned one to one. vLLM skips the prefix cache for requests
that want prompt log-probs, so the engine is built without one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from async_rl.actor.engine import EngineDead, engine_args, has_cuda, prompt_log_probs
from async_rl.config import Config
from async_rl.config.resolve import EngineStart, resolved

logger = logging.getLogger(__name__)


@dataclass
class TeacherStats:
    """Counters the actor reports as ``actor/teacher/...`` metrics."""

    requests: int = 0  # completions scored
    tokens: int = 0  # tokens prefilled (prompt and completion)
    seconds: float = 0.0  # wall-clock seconds groups waited for their scores


class TeacherEngine:
    """A vLLM ``AsyncLLM`` serving the frozen teacher. Build with :meth:`start`, stop with :meth:`shutdown`."""

    def __init__(self, cfg: Config, start: EngineStart) -> None:
        """``cfg``: a validated config (``actor_rollout_ref.rollout`` sizes the engine as the policy's,
        ``distillation.teacher_model.inference`` its memory); ``start``: the teacher's directory and the dtype the
        rollout resolved (:func:`async_rl.config.resolve.engine_start` for the teacher's path)."""
        self.rollout_cfg = cfg.actor_rollout_ref.rollout
        self.inference_cfg = cfg.distillation.teacher_model.inference
        self.startup = start
        self.stats = TeacherStats()
        self._engine: Any = None
        self._next_request = 0

    async def start(self) -> None:
        from async_rl.actor.vllm_launch import start_async_llm

        r = self.rollout_cfg
        args = engine_args(
            r,
            self.startup,
            # prompt + the whole completion + the one token vLLM generates after it
            max_model_len=resolved(r.max_model_len, "actor_rollout_ref.rollout.max_model_len") + 1,
            gpu_memory_utilization=self.inference_cfg.gpu_memory_utilization,
            enable_prefix_caching=False,
            logprobs_mode="raw_logprobs",
        )
        self._engine = start_async_llm(args, on_cpu=not has_cuda())
        logger.info("teacher engine up: %s", self.startup.model_path)

    @property
    def dead(self) -> bool:
        """True once the teacher's engine core has died: no group can be scored again."""
        return self._engine is not None and bool(getattr(self._engine, "errored", False))

    async def score(self, prompt_ids: Sequence[int], completions: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """The teacher's log-prob of every token of each completion (float32, aligned to its tokens), given the prompt
        and the completion's earlier tokens. The completions are scored concurrently (vLLM batches them)."""
        if self._engine is None:
            raise RuntimeError("TeacherEngine.start() was not called")
        started = time.perf_counter()
        prompt = [int(t) for t in prompt_ids]
        try:
            scores = await asyncio.gather(*(self._score_one(prompt, [int(t) for t in c]) for c in completions))
        except Exception as exc:
            if self.dead:
                raise EngineDead(f"the teacher's vLLM engine died while scoring: {exc!r}") from exc
            raise
        self.stats.seconds += time.perf_counter() - started
        return scores

    async def _score_one(self, prompt: list[int], completion: list[int]) -> np.ndarray:
        self._next_request += 1
        tokens = prompt + completion
        scored = await prompt_log_probs(self._engine, tokens, request_id=f"teacher{self._next_request}")
        self.stats.requests += 1
        self.stats.tokens += len(tokens)
        return np.asarray(scored[len(prompt) - 1 :], np.float32)  # scored[i] is token i + 1's

    async def shutdown(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None


__all__ = ["TeacherEngine", "TeacherStats"]
