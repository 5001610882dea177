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

vLLM's CPU build also starts that process with ``spawn``: the child imports torch and vLLM again (6-7 s of an 8 s start
on the Zen 4 host here, ``VLLM_WORKER_MULTIPROC_METHOD``). A process that declared :func:`keep_torch_single_threaded`
before computing anything forks it instead, and the child shares its imports. That is safe only there: GNU OpenMP
keeps the thread pool of a parent that ran torch on more than one thread, a fork copies none of its threads, and the
child's next parallel region waits for them for ever. In the fork, before anything runs, the child takes the thread
count and the cores vLLM would have given a spawned worker (``os.sched_setaffinity``: its threads stay on those cores,
but are not pinned one to a core as ``GOMP_CPU_AFFINITY`` pins a spawned child's).
``VLLM_WORKER_MULTIPROC_METHOD=spawn`` in the environment keeps the spawn. The actor's process declares it
(:func:`async_rl.runtime.actor_main.run_actor`): it only drives its engines.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

logger = logging.getLogger(__name__)

METHOD_ENV = "VLLM_WORKER_MULTIPROC_METHOD"

_fork_ok = False  # keep_torch_single_threaded() was called and the environment did not ask for spawn
_hooked = False  # _engine_core_forked is registered to run in every forked child
_child_cores: list[int] | None = None  # while a fork of the engine core is under way: the cores it runs on


def keep_torch_single_threaded() -> None:
    """Declare that this process keeps torch on one thread from now on, so that engine cores may be forked from it
    (the module's docstring). Call it before this process computes anything with torch."""
    global _fork_ok, _hooked
    import torch

    torch.set_num_threads(1)
    if not _hooked:
        os.register_at_fork(after_in_child=_engine_core_forked)
        _hooked = True
    _fork_ok = os.environ.get(METHOD_ENV) != "spawn"


def may_fork() -> bool:
    """Whether an engine core started now is forked from this process: it declared :func:`keep_torch_single_threaded`
    (without ``VLLM_WORKER_MULTIPROC_METHOD=spawn`` set) and still runs torch on one thread."""
    import torch

    return _fork_ok and torch.get_num_threads() == 1


def _engine_core_forked() -> None:
    """In every child this process forks: an engine core takes its cores and threads before anything runs."""
    if _child_cores is None:
        return
    import torch

    os.sched_setaffinity(0, _child_cores)
    torch.set_num_threads(len(_child_cores))


@contextmanager
def _forking(cores: list[int]) -> Iterator[None]:
    """vLLM forks the engine core started inside, onto ``cores`` (the parent keeps its method, cores and threads)."""
    global _child_cores
    before = os.environ.get(METHOD_ENV)
    os.environ[METHOD_ENV] = "fork"
    _child_cores = cores
    try:
        yield
    finally:
        _child_cores = None
        if before is None:
            os.environ.pop(METHOD_ENV, None)
        else:
            os.environ[METHOD_ENV] = before


def _worker_cores(manager: Any) -> list[int]:
    """The cores vLLM gives its CPU worker (``VLLM_CPU_OMP_THREADS_BIND``; ``nobind``: every core this process may
    use)."""
    if manager.skip_setup:
        return sorted(os.sched_getaffinity(0))
    return [int(c) for c in manager.cpu_lists[0]]


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
    manager = OMPProcessManager(config)
    cores = _worker_cores(manager)
    fork = may_fork() and bool(cores)  # no core to give a fork: vLLM's spawn decides
    logger.info(
        "vLLM on CPU: the model runs in the engine-core process (no separate worker process), %s, on %d core(s)",
        "forked from this one" if fork else "spawned",
        len(cores),
    )
    # A spawned engine-core process is started inside: its OpenMP runtime reads the binding when it loads.
    with manager.configure_omp_envs(rank=0, local_rank=0), _forking(cores) if fork else nullcontext():
        return AsyncLLM(
            vllm_config=config,
            executor_class=UniProcExecutor,
            log_requests=args.enable_log_requests,
            log_stats=not args.disable_log_stats,
            usage_context=UsageContext.ENGINE_CONTEXT,
        )
