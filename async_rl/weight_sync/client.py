"""Actor-process helpers that drive a vLLM engine through a weight update (no vLLM import at module level).

The actor owns the ``vllm.LLM`` / ``AsyncLLM``; when the learner announces a new weights version, the actor calls
:meth:`EngineWeightSync.update` (or the async twin) while the learner's rank 0 calls ``WeightSender.send``. Both
sides must be in the same update at the same time: the broadcasts rendezvous.

Construct the engine with :func:`vllm_engine_kwargs` so vLLM loads the worker extension (which registers the
weight-transfer engine inside the worker processes) and selects it::

    llm = vllm.LLM(model=path, **vllm_engine_kwargs(), ...)
    sync = EngineWeightSync(llm)
    sync.join(JoinInfo(plan=plan, member="actor-0"))   # plan: the WeightSyncPlan the learner announced
    report = sync.update(version=7)                    # raises WeightSyncError / WeightSyncTimeout

A failed update leaves the engine's weights invalid (``state()["weights_valid"]`` is False): do not generate from
it until an update succeeds. After a timeout the group is broken: every member rejoins with ``epoch + 1``.
Worker exceptions reach this process only as text inside a generic ``Exception``; the structured error is fetched
with the ``weight_sync_state`` RPC and re-raised as the matching exception type.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import msgspec

from async_rl.weight_sync.errors import WeightMismatchError, WeightSyncError, WeightSyncTimeout
from async_rl.weight_sync.membership import JoinInfo, announce_at
from async_rl.weight_sync.protocol import UpdateRequest

logger = logging.getLogger(__name__)

__all__ = ["AsyncEngineWeightSync", "EngineWeightSync", "init_info", "update_info", "vllm_engine_kwargs"]

ENGINE_NAME = "async_rl_broadcast"  # same string as vllm_ext.ENGINE_NAME (kept here to avoid importing vLLM)
EXTENSION_CLS = "async_rl.actor.vllm_ext.WeightSyncWorkerExtension"


def vllm_engine_kwargs() -> dict[str, Any]:
    """Engine arguments that install the weight-sync worker extension and select its transfer engine."""
    return {"worker_extension_cls": EXTENSION_CLS, "weight_transfer_config": {"backend": ENGINE_NAME}}


def init_info(info: JoinInfo) -> dict[str, Any]:
    """The ``init_info`` payload of ``init_weight_transfer_engine``: ``info`` as builtins (the worker decodes it)."""
    return msgspec.to_builtins(info)


def update_info(request: UpdateRequest) -> dict[str, Any]:
    """The ``update_info`` payload of ``update_weights``: ``request`` as builtins (the worker decodes it)."""
    return msgspec.to_builtins(request)


def _actor_update(
    version: int, verify_rotation: int, *, adapter_dir: str | None, adapter_config: dict[str, Any] | None
) -> UpdateRequest:
    """An actor's update of ``version``: loaded completely and checked (full weights, or a LoRA adapter's directory)."""
    return UpdateRequest(
        version=version,
        verify_load=True,
        verify_rotation=verify_rotation,
        require_complete=True,
        adapter_dir=adapter_dir,
        adapter_config=adapter_config,
    )


def _structured_error(state: dict[str, Any], fallback: BaseException) -> WeightSyncError:
    err = state.get("last_error") or {}
    message = err.get("message") or str(fallback)
    types: dict[str, type[WeightSyncError]] = {
        "WeightSyncTimeout": WeightSyncTimeout,
        "WeightMismatchError": WeightMismatchError,
    }
    cls = types.get(str(err.get("type")), WeightSyncError)
    return cls(message, tensor=err.get("tensor"))


class EngineWeightSync:
    """Weight-sync driver for a synchronous ``vllm.LLM`` built with :func:`vllm_engine_kwargs`."""

    def __init__(self, llm: Any, *, verify_rotation: int) -> None:
        """``verify_rotation``: ``async_training.weight_sync.verify_rotation`` (see :class:`UpdateRequest`)."""
        self.llm = llm
        self.verify_rotation = verify_rotation

    def join(self, info: JoinInfo) -> None:
        """Join (or, under a higher ``plan.epoch``, rejoin) the group; blocks until all have joined."""
        try:
            self.llm.init_weight_transfer_engine({"init_info": init_info(info)})
        except Exception as exc:
            raise _structured_error({}, exc) from exc

    def announce(self, host: str, port: int, *, member: str, token: str, timeout_s: float) -> None:
        """Tell learner rank 0 that this actor can receive weights (see ``weight_sync.membership``)."""
        announce_at(host, port, member, token, timeout_s=timeout_s)

    def update(self, version: int, *, verify_load: bool = True, require_complete: bool = True) -> dict[str, Any]:
        """Receive, load and verify one complete update; return the worker's report (sizes, timings, checks).
        ``verify_load=False`` and ``require_complete=False`` are for tests and benchmarks that measure without them."""
        payload = update_info(
            UpdateRequest(
                version=version,
                verify_load=verify_load,
                verify_rotation=self.verify_rotation,
                require_complete=require_complete,
                adapter_dir=None,
                adapter_config=None,
            )
        )
        try:
            self.llm.start_weight_update()
            self.llm.update_weights({"update_info": payload})
        except Exception as exc:
            raise _structured_error(self.state(), exc) from exc
        self.llm.finish_weight_update(weight_version=str(version))
        return self._report()

    def stage(self, version: int) -> dict[str, Any]:
        """Receive ``version`` in full and hold it without loading it; the served weights are untouched (also on
        failure). Returns the receive's report."""
        request = _actor_update(version, self.verify_rotation, adapter_dir=None, adapter_config=None)
        return self._rpc("stage_weights", update_info(request))

    def load_staged(self, version: int) -> dict[str, Any]:
        """Load and verify the held update of ``version`` (a failure leaves the weights invalid, as in ``update``)."""
        return self._rpc("load_staged_weights", version)

    def _rpc(self, method: str, arg: Any) -> dict[str, Any]:
        try:
            self.llm.collective_rpc(method, args=(arg,))
        except Exception as exc:
            raise _structured_error(self.state(), exc) from exc
        return self._report()

    def _report(self) -> dict[str, Any]:
        report = self.state()["last_report"]
        assert report is not None, "a successful update always leaves a report"
        return report

    def state(self) -> dict[str, Any]:
        """The first worker's weight-sync status (see ``vllm_ext.BroadcastWeightTransferEngine.state``)."""
        return self.llm.collective_rpc("weight_sync_state")[0]


