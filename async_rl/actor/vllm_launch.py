"""How the actor starts a vLLM ``AsyncLLM``: on CPU, the engine-core process runs the model itself.

vLLM's CPU build always runs the model in a worker process of its own, started by the engine-core process, itself
started by the process that builds the engine (vLLM turns its in-process ``uni`` executor back into ``mp`` on CPU,
because the worker's OpenMP threads are bound through environment variables read when the process starts). That
costs twice:

* start-up: each of the three processes imports torch and vLLM (6-25 s each on the 2-core hosts here, by the day),
  one after the other, so the worker's import is added to every actor start;
* while generating: the engine core hands every step to the worker over a shared-memory queue and busy-polls for the
  answer, about a fifth of a core beside the worker on the recipe.

:func:`start_async_llm` keeps vLLM's layout on GPUs and wherever more than one worker runs. On CPU with one worker it
builds the config as vLLM does, sets the ``uni`` executor, and starts the engine-core process inside the OpenMP
environment vLLM would have given that worker (:class:`vllm.utils.ompmultiprocessing.OMPProcessManager`, from
``VLLM_CPU_OMP_THREADS_BIND``), so the model's threads are bound as before and run in the engine-core process. Setting
``engine_kwargs.vllm.distributed_executor_backend`` (``mp``, say) keeps vLLM's own choice.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)


def in_process_cpu_worker(args: Any, *, on_cpu: bool) -> bool:
    """Whether an engine of ``args`` (vLLM's ``AsyncEngineArgs``) runs its model in the engine-core process: on CPU,
    with one worker (no tensor, pipeline or data parallelism) and no executor named in the arguments."""
    return (
        on_cpu
        and args.distributed_executor_backend is None
        and args.tensor_parallel_size == 1
        and args.pipeline_parallel_size == 1
        and args.data_parallel_size == 1
    )


def start_async_llm(args: Any, *, on_cpu: bool) -> Any:
    """vLLM's ``AsyncLLM`` for ``args``, started (see the module's docstring for the CPU layout)."""
    from vllm.v1.engine.async_llm import AsyncLLM

    if not in_process_cpu_worker(args, on_cpu=on_cpu):
        return AsyncLLM.from_engine_args(args)
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.ompmultiprocessing import OMPProcessManager
    from vllm.v1.executor.uniproc_executor import UniProcExecutor

    config = args.create_engine_config(UsageContext.ENGINE_CONTEXT)
    config.parallel_config.distributed_executor_backend = "uni"
    logger.info("vLLM on CPU: the model runs in the engine-core process (no separate worker process)")
    # The engine-core process is started inside: its OpenMP runtime reads the binding when it loads.
    with OMPProcessManager(config).configure_omp_envs(rank=0, local_rank=0):
        return AsyncLLM(
            vllm_config=config,
            executor_class=UniProcExecutor,
            log_requests=args.enable_log_requests,
            log_stats=not args.disable_log_stats,
            usage_context=UsageContext.ENGINE_CONTEXT,
        )
