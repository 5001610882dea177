"""The actor's generation engine: one vLLM ``AsyncLLM`` (continuous batching) with policy-version tracking.

Why a wrapper: the rest of the actor needs four things vLLM does not track for it.
1. Which policy version produced each completion. A completion records the version loaded when its request was
   submitted (``min_version``) and the version loaded when it finished (``max_version``); with in-flight updates the two
   differ and the staleness bound uses the oldest.
2. Behaviour log-probs of every sampled token from the distribution actually sampled from. The engine is built with
   ``logprobs_mode="processed_logprobs"`` by default: log-probs after temperature scaling and top-k/top-p truncation,
   which is the sampling distribution, so the learner's importance weight exp(proximal - behaviour) is a true ratio.
   ``"raw_logprobs"`` (log-softmax of the unscaled logits) is available for experiments; with temperature != 1 or
   truncation it makes those ratios biased.
3. No reuse of prefix-cache entries computed under old weights: each request carries ``cache_salt = "v<version>"``, so
   blocks cached under another version never match.
4. Weight updates without restarting the engine, in two modes (see :meth:`GenerationEngine.update_weights`).

The engine runs inside the actor's asyncio loop; all methods are coroutines except the constructor.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from async_rl.config import Config, default_config
from async_rl.transport.protocol import GroupSampling

logger = logging.getLogger(__name__)

UpdateMode = Literal["inflight", "drain"]
LogprobsMode = Literal["processed", "raw"]


class EngineDead(RuntimeError):
    """The vLLM engine process died (or errored for good): the actor cannot generate again and must exit."""


@dataclass
class EngineOutput:
    """One completion as the engine returns it, before scoring: token ids, the behaviour log-prob of each, its text
    (what the reward function scores) and the version span it was generated in. The actor loop turns it into the
    wire's ``transport.protocol.Completion`` once its reward is known."""

    token_ids: np.ndarray  # [T] int32
    logprobs: np.ndarray  # [T] float32, log-prob of each sampled token
    finish_reason: str
    min_version: int
    max_version: int
    text: str = ""


@dataclass
class EngineStats:
    """Counters the actor reports as ``actor/...`` metrics."""

    requests: int = 0
    completions: int = 0
    generated_tokens: int = 0
    updates: int = 0


@dataclass(frozen=True)
class EngineSettings:
    """What the engine is built from: ``actor_rollout_ref.rollout.*``, ``async_training.actor.logprobs_mode`` and
    ``trainer.seed`` (see :meth:`from_config`; no defaults here, they live in the config)."""

    model_path: str
    tensor_parallel_size: int
    dtype: str
    max_model_len: int
    gpu_memory_utilization: float
    max_num_seqs: int
    enforce_eager: bool
    enable_prefix_caching: bool
    enable_chunked_prefill: bool
    max_num_batched_tokens: int | None  # None: vLLM's own default
    logprobs_mode: LogprobsMode
    seed: int
    # vLLM engine arguments that install the weight-sync worker extension (see async_rl.weight_sync.vllm_engine_kwargs)
    extra_engine_kwargs: dict[str, Any]

    @classmethod
    def from_config(cls, cfg: Config, *, model_path: str, extra_engine_kwargs: dict[str, Any]) -> EngineSettings:
        """From a validated config (``rollout.max_model_len`` filled in); ``model_path`` is the resolved directory."""
        r = cfg.actor_rollout_ref.rollout
        if r.max_model_len is None:
            raise ValueError("actor_rollout_ref.rollout.max_model_len is null: validate the config first")
        return cls(
            model_path=model_path,
            tensor_parallel_size=r.tensor_model_parallel_size,
            dtype=r.dtype,
            max_model_len=r.max_model_len,
            gpu_memory_utilization=r.gpu_memory_utilization,
            max_num_seqs=r.max_num_seqs,
            enforce_eager=r.enforce_eager,
            enable_prefix_caching=r.enable_prefix_caching,
            enable_chunked_prefill=r.enable_chunked_prefill,
            max_num_batched_tokens=r.max_num_batched_tokens,
            logprobs_mode=cfg.async_training.actor.logprobs_mode,
            seed=cfg.trainer.seed,
            extra_engine_kwargs=extra_engine_kwargs,
        )

    @classmethod
    def defaults(cls, model_path: str, **overrides: Any) -> EngineSettings:
        """The config's defaults (no weight-sync extension), with ``overrides`` replaced; for tests and tools."""
        base = cls.from_config(default_config(), model_path=model_path, extra_engine_kwargs={})
        return replace(base, **overrides)


