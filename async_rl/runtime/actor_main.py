"""An actor process: one vLLM engine (one GPU, a tensor-parallel group, or the CPU) serving the rollout plane.

Builds, in order: the reward worker (fails fast on a bad ``module:function``), the learned reward model's client or
in-process scorer (``reward.reward_model``) and the reward shaping (``reward.reward_kwargs``), the rollout client, the
vLLM engine with the weight-sync worker extension, then runs :class:`async_rl.actor.loop.ActorLoop` until the
coordinator says shutdown. The model path must name the same initial weights the learner starts from (version 0).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any

from async_rl.actor import vllm_exit
from async_rl.config import Config
from async_rl.config.distillation import teacher_at
from async_rl.config.resolve import max_concurrent_eval
from async_rl.runtime import resources

logger = logging.getLogger(__name__)


def reward_worker(cfg: Config) -> Any:
    from async_rl.rewards import RewardWorker

    custom = cfg.custom_reward_function
    if custom.path:
        return RewardWorker(f"{custom.path}:{custom.name}", timeout_s=cfg.reward.timeout_s, verl_style=True)
    return RewardWorker(cfg.reward.function, timeout_s=cfg.reward.timeout_s)


def reward_model(cfg: Config, coordinator: str) -> Any:
    """The learned reward model's scorer (None when off): the reward server's client (it listens on
    ``reward.reward_model.server_host``, else the coordinator's host, at ``reward.reward_model.port``), or the model
    in this process (``placement: inline``)."""
    rm = cfg.reward.reward_model
    if not rm.enable:
        return None
    from async_rl.rewards.model_client import InlineRewardModel, RewardModelClient

    if rm.placement == "inline":
        from async_rl.config.validate import check_reward_model_dir
        from async_rl.rewards.model_score import scorer_from_config

        check_reward_model_dir(cfg)
        scorer = scorer_from_config(rm)
        return InlineRewardModel(scorer)
    from async_rl.transport.sockets import client_keys

    if rm.port == 0:
        raise ValueError(
            "reward.reward_model.port=0: actors cannot dial the reward server; set the port it listens on"
            " (launchers/local.py and launchers/actor_node.sh pick one and pass it to both)"
        )
    host = rm.server_host or coordinator.removeprefix("tcp://").rsplit(":", 1)[0]
    transport = cfg.async_training.transport
    return RewardModelClient(
        f"tcp://{host}:{rm.port}",
        transport,
        timeout_s=cfg.reward.timeout_s,
        retries=rm.retries,
        max_batch_sequences=rm.max_batch_sequences,
        keys=client_keys(transport),
    )


def reward_weights(cfg: Config) -> Any:
    from async_rl.rewards.model_client import RewardWeights

    rm = cfg.reward.reward_model
    return RewardWeights(model=rm.weight, rule=rm.rule_weight)


def reward_shaping(cfg: Config) -> Any:
    """DAPO's overlong reward shaping from ``reward.reward_kwargs`` (None when off); the loop applies it to scores."""
    from async_rl.rewards import OverlongShaping

    kwargs = cfg.reward.reward_kwargs
    buf = kwargs.overlong_buffer_cfg
    if not buf.enable:
        return None
    return OverlongShaping(
        max_resp_len=int(kwargs.max_resp_len or cfg.data.max_response_length),
        buffer_len=buf.len,
        penalty_factor=buf.penalty_factor,
        log=buf.log,
    )


def episode_runner(cfg: Config, engine: Any, model_path: str) -> Any:
    """Multi-turn episodes (``actor_rollout_ref.rollout.multi_turn``): the environment in its own child process,
    the chat renderer from the policy's tokenizer; None for single completions."""
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    if not mt.enable:
        return None
    from async_rl.actor.chat_render import ChatRenderer
    from async_rl.actor.episodes import EpisodeRunner
    from async_rl.envs.sandbox import EnvWorker

    assert mt.environment is not None  # validated
    renderer = ChatRenderer(resources.load_tokenizer(cfg, model_path))
    envs = EnvWorker(
        mt.environment,
        environment_kwargs(cfg),
        call_timeout_s=mt.call_timeout_s,
        episode_timeout_s=mt.episode_timeout_s,
    )
    return EpisodeRunner(engine, renderer, envs, cfg.actor_rollout_ref.rollout.multi_turn)


def environment_kwargs(cfg: Config) -> dict[str, Any]:
    """The environment's constructor arguments: for a tool environment (``async_rl.envs.base.ToolEnvironment``) the
    tool options of ``multi_turn`` first, then the user's ``environment_kwargs``."""
    from async_rl.envs.base import ToolEnvironment, load_environment_class

    mt = cfg.actor_rollout_ref.rollout.multi_turn
    assert mt.environment is not None  # validated
    options: dict[str, Any] = {}
    if issubclass(load_environment_class(mt.environment), ToolEnvironment):
        options = {
            "max_parallel_calls": mt.max_parallel_calls,
            "max_tool_response_length": mt.max_tool_response_length,
            "truncate_side": mt.tool_response_truncate_side,
            "tool_format": mt.format,
        }
    return {**options, **mt.environment_kwargs}


def build_teacher(cfg: Config, model_path: str, workdir: Path) -> Any:
    """On-policy distillation's teacher engine (not started yet), None unless distillation is on with the teacher
    on the actors; refuses a teacher whose vocabulary is not the student's (at ``model_path``)."""
    if not teacher_at(cfg.distillation, "actor"):
        return None
    from async_rl.actor.engine import actor_device
    from async_rl.actor.teacher import TeacherEngine
    from async_rl.config.resolve import engine_start, resolved

    spec = resolved(cfg.distillation.teacher_model.model_path, "distillation.teacher_model.model_path")
    teacher_path = resources.resolve_model_path(spec, workdir)
    student, teacher = resources.load_tokenizer(cfg, model_path), resources.load_tokenizer(cfg, teacher_path)
    resources.check_same_vocabulary(student, teacher, teacher_path=spec)
    return TeacherEngine(cfg, engine_start(cfg, model_path=teacher_path, device_type=actor_device()))


def build_engine(cfg: Config, model_path: str) -> Any:
    """The actor's vLLM engine (not started yet) for the policy at ``model_path``, with the weight-sync extension."""
    from async_rl.actor.engine import GenerationEngine, actor_device
    from async_rl.config.resolve import engine_start
    from async_rl.weight_sync import vllm_engine_kwargs

    start = engine_start(cfg, model_path=model_path, device_type=actor_device())
    return GenerationEngine(cfg, start, extra_engine_kwargs=vllm_engine_kwargs())


Report = Callable[[dict[str, Any]], None]
"""Takes the actor's exit summary as soon as its loop ends, before the engines shut down (which can take longer than
the launcher waits)."""


CPU_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


def lend_threads(cfg: Config, env: MutableMapping[str, str], cores: list[int]) -> tuple[int, int] | None:
    """``async_training.actor.lend_learner_cores``: (vLLM threads normally, threads while the learner waits), after
    binding vLLM's threads to every one of ``cores`` in ``env``; None (and ``env`` untouched) when it is off, on a
    GPU, with fewer than 2 cores, or when the binding is set already (warned: that binding holds)."""
    from async_rl.actor.engine import has_cuda

    if not cfg.async_training.actor.lend_learner_cores or has_cuda() or len(cores) < 2:
        return None
    if CPU_BIND_ENV in env:
        logger.warning(
            "async_training.actor.lend_learner_cores does nothing: %s=%s is set, and vLLM keeps that binding",
            CPU_BIND_ENV,
            env[CPU_BIND_ENV],
        )
        return None
    env[CPU_BIND_ENV] = ",".join(str(c) for c in cores)
    logger.info("actor: vLLM on %d thread(s), %d while the learner waits for the actors", len(cores) - 1, len(cores))
    return len(cores) - 1, len(cores)


async def _run(cfg: Config, coordinator: str, actor_id: str, workdir: Path, report: Report) -> dict[str, float]:
    from async_rl.actor.engine import has_cuda
    from async_rl.actor.loop import ActorLoop
    from async_rl.transport import RolloutClient
    from async_rl.weight_sync import AsyncEngineWeightSync

    model_path = resources.resolve_model_path(cfg.actor_rollout_ref.model.path, workdir)
    scorer = reward_worker(cfg)
    model_scorer = reward_model(cfg, coordinator)
    client = RolloutClient(coordinator, actor_id, cfg.async_training.transport)
    lend = lend_threads(cfg, os.environ, sorted(os.sched_getaffinity(0)))  # sets the binding before vLLM starts
    engine = build_engine(cfg, model_path)
    teacher = build_teacher(cfg, model_path, workdir)
    episodes = None
    try:
        await engine.start()
        if lend is not None:  # start wide, as the loop assumes: a learner waits for its first batch
            await engine.set_cpu_threads(lend[1])
        if not has_cuda():
            layout = await engine.cpu_layout()
            logger.info("actor: vLLM's model runs on %d thread(s), on cores %s", layout["threads"], layout["cores"])
        if teacher is not None:
            await teacher.start()
        episodes = episode_runner(cfg, engine, model_path)
        loop = ActorLoop(
            actor_id=actor_id,
            client=client,
            engine=engine,
            scorer=scorer,
            reward_shaping=reward_shaping(cfg),
            reward_model=model_scorer,
            reward_weights=reward_weights(cfg),
            give_up_s=cfg.async_training.transport.lease_timeout_s,
            episodes=episodes,
            teacher=teacher,
            weight_sync=AsyncEngineWeightSync(
                engine.vllm, verify_rotation=cfg.async_training.weight_sync.verify_rotation
            ),
            max_concurrent_groups=cfg.async_training.actor.max_concurrent_groups,
            max_concurrent_eval=max_concurrent_eval(cfg),
            update_mode=cfg.async_training.update_mode,
            lend_threads=lend,
        )
        await loop.run()
        result = loop.metrics()
        report(result)
        return result
    finally:
        client.close()
        scorer.close()
        if model_scorer is not None:
            model_scorer.close()
        if episodes is not None:
            episodes.close()
        if teacher is not None:
            await teacher.shutdown()
        await engine.shutdown()


def run_actor(cfg: Config, *, coordinator: str, actor_id: str, report: Report) -> dict[str, Any]:
    """Run one actor until the coordinator says shutdown; ``report`` gets its summary before the engines shut down.
    Needs ``if __name__ == "__main__":`` (vLLM spawns on GPUs, and on CPU with
    ``VLLM_WORKER_MULTIPROC_METHOD=spawn``)."""
    from async_rl.actor.engine import has_cuda
    from async_rl.actor.vllm_launch import keep_torch_single_threaded

    keep_torch_single_threaded()  # this process only drives its engines: theirs are forked from it (vllm_launch)
    if os.environ.get("VLLM_CPU_KVCACHE_SPACE") is None and not has_cuda():
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"  # GiB of KV cache on CPU; the default reserves far more
    vllm_exit.arm()  # the engines' processes skip the interpreter's seconds-long teardown when they stop
    workdir = resources.run_dir(cfg)
    workdir.mkdir(parents=True, exist_ok=True)
    return asyncio.run(_run(cfg, coordinator, actor_id, workdir, report))


async def _run_emulated(
    cfg: Config, coordinator: str, actor_id: str, tokens_per_s: float, response_len: int | None, report: Report
) -> dict[str, float]:
    from async_rl.actor.emulated import EmulatedEngine, EmulatedScorer, ReceiveOnlyWeightSync
    from async_rl.actor.loop import ActorLoop
    from async_rl.transport import RolloutClient

    client = RolloutClient(coordinator, actor_id, cfg.async_training.transport)
    engine = EmulatedEngine(tokens_per_s, response_len=response_len)
    weight_sync = ReceiveOnlyWeightSync()
    try:
        # Nothing to load here, so this actor is up long before the learner's coordinator: wait for it as a vLLM
        # actor's engine start-up would (the loop's own hello then re-joins at once).
        client.hello(loaded_version=engine.version, timeout_s=cfg.async_training.timeouts.actor_start_s)
        loop = ActorLoop(
            actor_id=actor_id,
            client=client,
            engine=engine,
            scorer=EmulatedScorer(),
            weight_sync=weight_sync,
            max_concurrent_groups=cfg.async_training.actor.max_concurrent_groups,
            max_concurrent_eval=max_concurrent_eval(cfg),
            update_mode=cfg.async_training.update_mode,
        )
        await loop.run()
        result = {**loop.metrics(), **engine.metrics()}
        report(result)
        return result
    finally:
        client.close()
        weight_sync.close()


def run_emulated_actor(
    cfg: Config,
    *,
    coordinator: str,
    actor_id: str,
    tokens_per_s: float,
    response_len: int | None,
    report: Report,
) -> dict[str, Any]:
    """Run one emulated actor (``async_rl.actor.emulated``): real loop, client and weight sync, no vLLM engine.

    Generation is a fixed ``tokens_per_s`` server (``response_len`` tokens per completion, default ``max_tokens``);
    rewards are pseudo-random. For pipeline benchmarks and tests; the reward function and model are not loaded.
    """
    if not tokens_per_s > 0:
        raise ValueError(f"tokens_per_s must be > 0, got {tokens_per_s}")
    if teacher_at(cfg.distillation, "actor"):
        raise ValueError(
            "distillation.teacher_model.placement=actor needs a teacher engine: an emulated actor has none"
        )
    return asyncio.run(_run_emulated(cfg, coordinator, actor_id, tokens_per_s, response_len, report))
