"""Sender -> receiver over a real gloo group, all ranks as threads of this process (no vLLM)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

from async_rl.weight_sync import (
    WeightReceiver,
    WeightSender,
    WeightSyncError,
    WeightSyncTimeout,
    create_store,
    open_group,
    resolve_backend,
)
from async_rl.weight_sync import sender as sender_module
from async_rl.weight_sync.buckets import BufferPool, tensor_spec
from async_rl.weight_sync.digest import ByteDigest
from async_rl.weight_sync.group import WeightSyncGroup
from async_rl.weight_sync.protocol import ChunkMeta


def _weights(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(64, 32, generator=gen),  # 8 KiB: direct at the 4 KiB threshold used below
        "layer.0.bias": torch.randn(32, generator=gen).to(torch.bfloat16),
        "layer.0.weight": torch.randn(32, 32, generator=gen).to(torch.float16),
        "step": torch.tensor(7, dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
        "empty": torch.zeros(0, 4),
    }


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the test thread
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def _groups(world_size: int, timeout_s: float) -> list[WeightSyncGroup]:
    """Form a group of ``world_size`` members in this process; member i has rank i."""
    store = create_store("127.0.0.1", 0, is_master=True, timeout_s=timeout_s)
    joins = [
        _in_thread(
            lambda r=r: open_group(
                "127.0.0.1", store.port, rank=r, world_size=world_size, backend="auto", timeout_s=timeout_s
            )
        )
        for r in range(1, world_size)
    ]
    root = open_group(
        "127.0.0.1", store.port, rank=0, world_size=world_size, backend="auto", timeout_s=timeout_s, store=store
    )
    members = [root]
    for thread, box in joins:
        thread.join(timeout_s + 5)
        members.append(box["value"])
    return members


def _collect(group: WeightSyncGroup, **kwargs: Any) -> Callable[[], tuple[dict[str, torch.Tensor], Any]]:
    def run() -> tuple[dict[str, torch.Tensor], Any]:
        got: dict[str, torch.Tensor] = {}
        report = WeightReceiver(group).receive(lambda batch: got.update(batch), **kwargs)
        return got, report

    return run


def test_backend_resolution() -> None:
    assert resolve_backend(backend="auto") == ("nccl" if torch.cuda.is_available() else "gloo")
    assert resolve_backend(backend="gloo") == "gloo"
    with pytest.raises(ValueError, match="'mpi'"):
        resolve_backend(backend="mpi")


def test_two_receivers_get_identical_weights() -> None:
    root, *actors = _groups(3, timeout_s=20)
    receivers = [_in_thread(_collect(g, expect_version=5)) for g in actors]
    weights = _weights()
    sent = WeightSender(root, bucket_size_mb=4 / 1024, direct_min_mb=4 / 1024).send(weights.items(), version=5)
    # 6 tensors; the 8 KiB embed is split into two direct 4 KiB buckets; the 5 small ones (64, 2048, 8, 3, 0 B) share
    # one packed bucket at 64-byte aligned offsets 0, 64, 2112, 2176, 2240, so it ends at 2240 B: 3 buckets in all.
    assert (sent.tensors, sent.buckets) == (6, 3)
    assert sent.nbytes == 8192 + 2240
    for thread, box in receivers:
        thread.join(30)
        assert "error" not in box, box.get("error")
        got, report = box["value"]
        assert report.fingerprint == sent.fingerprint and report.nbytes == sent.nbytes
        for name, tensor in weights.items():
            assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


def test_corrupted_digest_names_the_tensor() -> None:
    root, actor = _groups(2, timeout_s=20)

    class Corrupting(WeightSender):
        def _digest_chunk(self, meta: ChunkMeta, data: torch.Tensor, state: ByteDigest) -> None:
            if meta.name == "layer.0.bias":
                data = data.clone()
                data[3] ^= 0x10
            super()._digest_chunk(meta, data, state)

    thread, box = _in_thread(_collect(actor))
    Corrupting(root, bucket_size_mb=1).send(_weights().items(), version=1)
    thread.join(30)
    assert isinstance(box.get("error"), WeightSyncError)
    assert box["error"].tensor == "layer.0.bias" and "digest mismatch" in str(box["error"])


def test_receiver_times_out_instead_of_hanging_and_the_group_recovers() -> None:
    root, actor = _groups(2, timeout_s=1.5)
    t0 = time.perf_counter()
    with pytest.raises(WeightSyncTimeout, match="timed out"):
        WeightReceiver(actor).receive(lambda batch: None)  # the sender never sends
    elapsed = time.perf_counter() - t0
    assert 1.0 < elapsed < 6.0, elapsed
    assert actor.broken
    with pytest.raises(WeightSyncError, match="broken"):
        WeightReceiver(actor).receive(lambda batch: None)
    # Recovery: every member rejoins under epoch 1 on the same store, then a normal update goes through.
    thread, box = _in_thread(lambda: actor.rejoin(1))
    root.rejoin(1)
    thread.join(10)
    assert "error" not in box and actor.epoch == root.epoch == 1 and not actor.broken
    thread, box = _in_thread(_collect(actor))
    WeightSender(root, bucket_size_mb=256.0).send(_weights(1).items(), version=2)
    thread.join(30)
    assert torch.equal(box["value"][0]["embed.weight"], _weights(1)["embed.weight"])


def test_sender_failure_aborts_the_receivers() -> None:
    root, actor = _groups(2, timeout_s=20)

    def broken_source():
        yield "a", torch.ones(4)
        raise OSError("gather failed")

    thread, box = _in_thread(_collect(actor))
    with pytest.raises(OSError, match="gather failed"):
        WeightSender(root, bucket_size_mb=1, direct_min_mb=1e-5).send(broken_source(), version=1)
    thread.join(30)
    assert isinstance(box.get("error"), WeightSyncError) and "OSError: gather failed" in str(box["error"])


def test_failure_mid_stream_abandons_the_epoch_and_stops_the_receivers_at_once() -> None:
    root, actor = _groups(2, timeout_s=30)
    weights = _weights()
    manifest = [tensor_spec(name, t) for name, t in weights.items()]

    def lazy_source():  # a lazy gather: the plan went out from the manifest, then the second tensor fails
        names = iter(weights.items())
        yield next(names)
        raise OSError("gather failed")

    thread, box = _in_thread(_collect(actor))
    t0 = time.perf_counter()
    with pytest.raises(OSError, match="gather failed"):
        WeightSender(root, bucket_size_mb=4 / 1024, direct_min_mb=4 / 1024).send(
            lazy_source(), version=1, manifest=manifest
        )
    thread.join(10)
    elapsed = time.perf_counter() - t0
    assert isinstance(box.get("error"), WeightSyncError) and "OSError: gather failed" in str(box["error"])
    assert "abandoned" in str(box["error"]) and elapsed < 5.0, elapsed  # not the 30 s group timeout
    assert root.broken and actor.broken


def test_lazy_source_with_a_manifest_matches_the_materialised_send() -> None:
    root, actor = _groups(2, timeout_s=20)
    weights = _weights(3)
    manifest = [tensor_spec(name, t) for name, t in weights.items()]
    thread, box = _in_thread(_collect(actor))
    sent = WeightSender(root, bucket_size_mb=4 / 1024, direct_min_mb=4 / 1024).send(
        iter(weights.items()), version=4, manifest=manifest
    )
    thread.join(30)
    got, report = box["value"]
    assert (sent.tensors, sent.buckets, report.fingerprint) == (6, 3, sent.fingerprint)
    assert all(torch.equal(got[name], t) for name, t in weights.items())


def test_the_sender_keeps_two_packing_buffers_however_many_buckets_an_update_has(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sender_module, "keep_buffers", lambda device: True)  # as with glibc's malloc
    root, actor = _groups(2, timeout_s=20)
    weights = {f"w{i}": torch.full((128,), float(i)) for i in range(16)}  # 512 B each: 2 per 1-KiB bucket
    sender = WeightSender(root, bucket_size_mb=1 / 1024, direct_min_mb=4 / 1024)
    for version in (1, 2):
        thread, box = _in_thread(_collect(actor))
        manifest = [tensor_spec(n, t) for n, t in weights.items()]
        sent = sender.send(iter(weights.items()), version=version, manifest=manifest)
        thread.join(30)
        got, _ = box["value"]
        assert sent.buckets == 8 and all(torch.equal(got[n], t) for n, t in weights.items())
        # one bucket on the wire while the next is packed: two 1-KiB blocks, not one per bucket
        assert sender.pool.held_bytes == 2 * 1024


def test_a_receiver_with_a_pool_reuses_its_buffers_on_the_next_update() -> None:
    root, actor = _groups(2, timeout_s=20)
    pool = BufferPool("cpu", block_bytes=0, keep=True)
    sender = WeightSender(root, bucket_size_mb=4 / 1024, direct_min_mb=4 / 1024)
    seen: list[dict[str, tuple[int, torch.Tensor]]] = []

    def update(seed: int) -> None:
        got: dict[str, tuple[int, torch.Tensor]] = {}

        def keep(batch: list[tuple[str, torch.Tensor]]) -> None:  # like vLLM's loaders: copy what is kept
            got.update({name: (t.data_ptr(), t.clone()) for name, t in batch})

        thread, box = _in_thread(lambda: WeightReceiver(actor, pool=pool).receive(keep))
        sender.send(_weights(seed).items(), version=seed)
        thread.join(30)
        assert "error" not in box, box.get("error")
        seen.append(got)

    update(1)
    held = pool.held_bytes
    update(2)
    assert held > 0 and pool.held_bytes == held
    for name, tensor in _weights(2).items():
        assert torch.equal(seen[1][name][1], tensor), name
        if tensor.numel():
            assert seen[1][name][0] == seen[0][name][0], name  # the same memory as the first update's


def test_version_mismatch_is_refused() -> None:
    root, actor = _groups(2, timeout_s=3)
    thread, box = _in_thread(_collect(actor, expect_version=9))
    try:  # the receiver stops listening after the first header; small sends may still complete into socket buffers
        WeightSender(root, bucket_size_mb=1 / 1024, direct_min_mb=1 / 1024).send(_weights().items(), version=8)
    except WeightSyncTimeout:
        pass
    thread.join(30)
    assert isinstance(box.get("error"), WeightSyncError) and "expected v9" in str(box["error"])


def test_role_and_argument_checks() -> None:
    root, actor = _groups(2, timeout_s=10)
    with pytest.raises(ValueError, match="rank 0"):
        WeightSender(actor, bucket_size_mb=256.0)
    with pytest.raises(ValueError, match="bucket_size_mb"):
        WeightSender(root, bucket_size_mb=0)
    with pytest.raises(ValueError, match="rank 0"):
        WeightReceiver(root)
    with pytest.raises(ValueError, match="version"):
        WeightSender(root, bucket_size_mb=256.0).send([], version=-1)
    with pytest.raises(ValueError, match="world_size"):
        open_group("127.0.0.1", 1, rank=0, world_size=1, backend="auto", timeout_s=10.0, store=root.store)
    with pytest.raises(ValueError, match="port"):
        create_store("127.0.0.1", 0, is_master=False, timeout_s=10.0)


@pytest.mark.gpu
def test_nccl_round_trip_between_two_gpus() -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices (NCCL refuses two ranks on one device)")
    store = create_store("127.0.0.1", 0, is_master=True, timeout_s=60)

    def actor() -> tuple[dict[str, torch.Tensor], Any]:
        torch.cuda.set_device(1)
        group = open_group("127.0.0.1", store.port, rank=1, world_size=2, backend="nccl", timeout_s=60)
        return _collect(group)()

    thread, box = _in_thread(actor)
    torch.cuda.set_device(0)
    root = open_group("127.0.0.1", store.port, rank=0, world_size=2, backend="auto", timeout_s=60, store=store)
    assert root.backend == "nccl" and root.device.type == "cuda"
    weights = {name: t.cuda() for name, t in _weights().items()}
    sent = WeightSender(root, bucket_size_mb=4 / 1024).send(weights.items(), version=1)
    thread.join(120)
    assert "error" not in box, box.get("error")
    got, report = box["value"]
    assert report.fingerprint == sent.fingerprint  # wsum16 digests computed on the devices
    for name, tensor in weights.items():
        assert got[name].device.type == "cuda" and torch.equal(got[name].cpu(), tensor.cpu()), name
