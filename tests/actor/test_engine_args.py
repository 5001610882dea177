"""The vLLM engine arguments an actor builds: its own keys, the CPU block size, and verl's engine_kwargs.vllm."""

from __future__ import annotations

import logging

import pytest

from async_rl.actor import engine
from async_rl.actor.engine import CPU_BLOCK_SIZE, PROMPT_TAIL_SCHEDULER, engine_args
from async_rl.actor.vllm_launch import in_process_cpu_worker
from async_rl.config import default_config
from async_rl.config.resolve import EngineStart
from async_rl.weight_sync.client import vllm_engine_kwargs

START = EngineStart(model_path="/models/m", dtype="bfloat16", max_loras=1)


@pytest.fixture(autouse=True)
def _on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The arguments of a CPU engine, on any host (a CUDA engine keeps vLLM's block size)."""
    monkeypatch.setattr(engine, "has_cuda", lambda: False)


def _args(**engine_kwargs: object):  # type: ignore[no-untyped-def]
    rollout = default_config().actor_rollout_ref.rollout
    rollout.engine_kwargs = dict(engine_kwargs)
    return engine_args(rollout, START, max_model_len=128, gpu_memory_utilization=0.5, enable_prefix_caching=True)


def test_a_cpu_engine_gets_small_blocks_so_a_groups_samples_share_their_prompt() -> None:
    args = _args()
    assert (args.model, args.dtype, args.max_model_len) == ("/models/m", "bfloat16", 128)
    assert args.enable_prefix_caching
    assert args.block_size == CPU_BLOCK_SIZE == 32


def test_engine_kwargs_vllm_reach_the_engine_and_may_set_the_block_size() -> None:
    args = _args(vllm={"block_size": 64, "max_logprobs": 3})
    assert (args.block_size, args.max_logprobs) == (64, 3)


def test_a_cpu_engine_computes_a_prompts_partial_last_block_once_per_group_unless_told_otherwise() -> None:
    assert _args().scheduler_cls == PROMPT_TAIL_SCHEDULER == "async_rl.actor.prompt_tails.PromptTailScheduler"
    vllms = "vllm.v1.core.sched.scheduler.Scheduler"
    assert _args(vllm={"scheduler_cls": vllms}).scheduler_cls == vllms


def test_engine_kwargs_name_the_bad_key() -> None:
    with pytest.raises(ValueError, match=r"engine_kwargs\.vllm\.no_such_arg: not an argument of vLLM's engine"):
        _args(vllm={"no_such_arg": 1})
    with pytest.raises(ValueError, match=r"engine_kwargs\.vllm\.max_num_seqs: set by the actor"):
        _args(vllm={"max_num_seqs": 4})
    with pytest.raises(ValueError, match=r"engine_kwargs\.vllm must be a mapping"):
        _args(vllm=[1])


def test_another_engines_entry_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="async_rl.actor.engine"):
        args = _args(sglang={"mem_fraction_static": 0.5})
    assert "engine_kwargs.sglang has no effect" in caplog.text
    assert args.block_size == CPU_BLOCK_SIZE


def _ext_args(**engine_kwargs: object):  # type: ignore[no-untyped-def]
    """A CPU actor's engine: it loads the weight-sync worker extension (which registers the RMSNorm kernels)."""
    rollout = default_config().actor_rollout_ref.rollout
    rollout.engine_kwargs = dict(engine_kwargs)
    return engine_args(rollout, START, max_model_len=128, gpu_memory_utilization=0.5, **vllm_engine_kwargs())


def test_a_cpu_engine_with_the_worker_extension_puts_vllms_rmsnorm_kernels_first() -> None:
    args = _ext_args()
    assert args.ir_op_priority.rms_norm == ["async_rl_cpu", "native"]
    assert args.ir_op_priority.fused_add_rms_norm == ["async_rl_cpu", "native"]
    # without the extension nothing registers them in vLLM's worker: vLLM's own priority is kept
    assert _args().ir_op_priority.rms_norm == []


def test_engine_kwargs_vllm_may_set_the_ir_op_priority() -> None:
    args = _ext_args(vllm={"ir_op_priority": {"rms_norm": ["native"], "fused_add_rms_norm": ["native"]}})
    assert (args.ir_op_priority.rms_norm, args.ir_op_priority.fused_add_rms_norm) == (["native"], ["native"])


def test_a_cpu_engine_with_one_worker_runs_its_model_in_the_engine_core_process() -> None:
    assert in_process_cpu_worker(_args(), on_cpu=True)
    assert not in_process_cpu_worker(_args(), on_cpu=False)  # GPUs: vLLM's own layout


@pytest.mark.parametrize(
    "vllm_kwargs",
    [
        {"distributed_executor_backend": "mp"},  # the user's choice is kept
        {"pipeline_parallel_size": 2},
        {"data_parallel_size": 2},
    ],
)
def test_an_engine_with_an_executor_named_or_several_workers_keeps_vllms_layout(vllm_kwargs: dict) -> None:
    args = _args(vllm=vllm_kwargs)
    assert not in_process_cpu_worker(args, on_cpu=True)


def test_a_tensor_parallel_engine_keeps_vllms_layout() -> None:
    rollout = default_config().actor_rollout_ref.rollout
    rollout.tensor_model_parallel_size = 2
    args = engine_args(rollout, START, max_model_len=128, gpu_memory_utilization=0.5, enable_prefix_caching=True)
    assert args.tensor_parallel_size == 2
    assert not in_process_cpu_worker(args, on_cpu=True)


def test_a_cuda_engine_keeps_vllms_block_size_and_scheduler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine, "has_cuda", lambda: True)
    args = _args()
    assert args.block_size is None  # vLLM's platform default
    assert args.scheduler_cls is None