class GenerationEngine:
    """A vLLM ``AsyncLLM`` that knows its policy version. Build with :meth:`start`, stop with :meth:`shutdown`."""

    def __init__(self, settings: EngineSettings, *, version: int = 0) -> None:
        if settings.logprobs_mode not in ("processed", "raw"):
            raise ValueError(f"logprobs_mode must be 'processed' or 'raw', got {settings.logprobs_mode!r}")
        self.settings = settings
        self.version = version
        self.stats = EngineStats()
        self._engine: Any = None
        self._tokenizer: Any = None
        self._inflight = 0
        self._next_request = 0
        self._halted = False  # a failed update aborted everything and left generation paused

    async def start(self) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        s = self.settings
        chunked, budget = scheduler_budget(s, on_cpu=not has_cuda())
        args = AsyncEngineArgs(
            model=s.model_path,
            enable_chunked_prefill=chunked,
            max_num_batched_tokens=budget,
            tensor_parallel_size=s.tensor_parallel_size,
            dtype=s.dtype,  # type: ignore[arg-type]
            max_model_len=s.max_model_len,
            gpu_memory_utilization=s.gpu_memory_utilization,
            max_num_seqs=s.max_num_seqs,
            enforce_eager=s.enforce_eager,
            enable_prefix_caching=s.enable_prefix_caching,
            logprobs_mode="processed_logprobs" if s.logprobs_mode == "processed" else "raw_logprobs",
            seed=s.seed,
            **s.extra_engine_kwargs,
        )
        self._engine = AsyncLLM.from_engine_args(args)
        self._tokenizer = self._engine.tokenizer if hasattr(self._engine, "tokenizer") else None
        logger.info("vLLM engine up: %s (tp=%d)", s.model_path, s.tensor_parallel_size)

    @property
    def vllm(self) -> Any:
        """The underlying ``AsyncLLM`` (for ``collective_rpc`` to the worker extension)."""
        if self._engine is None:
            raise RuntimeError("GenerationEngine.start() was not called")
        return self._engine

    @property
    def dead(self) -> bool:
        """True once vLLM's engine core has died: nothing can be generated any more."""
        return self._engine is not None and bool(getattr(self._engine, "errored", False))

    @property
    def inflight(self) -> int:
        return self._inflight

    def _vllm_sampling(self, sampling: GroupSampling) -> Any:
        """vLLM's own ``SamplingParams`` for ``sampling``: one log-prob per sampled token, streamed as deltas."""
        import vllm
        from vllm.sampling_params import RequestOutputKind

        return vllm.SamplingParams(
            n=sampling.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else -1,
            max_tokens=sampling.max_tokens,
            seed=sampling.seed,
            logprobs=0,
            detokenize=True,
            output_kind=RequestOutputKind.DELTA,
        )

    async def generate(self, prompt_token_ids: Sequence[int], sampling: GroupSampling) -> list[EngineOutput]:
        """Generate ``sampling.n`` completions of one prompt; returns when all of them have finished."""
        from vllm.inputs import TokensPrompt

        engine = self.vllm
        self._next_request += 1
        request_id = f"g{self._next_request}-v{self.version}"
        start_version = self.version
        finished_at: dict[int, int] = {}
        # Streamed as deltas (no quadratic re-copying of long outputs); a delta may carry only some completions.
        tokens: dict[int, list[int]] = {i: [] for i in range(sampling.n)}
        logprobs: dict[int, list[float]] = {i: [] for i in range(sampling.n)}
        texts: dict[int, list[str]] = {i: [] for i in range(sampling.n)}
        reasons: dict[int, str] = {}
        self._inflight += 1
        try:
            prompt = TokensPrompt(prompt_token_ids=list(prompt_token_ids), cache_salt=f"v{start_version}")
            async for output in engine.generate(prompt, self._vllm_sampling(sampling), request_id=request_id):
                for comp in output.outputs:
                    tokens[comp.index].extend(comp.token_ids)
                    logprobs[comp.index].extend(_sampled_logprobs(comp.token_ids, comp.logprobs))
                    texts[comp.index].append(comp.text)
                    if comp.finish_reason is not None and comp.index not in finished_at:
                        finished_at[comp.index] = self.version
                        reasons[comp.index] = str(comp.finish_reason)
        except Exception as exc:
            if self.dead:
                raise EngineDead(f"the vLLM engine died while generating {request_id}: {exc!r}") from exc
            raise
        finally:
            self._inflight -= 1
        if sorted(reasons) != list(range(sampling.n)):
            raise RuntimeError(
                f"vLLM finished completions {sorted(reasons)} of request {request_id}, expected n={sampling.n}"
            )
        completions = []
        for i in range(sampling.n):
            token_ids = np.asarray(tokens[i], dtype=np.int32)
            end_version = finished_at[i]
            completions.append(
                EngineOutput(
                    token_ids=token_ids,
                    logprobs=np.asarray(logprobs[i], dtype=np.float32),
                    finish_reason=reasons[i],
                    min_version=start_version,
                    max_version=end_version,
                    text="".join(texts[i]),
                )
            )
            self.stats.generated_tokens += len(token_ids)
        self.stats.requests += 1
        self.stats.completions += len(completions)
        return completions

    async def update_weights(self, new_version: int, load: Callable[[], Awaitable[None]], mode: UpdateMode) -> None:
        """Swap in the weights of ``new_version`` without restarting the engine.

        Order: pause -> ``load()`` (receives and loads weights through the worker extension) -> set version -> resume.
        - ``"inflight"``: pause keeping requests and their KV cache (``mode="keep"``); running completions continue
          under the new weights after resume, and record the version span.
        - ``"drain"``: stop scheduling new requests and let running ones finish first (``mode="wait"``), then swap.
        New requests are salted with the new version, so no prefix-cache entry computed under old weights is reused.

        If ``load`` raises, the weights are presumed unusable (a transfer that broke half-way leaves the model half
        loaded): every running request is aborted (finish reason ``abort``), generation stays paused, and the error
        propagates. The engine generates again only after a later ``update_weights`` succeeds (it pauses, which is
        harmless when paused already, loads and resumes). This is the one pause/resume path of a weight update.
        """
        if mode not in ("inflight", "drain"):
            raise ValueError(f"update mode must be 'inflight' or 'drain', got {mode!r}")
        if new_version < self.version:
            raise ValueError(f"new_version {new_version} is older than the loaded version {self.version}")
        engine = self.vllm
        drain = mode == "drain" and not self._halted  # halted: everything was aborted, nothing is left to drain
        await engine.pause_generation(mode="wait" if drain else "keep", clear_cache=False)
        try:
            await load()
        except BaseException:
            self._halted = True
            try:
                await engine.pause_generation(mode="abort", clear_cache=True)
            except Exception as exc:  # noqa: BLE001 - report the update's failure, not this one
                logger.error("aborting generation after a failed weight update failed too: %r", exc)
            raise
        self.version = new_version
        self._halted = False
        await engine.resume_generation()
        self.stats.updates += 1

    async def shutdown(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None


def has_cuda() -> bool:
    """Whether this process sees a CUDA device (vLLM's CUDA build) or runs vLLM's CPU build."""
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def scheduler_budget(settings: EngineSettings, *, on_cpu: bool) -> tuple[bool, int | None]:
    """``(enable_chunked_prefill, max_num_batched_tokens)`` for vLLM.

    vLLM's CPU build cannot rewind a seeded request's random generator (``CPU Generator does not use offset``, raised
    in the model runner when it discards the token sampled after a partial prefill chunk), which kills the engine the
    first time a seeded prompt's prefill is chunked. Every request here is seeded (reproducible samples), so on CPU
    chunked prefill is turned off: each prompt is then prefilled whole within one step, which needs a token budget of
    at least ``max_model_len``. On GPUs the settings pass through unchanged.
    """
    chunked = settings.enable_chunked_prefill
    budget = settings.max_num_batched_tokens
    if on_cpu and chunked:
        logger.warning(
            "rollout.enable_chunked_prefill=true is turned off on CPU: vLLM's CPU build crashes on seeded requests "
            "whose prefill is chunked ('CPU Generator does not use offset')"
        )
        chunked = False
    if not chunked and budget is not None and budget < settings.max_model_len:
        logger.warning(
            "rollout.max_num_batched_tokens=%d < max_model_len=%d without chunked prefill: raised to %d so that any "
            "prompt fits one step",
            budget,
            settings.max_model_len,
            settings.max_model_len,
        )
        budget = settings.max_model_len
    if budget is not None and budget < settings.max_num_seqs:  # vLLM refuses a budget below one token per sequence
        logger.warning("rollout.max_num_batched_tokens=%d raised to max_num_seqs=%d", budget, settings.max_num_seqs)
        budget = settings.max_num_seqs
    return chunked, budget


def _sampled_logprobs(token_ids: Sequence[int], logprobs: Any) -> list[float]:
    """The log-prob of each sampled token from vLLM's per-position ``{token_id: Logprob}`` dicts."""
    if logprobs is None or len(logprobs) != len(token_ids):
        raise RuntimeError("vLLM returned no per-token log-probs; requests must set logprobs=0")
    return [pos[tok].logprob for tok, pos in zip(token_ids, logprobs, strict=True)]
