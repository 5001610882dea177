"""Actor-side drivers against fake engines: call order, payloads, and how worker failures are re-raised."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from async_rl.transport.protocol import WeightSyncPlan
from async_rl.weight_sync import WeightSyncError, WeightSyncTimeout
from async_rl.weight_sync.client import AsyncEngineWeightSync, EngineWeightSync, init_info, vllm_engine_kwargs
from async_rl.weight_sync.membership import JoinInfo
from async_rl.weight_sync.protocol import UpdateRequest

PLAN = WeightSyncPlan(
    host="10.0.0.1", port=29600, backend="gloo", timeout_s=120.0, join_timeout_s=10.0, version=3, epoch=1,
    candidates=("actor-0",),
)  # fmt: skip

REPORT = {"version": 3, "tensors": 27}


class _FakeLLM:
    """Records calls like vllm.LLM; a failing update_weights raises the generic text exception vLLM raises."""

    def __init__(self, error: dict[str, Any] | None = None) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.error = error

    def init_weight_transfer_engine(self, request: dict[str, Any]) -> None:
        self.calls.append(("init", request))

    def start_weight_update(self) -> None:
        self.calls.append(("start", None))

    def update_weights(self, request: dict[str, Any]) -> None:
        self.calls.append(("update", request))
        if self.error:
            raise Exception(f"Call to collective_rpc method failed: Worker failed with error '{self.error['message']}'")

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.calls.append(("finish", weight_version))

    def collective_rpc(self, method: str) -> list[dict[str, Any]]:
        assert method == "weight_sync_state"
        return [{"last_report": None if self.error else REPORT, "last_error": self.error}]


def test_engine_kwargs_select_the_registered_engine() -> None:
    kwargs = vllm_engine_kwargs()
    assert kwargs["worker_extension_cls"] == "async_rl.actor.vllm_ext.WeightSyncWorkerExtension"
    assert kwargs["weight_transfer_config"] == {"backend": "async_rl_broadcast"}


def test_sync_update_call_order_and_payloads() -> None:
    llm = _FakeLLM()
    sync = EngineWeightSync(llm, verify_rotation=1)
    sync.join(JoinInfo(plan=PLAN, member="actor-0"))
    assert sync.update(3) == REPORT
    assert [name for name, _ in llm.calls] == ["init", "start", "update", "finish"]
    payload = llm.calls[0][1]["init_info"]  # builtins, exactly the struct: the worker decodes it back
    assert payload == {
        "plan": {
            "host": "10.0.0.1",
            "port": 29600,
            "backend": "gloo",
            "timeout_s": 120.0,
            "join_timeout_s": 10.0,
            "version": 3,
            "epoch": 1,
            "candidates": ("actor-0",),
            "adapter": None,  # full weights (a LoRA run names its adapter here)
            "served_check": None,
        },
        "member": "actor-0",
        "world_size": None,
        "rank_offset": None,
    }
    assert msgspec.convert(payload, JoinInfo) == JoinInfo(plan=PLAN, member="actor-0")
    request = {
        "version": 3,
        "verify_load": True,
        "verify_rotation": 1,
        "require_complete": True,
        "adapter_dir": None,
        "adapter_config": None,
    }
    assert llm.calls[2][1] == {"update_info": request}
    assert msgspec.convert(request, UpdateRequest).version == 3  # the worker decodes the same struct
    assert llm.calls[3][1] == "3"
    EngineWeightSync(llm, verify_rotation=4).update(4)  # async_training.weight_sync.verify_rotation reaches the worker
    assert llm.calls[5][1]["update_info"]["verify_rotation"] == 4
    with pytest.raises(ValueError, match="verify_rotation must be >= 1"):
        EngineWeightSync(llm, verify_rotation=0).update(5)


def test_update_request_is_checked_when_built_and_when_decoded() -> None:
    good = {"version": -1, "verify_load": True, "verify_rotation": 2, "require_complete": False}
    lora = {**good, "adapter_dir": "/tmp/a", "adapter_config": {"r": 8}}
    assert msgspec.convert(lora, UpdateRequest).adapter_config == {"r": 8}
    with pytest.raises(msgspec.ValidationError, match="both adapter_dir and adapter_config"):
        msgspec.convert({**good, "adapter_dir": "/tmp/a", "adapter_config": None}, UpdateRequest)
    with pytest.raises(msgspec.ValidationError, match="version must be >= 0"):
        msgspec.convert({**lora, "version": -2}, UpdateRequest)
    with pytest.raises(msgspec.ValidationError, match="adapter_dir"):  # no defaults: a missing field is an error
        msgspec.convert(good, UpdateRequest)
    with pytest.raises(msgspec.ValidationError, match="unknown field"):
        msgspec.convert({**lora, "verify": True}, UpdateRequest)


@pytest.mark.parametrize(
    ("error_type", "expected"), [("WeightSyncError", WeightSyncError), ("WeightSyncTimeout", WeightSyncTimeout)]
)
def test_worker_failure_is_re_raised_with_its_type_and_tensor(error_type: str, expected: type) -> None:
    error = {"type": error_type, "message": "digest mismatch for tensor 'w'", "tensor": "w"}
    llm = _FakeLLM(error)
    with pytest.raises(expected, match="digest mismatch") as info:
        EngineWeightSync(llm, verify_rotation=1).update(4)
    assert info.value.tensor == "w"
    assert "finish" not in [name for name, _ in llm.calls]  # vLLM already ended the failed session


def test_invalid_join_arguments() -> None:
    with pytest.raises(ValueError, match="rank_offset"):
        JoinInfo(plan=PLAN, world_size=2, rank_offset=2)
    with pytest.raises(ValueError, match="world_size"):
        JoinInfo(plan=PLAN, world_size=1, rank_offset=1)
    with pytest.raises(ValueError, match="member .* or both world_size and rank_offset"):
        JoinInfo(plan=PLAN)
    with pytest.raises(ValueError, match="either member"):
        JoinInfo(plan=PLAN, member="actor-0", world_size=2)
    with pytest.raises(ValueError, match="epoch"):
        JoinInfo(plan=msgspec.structs.replace(PLAN, epoch=-1), member="actor-0")  # no epoch yet: nothing to join
    fixed = JoinInfo(plan=PLAN, world_size=3, rank_offset=2)
    assert msgspec.convert(init_info(fixed), JoinInfo) == fixed
    # The worker's decode checks the plan's constraints too (and refuses what the old dict shape carried).
    bad = init_info(fixed)
    bad["plan"]["backend"] = "auto"
    with pytest.raises(msgspec.ValidationError, match="backend"):
        msgspec.convert(bad, JoinInfo)
    with pytest.raises(msgspec.ValidationError, match="host"):
        msgspec.convert({**init_info(fixed), "host": "10.0.0.1"}, JoinInfo)


class _FakeAsyncLLM:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[str] = []
        self.fail = fail
        self.update_info: dict[str, Any] | None = None
        self.rpc_args: tuple[Any, ...] = ()

    async def pause_generation(self, *, mode: str, clear_cache: bool) -> None:
        self.calls.append(f"pause:{mode}")

    async def resume_generation(self) -> None:
        self.calls.append("resume")

    async def start_weight_update(self) -> None:
        self.calls.append("start")

    async def update_weights(self, request: Any) -> None:
        self.calls.append("update")
        self.update_info = request.update_info
        if self.fail:
            raise Exception("Worker failed with error 'broadcast of frame 0 timed out'")

    async def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.calls.append("finish")

    async def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        if method != "weight_sync_state":  # the hold-back RPCs of the worker extension
            self.calls.append(method)
            self.rpc_args = args
            if self.fail:
                raise Exception("Worker failed with error 'broadcast of frame 0 timed out'")
            return [None]
        error = {"type": "WeightSyncTimeout", "message": "timed out", "tensor": None} if self.fail else None
        return [{"last_report": None if self.fail else REPORT, "last_error": error}]


def test_async_update_leaves_pausing_to_the_engine() -> None:
    vllm = pytest.importorskip("vllm")  # the request dataclasses come from vLLM
    assert vllm is not None
    engine = _FakeAsyncLLM()
    assert asyncio.run(AsyncEngineWeightSync(engine, verify_rotation=1).update(5)) == REPORT
    assert engine.calls == ["start", "update", "finish"]  # GenerationEngine.update_weights pauses and resumes
    assert engine.update_info is not None and engine.update_info["verify_rotation"] == 1
    asyncio.run(AsyncEngineWeightSync(engine, verify_rotation=4).update(6))  # the actor passes its config's value
    assert engine.update_info["verify_rotation"] == 4
    failing = _FakeAsyncLLM(fail=True)
    with pytest.raises(WeightSyncTimeout):
        asyncio.run(AsyncEngineWeightSync(failing, verify_rotation=1).update(6))
    assert failing.calls == ["start", "update"]


def test_async_hold_back_receives_without_a_weight_update_session_then_loads() -> None:
    engine = _FakeAsyncLLM()
    sync = AsyncEngineWeightSync(engine, verify_rotation=3)
    assert asyncio.run(sync.stage(7)) == REPORT
    (payload,) = engine.rpc_args  # a full UpdateRequest, as builtins, with the actor's verification settings
    assert payload["version"] == 7 and payload["verify_rotation"] == 3 and payload["adapter_dir"] is None
    assert asyncio.run(sync.load_staged(7)) == REPORT and engine.rpc_args == (7,)
    assert engine.calls == ["stage_weights", "load_staged_weights"]  # no pause here: the actor's engine does it
    failing = _FakeAsyncLLM(fail=True)
    with pytest.raises(WeightSyncTimeout, match="timed out"):  # the worker's structured error, with its type
        asyncio.run(AsyncEngineWeightSync(failing, verify_rotation=1).stage(7))