class AsyncEngineWeightSync:
    """The same for ``vllm.v1.engine.async_llm.AsyncLLM``.

    It does not pause generation: the actor's engine (``actor.engine.GenerationEngine.update_weights``) pauses around
    the update and resumes after it, the one pause/resume path of a weight update.
    """

    def __init__(self, engine: Any, *, verify_rotation: int) -> None:
        """``verify_rotation``: ``async_training.weight_sync.verify_rotation`` (see :class:`UpdateRequest`)."""
        self.engine = engine
        self.verify_rotation = verify_rotation

    async def join(self, info: JoinInfo) -> None:
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        try:
            await self.engine.init_weight_transfer_engine(WeightTransferInitRequest(init_info=init_info(info)))
        except Exception as exc:
            raise _structured_error({}, exc) from exc

    async def announce(self, host: str, port: int, *, member: str, token: str, timeout_s: float) -> None:
        """Tell learner rank 0 that this actor can receive weights (a store write, off the event loop)."""
        await asyncio.to_thread(announce_at, host, port, member, token, timeout_s=timeout_s)

    async def update(self, version: int) -> dict[str, Any]:
        """Receive, load and verify one complete update (generation must be paused by the caller)."""
        return await self._request(version, adapter_dir=None, adapter_config=None)

    async def _request(
        self, version: int, *, adapter_dir: str | None, adapter_config: dict[str, Any] | None
    ) -> dict[str, Any]:
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        request = _actor_update(version, self.verify_rotation, adapter_dir=adapter_dir, adapter_config=adapter_config)
        payload = update_info(request)
        try:
            await self.engine.start_weight_update()
            await self.engine.update_weights(WeightTransferUpdateRequest(update_info=payload))
        except Exception as exc:
            raise _structured_error(await self.state(), exc) from exc
        await self.engine.finish_weight_update(weight_version=str(version))
        return await self._report()

    async def stage(self, version: int) -> dict[str, Any]:
        """Receive ``version`` in full and hold it without loading it, while the engine generates (the served
        weights are untouched, also on failure); returns the receive's report."""
        request = _actor_update(version, self.verify_rotation, adapter_dir=None, adapter_config=None)
        return await self._rpc("stage_weights", update_info(request))

    async def load_staged(self, version: int) -> dict[str, Any]:
        """Load and verify the held update of ``version`` (generation must be paused by the caller, as for
        ``update``; a failure leaves the weights invalid)."""
        return await self._rpc("load_staged_weights", version)

    async def _rpc(self, method: str, arg: Any) -> dict[str, Any]:
        try:
            await self.engine.collective_rpc(method, args=(arg,))
        except Exception as exc:
            raise _structured_error(await self.state(), exc) from exc
        return await self._report()

    async def _report(self) -> dict[str, Any]:
        report = (await self.state())["last_report"]
        assert report is not None, "a successful update always leaves a report"
        return report

    async def update_adapter(self, version: int, adapter_dir: str, adapter_config: dict[str, Any]) -> dict[str, Any]:
        """LoRA: receive the adapter of ``version`` (digest-checked) and write it to ``adapter_dir`` as a PEFT
        adapter; the caller adds it to vLLM. No pause is needed: the served weights are not touched."""
        return await self._request(version, adapter_dir=adapter_dir, adapter_config=adapter_config)

    async def state(self) -> dict[str, Any]:
        return (await self.engine.collective_rpc("weight_sync_state"))[0]
