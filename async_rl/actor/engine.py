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
5. LoRA runs (``lora_rank`` > 0): each policy version is its own vLLM adapter ``v<version>`` (id version + 1), written
   by the weight-sync worker to a directory of this engine's and added with ``add_lora``. A request runs under the
   adapter current when it was submitted, start to end (its version span is that one version), so an update needs no
   pause; an adapter is removed once it is not current and no running request uses it. Before the first update the
   base model serves (a fresh adapter is the base model exactly).

The engine runs inside the actor's asyncio loop; all methods are coroutines except the constructor.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from async_rl.config import Config
from async_rl.config.actor_rollout_ref import RolloutConfig
from async_rl.config.names import VLLM_LORA_RANKS
from async_rl.config.resolve import EngineStart, resolved
from async_rl.transport.protocol import GroupSampling
from async_rl.weight_sync.client import EXTENSION_CLS

logger = logging.getLogger(__name__)

UpdateMode = Literal["inflight", "drain"]


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


class GenerationEngine:
    """A vLLM ``AsyncLLM`` that knows its policy version. Build with :meth:`start`, stop with :meth:`shutdown`."""

    def __init__(
        self, cfg: Config, start: EngineStart, *, extra_engine_kwargs: dict[str, Any], version: int = 0
    ) -> None:
        """``cfg``: a validated config, whose sections the engine keeps and reads (``actor_rollout_ref.rollout``,
        ``actor_rollout_ref.model.lora_rank``, ``async_training.actor.logprobs_mode``, ``trainer.seed``); ``start``:
        what the config cannot say (:func:`async_rl.config.resolve.engine_start`); ``extra_engine_kwargs``: vLLM engine
        arguments that install the weight-sync worker extension (``async_rl.weight_sync.vllm_engine_kwargs``)."""
        self.rollout_cfg = cfg.actor_rollout_ref.rollout
        self.model_cfg = cfg.actor_rollout_ref.model
        self.actor_cfg = cfg.async_training.actor
        self.seed = cfg.trainer.seed
        self.startup = start
        self.extra_engine_kwargs = extra_engine_kwargs
        self.version = version
        self.stats = EngineStats()
        self._engine: Any = None
        self._tokenizer: Any = None
        self._inflight = 0
        self._next_request = 0
        self._halted = False  # a failed update aborted everything and left generation paused
        self._adapter: Any = None  # LoRA: the current version's LoRARequest (None: the base model)
        self._adapters: dict[int, Any] = {}  # LoRA: version -> LoRARequest of every adapter vLLM holds
        self._adapter_users: dict[int, int] = {}  # LoRA: version -> running requests under it
        self._adapter_root: Path | None = None

    @property
    def lora(self) -> bool:
        """Whether versions are served as LoRA adapters (``lora_rank`` > 0)."""
        return self.model_cfg.lora_rank > 0

    @property
    def halted(self) -> bool:
        """True after a failed full-weight update until one succeeds: generation is paused, the weights unusable."""
        return self._halted

    def adapter_dir(self, version: int) -> str:
        """LoRA: the directory the adapter of ``version`` is written to (by the weight-sync worker)."""
        if self._adapter_root is None:
            raise RuntimeError("adapter_dir: this engine serves no LoRA adapters (lora_rank is 0) or was not started")
        return str(self._adapter_root / f"v{version}")

    def engine_args(self) -> Any:
        """vLLM's ``AsyncEngineArgs`` for this engine (what :meth:`start` starts; ``--dry-run`` checks them)."""
        r, start = self.rollout_cfg, self.startup
        return engine_args(
            r,
            start,
            max_model_len=resolved(r.max_model_len, "actor_rollout_ref.rollout.max_model_len"),
            gpu_memory_utilization=r.gpu_memory_utilization,
            enable_prefix_caching=r.enable_prefix_caching,
            logprobs_mode="processed_logprobs" if self.actor_cfg.logprobs_mode == "processed" else "raw_logprobs",
            seed=self.seed,
            **lora_engine_kwargs(self.model_cfg.lora_rank, start.max_loras),
            **self.extra_engine_kwargs,
        )

    async def start(self) -> None:
        from async_rl.actor.vllm_launch import start_async_llm

        args = self.engine_args()
        if self.lora:
            shm = Path("/dev/shm")
            self._adapter_root = Path(tempfile.mkdtemp(prefix="async_rl_lora_", dir=shm if shm.is_dir() else None))
        self._engine = start_async_llm(args, on_cpu=not has_cuda())
        self._tokenizer = self._engine.tokenizer if hasattr(self._engine, "tokenizer") else None
        logger.info("vLLM engine up: %s (tp=%d)", self.startup.model_path, self.rollout_cfg.tensor_model_parallel_size)

    @property
    def vllm(self) -> Any:
        """The underlying ``AsyncLLM`` (for ``collective_rpc`` to the worker extension)."""
        if self._engine is None:
            raise RuntimeError("GenerationEngine.start() was not called")
        return self._engine

    async def set_cpu_threads(self, n: int) -> None:
        """Run the model on ``n`` threads from its next step on (a CPU engine bound to at least ``n`` cores)."""
        await self.vllm.collective_rpc("cpu_threads", args=(n,))

    async def cpu_layout(self) -> dict[str, Any]:
        """A CPU engine's thread count and the cores its model runs on (``{"threads": n, "cores": [...]}``)."""
        (layout,) = await self.vllm.collective_rpc("cpu_layout")
        return dict(layout)

    @property
    def dead(self) -> bool:
        """True once vLLM's engine core has died: nothing can be generated any more."""
        return self._engine is not None and bool(getattr(self._engine, "errored", False))

    @property
    def inflight(self) -> int:
        return self._inflight

    def _vllm_sampling(self, sampling: GroupSampling) -> Any:
        """vLLM's own ``SamplingParams`` for ``sampling``: one log-prob per sampled token, delivered once, when the
        request has finished (``FINAL_ONLY``). A completion's version span needs only the version it started under and
        the one current when it finished, and the final output arrives at that moment, so streaming every step's
        delta (one output per request per decode step through vLLM's output handler and this coroutine) bought
        nothing: it cost the actor ~19% of raw vLLM's throughput at 1,024 sequences in flight (tools/bench_actor.py
        --prompts 256)."""
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
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    async def generate(self, prompt_token_ids: Sequence[int], sampling: GroupSampling) -> list[EngineOutput]:
        """Generate ``sampling.n`` completions of one prompt; returns when all of them have finished."""
        from vllm.inputs import TokensPrompt

        engine = self.vllm
        self._next_request += 1
        request_id = f"g{self._next_request}-v{self.version}"
        start_version = self.version
        adapter = self._adapter  # LoRA: the request runs under this adapter from start to end
        if adapter is not None:
            self._adapter_users[start_version] = self._adapter_users.get(start_version, 0) + 1
        finished_at: dict[int, int] = {}
        # One final output (FINAL_ONLY); the loop still folds outputs that carry only some completions.
        tokens: dict[int, list[int]] = {i: [] for i in range(sampling.n)}
        logprobs: dict[int, list[float]] = {i: [] for i in range(sampling.n)}
        texts: dict[int, list[str]] = {i: [] for i in range(sampling.n)}
        reasons: dict[int, str] = {}
        self._inflight += 1
        try:
            prompt = TokensPrompt(prompt_token_ids=list(prompt_token_ids), cache_salt=f"v{start_version}")
            stream = engine.generate(prompt, self._vllm_sampling(sampling), request_id=request_id, lora_request=adapter)
            async for output in stream:
                served = getattr(output, "lora_request", None)
                if _adapter_name(served) != _adapter_name(adapter):
                    raise RuntimeError(
                        f"vLLM served request {request_id} with adapter {_adapter_name(served)}, submitted under "
                        f"{_adapter_name(adapter)}"
                    )
                for comp in output.outputs:
                    tokens[comp.index].extend(comp.token_ids)
                    logprobs[comp.index].extend(_sampled_logprobs(comp.token_ids, comp.logprobs))
                    texts[comp.index].append(comp.text)
                    if comp.finish_reason is not None and comp.index not in finished_at:
                        finished_at[comp.index] = start_version if self.lora else self.version
                        reasons[comp.index] = str(comp.finish_reason)
        except Exception as exc:
            if self.dead:
                raise EngineDead(f"the vLLM engine died while generating {request_id}: {exc!r}") from exc
            raise
        finally:
            self._inflight -= 1
            if adapter is not None:
                self._adapter_users[start_version] -= 1
        if adapter is not None:
            await self._prune_adapters()
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

    async def probe(self, token_ids: Sequence[int]) -> list[float]:
        """log p(token_ids[i + 1] | token_ids[: i + 1]) with what this engine serves now (the current adapter in a
        LoRA run), at temperature 1: the served side of a served-weights check."""
        self._next_request += 1
        return await prompt_log_probs(
            self.vllm,
            token_ids,
            request_id=f"probe{self._next_request}-v{self.version}",
            cache_salt=f"v{self.version}",
            lora_request=self._adapter,
        )

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
        if self.lora:
            await self._update_adapter(new_version, load)
            return
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

    async def _update_adapter(self, new_version: int, load: Callable[[], Awaitable[None]]) -> None:
        """LoRA: ``load()`` writes the adapter of ``new_version`` to :meth:`adapter_dir`; add it to vLLM and make it
        current. Nothing pauses: running requests keep their adapters. If ``load`` or the add fails, the current
        adapter stays (it is intact) and the error propagates."""
        from vllm.lora.request import LoRARequest

        await load()
        request = LoRARequest(
            lora_name=f"v{new_version}", lora_int_id=new_version + 1, lora_path=self.adapter_dir(new_version)
        )
        if not await self.vllm.add_lora(request):
            raise RuntimeError(f"vLLM did not add the adapter of version {new_version}")
        self._adapters[new_version] = request
        self._adapter = request
        self.version = new_version
        self.stats.updates += 1
        await self._prune_adapters()

    async def _prune_adapters(self) -> None:
        """Remove every adapter that is not current and that no running request uses (its directory too)."""
        for version in [v for v in self._adapters if v != self.version and not self._adapter_users.get(v)]:
            request = self._adapters.pop(version)
            self._adapter_users.pop(version, None)
            try:
                await self.vllm.remove_lora(request.lora_int_id)
            except Exception as exc:  # noqa: BLE001 - vLLM evicts on its own when full; the directory still goes
                logger.warning("removing adapter %s from vLLM failed: %r", request.lora_name, exc)
            shutil.rmtree(request.lora_path, ignore_errors=True)

    @property
    def adapters_loaded(self) -> list[int]:
        """LoRA: the versions whose adapters vLLM holds now, oldest first."""
        return sorted(self._adapters)

    async def shutdown(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None
        if self._adapter_root is not None:
            shutil.rmtree(self._adapter_root, ignore_errors=True)
            self._adapter_root = None


async def prompt_log_probs(
    llm: Any, token_ids: Sequence[int], *, request_id: str, cache_salt: str | None = None, lora_request: Any = None
) -> list[float]:
    """log p(token_ids[i + 1] | token_ids[: i + 1]) for every i, at temperature 1, from ``llm`` (an ``AsyncLLM``):
    one prefill with prompt log-probs (the given token's at each position) and one generated token, discarded."""
    import vllm
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    params = vllm.SamplingParams(
        max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY
    )
    prompt = TokensPrompt(prompt_token_ids=list(token_ids))
    if cache_salt is not None:
        prompt["cache_salt"] = cache_salt
    final = None
    async for output in llm.generate(prompt, params, request_id=request_id, lora_request=lora_request):
        final = output
    if final is None or final.prompt_logprobs is None or len(final.prompt_logprobs) != len(token_ids):
        raise RuntimeError(f"vLLM returned no prompt log-probs for request {request_id}")
    return [float(pos[tok].logprob) for tok, pos in zip(token_ids[1:], final.prompt_logprobs[1:], strict=True)]


def engine_args(
    rollout: RolloutConfig, start: EngineStart, *, max_model_len: int, gpu_memory_utilization: float, **kwargs: Any
) -> Any:
    """vLLM's ``AsyncEngineArgs`` for an engine of this actor: the model and dtype of ``start``, the rollout's
    parallelism, batch and eager settings, its scheduler budget (:func:`scheduler_budget`, extended to
    ``max_model_len`` when chunked prefill is off), and ``kwargs`` (prefix caching, log-prob mode, seed, LoRA, ...).
    A CPU engine gets :data:`CPU_BLOCK_SIZE`, the scheduler that computes a prompt's partial last block once per
    group (:data:`PROMPT_TAIL_SCHEDULER`) and, when it loads the weight-sync worker extension, vLLM's C++ RMSNorm
    kernels (``actor/cpu_kernels.py``); ``engine_kwargs.vllm.block_size`` / ``.scheduler_cls`` / ``.ir_op_priority``
    override them."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    on_cpu = not has_cuda()
    chunked, budget = scheduler_budget(rollout, on_cpu=on_cpu)
    if not chunked and budget is not None:  # null: vLLM's default, which fits max_model_len
        budget = max(budget, max_model_len)
    ours: dict[str, Any] = {
        "model": start.model_path,
        "enable_chunked_prefill": chunked,
        "max_num_batched_tokens": budget,
        "tensor_parallel_size": rollout.tensor_model_parallel_size,
        "dtype": start.dtype,
        "max_model_len": max_model_len,
        "gpu_memory_utilization": gpu_memory_utilization,
        "max_num_seqs": rollout.max_num_seqs,
        "enforce_eager": rollout.enforce_eager,
        **kwargs,
    }
    defaults: set[str] = set()  # set here for a CPU engine; engine_kwargs.vllm may override them
    if on_cpu:
        ours["block_size"] = CPU_BLOCK_SIZE
        ours["scheduler_cls"] = PROMPT_TAIL_SCHEDULER
        defaults.update(("block_size", "scheduler_cls"))
        if ours.get("worker_extension_cls") == EXTENSION_CLS:  # it registers the kernels in vLLM's worker
            from async_rl.actor import cpu_kernels

            cpu_kernels.register()
            ours["ir_op_priority"] = cpu_kernels.IR_OP_PRIORITY
            defaults.add("ir_op_priority")
    settable = frozenset(ours) - defaults
    extra = user_engine_kwargs(rollout, fields=AsyncEngineArgs.__dataclass_fields__, ours=settable)
    return AsyncEngineArgs(**{**ours, **extra})


CPU_BLOCK_SIZE = 32
"""The KV-cache block size of a CPU engine, unless ``engine_kwargs.vllm.block_size`` says otherwise. vLLM's CPU
build picks 128, and its prefix cache shares only full blocks: a group's n samples of a 46-token prompt (the SmolLM2
recipes) then each prefilled the whole prompt. At 32 (the smallest the CPU attention kernel takes), 16 prompts x 8
samples x 16 tokens took 5.4-5.8 s against 8.2-8.6 s (raw vLLM, bf16, one core; docs/architecture.md, "The actor")."""

PROMPT_TAIL_SCHEDULER = "async_rl.actor.prompt_tails.PromptTailScheduler"
"""vLLM's ``scheduler_cls`` of a CPU engine, unless ``engine_kwargs.vllm.scheduler_cls`` says otherwise
(``vllm.v1.core.sched.scheduler.Scheduler``: vLLM's own). With full blocks shared, a group's n samples of a 46-token
prompt still each prefilled its last 14 tokens, which fill part of a block; this scheduler has one sample compute them
and the others copy its block (``actor/prompt_tails.py``). Same tokens and log-probs; 16 prompts x 8 samples x 16
tokens took 5.8 s against 7.5 s a round (``tools/bench_cpu_engine.py``: 1.32x, 95% CI 1.24-1.39; bf16, Zen 4;
docs/architecture.md, "The actor")."""

_ENGINE_KWARGS_KEY = "actor_rollout_ref.rollout.engine_kwargs"


def user_engine_kwargs(rollout: RolloutConfig, *, fields: Mapping[str, Any], ours: frozenset[str]) -> dict[str, Any]:
    """``engine_kwargs.vllm`` (verl's per-engine extra arguments), checked against vLLM's ``fields`` (its engine
    arguments) and against ``ours`` (arguments set from other keys, which must be set there). Other engines'
    entries do nothing here and are warned about."""
    kwargs = dict(rollout.engine_kwargs)
    extra = kwargs.pop("vllm", None) or {}
    for engine in kwargs:
        logger.warning("%s.%s has no effect: the actors run vLLM (engine_kwargs.vllm)", _ENGINE_KWARGS_KEY, engine)
    if not isinstance(extra, Mapping):
        raise ValueError(f"{_ENGINE_KWARGS_KEY}.vllm must be a mapping of vLLM engine arguments, got {extra!r}")
    for key in extra:
        if key not in fields:
            raise ValueError(f"{_ENGINE_KWARGS_KEY}.vllm.{key}: not an argument of vLLM's engine (AsyncEngineArgs)")
        if key in ours:
            raise ValueError(
                f"{_ENGINE_KWARGS_KEY}.vllm.{key}: set by the actor from its own config keys"
                " (e.g. actor_rollout_ref.rollout.*); set it there"
            )
    return dict(extra)


def lora_engine_kwargs(lora_rank: int, max_loras: int) -> dict[str, Any]:
    """vLLM engine arguments of a LoRA run: adapters up to ``lora_rank`` (vLLM's next allowed max rank), ``max_loras``
    of them in one batch and in its CPU cache. Empty when ``lora_rank`` is 0."""
    if lora_rank <= 0:
        return {}
    fits = [r for r in VLLM_LORA_RANKS if r >= lora_rank]
    if not fits:
        raise ValueError(f"lora_rank {lora_rank} exceeds vLLM's largest max_lora_rank {VLLM_LORA_RANKS[-1]}")
    return {"enable_lora": True, "max_lora_rank": fits[0], "max_loras": max_loras, "max_cpu_loras": max_loras}


def _adapter_name(request: Any) -> str:
    return "none (the base model)" if request is None else repr(request.lora_name)


def has_cuda() -> bool:
    """Whether this process sees a CUDA device (vLLM's CUDA build) or runs vLLM's CPU build."""
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def actor_device() -> str:
    """The device type this actor's vLLM runs on: "cuda" or "cpu"."""
    return "cuda" if has_cuda() else "cpu"


def scheduler_budget(rollout: RolloutConfig, *, on_cpu: bool) -> tuple[bool, int | None]:
    """``(enable_chunked_prefill, max_num_batched_tokens)`` for vLLM.

    vLLM's CPU build cannot rewind a seeded request's random generator (``CPU Generator does not use offset``, raised
    in the model runner when it discards the token sampled after a partial prefill chunk), which kills the engine the
    first time a seeded prompt's prefill is chunked. Every request here is seeded (reproducible samples), so on CPU
    chunked prefill is turned off: each prompt is then prefilled whole within one step, which needs a token budget of
    at least ``max_model_len``. On GPUs the settings pass through unchanged.
    """
    chunked = rollout.enable_chunked_prefill
    budget = rollout.max_num_batched_tokens
    max_model_len = resolved(rollout.max_model_len, "actor_rollout_ref.rollout.max_model_len")
    if on_cpu and chunked:
        logger.warning(
            "rollout.enable_chunked_prefill=true is turned off on CPU: vLLM's CPU build crashes on seeded requests "
            "whose prefill is chunked ('CPU Generator does not use offset')"
        )
        chunked = False
    if not chunked and budget is not None and budget < max_model_len:
        logger.warning(
            "rollout.max_num_batched_tokens=%d < max_model_len=%d without chunked prefill: raised to %d so that any "
            "prompt fits one step",
            budget,
            max_model_len,
            max_model_len,
        )
        budget = max_model_len
    if budget is not None and budget < rollout.max_num_seqs:  # vLLM refuses a budget below one token per sequence
        logger.warning("rollout.max_num_batched_tokens=%d raised to max_num_seqs=%d", budget, rollout.max_num_seqs)
        budget = rollout.max_num_seqs
    return chunked, budget


def _sampled_logprobs(token_ids: Sequence[int], logprobs: Any) -> list[float]:
    """The log-prob of each sampled token from vLLM's per-position ``{token_id: Logprob}`` dicts."""
    if logprobs is None or len(logprobs) != len(token_ids):
        raise RuntimeError("vLLM returned no per-token log-probs; requests must set logprobs=0")
    return [pos[tok].logprob for tok, pos in zip(token_ids, logprobs, strict=True)]
