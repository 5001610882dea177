"""Bucket packing and reassembly (pure: no process group, no vLLM)."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from async_rl.weight_sync.buckets import (
    ALIGN,
    Bucket,
    BufferPool,
    TensorAssembler,
    fill_buckets,
    keep_buffers,
    malloc_is_tcmalloc,
    plan_buckets,
    tensor_spec,
)
from async_rl.weight_sync.errors import WeightSyncError
from async_rl.weight_sync.protocol import BucketSpec, ChunkMeta

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int8, torch.uint8, torch.bool]


def _make(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    return torch.randint(-100 if dtype != torch.uint8 else 0, 100, shape, generator=gen).to(dtype)


def _buckets(named: list[tuple[str, torch.Tensor]], cap: int, direct_min: int | None = None) -> list[Bucket]:
    plan = plan_buckets([tensor_spec(n, t) for n, t in named], cap, direct_min_bytes=direct_min)
    return list(fill_buckets(plan, iter(named), device="cpu"))


def _loopback(named: list[tuple[str, torch.Tensor]], cap: int, direct_min: int | None = None):
    """Pack, 'transmit' by copying into the receiver's buffers, reassemble; return (tensors, bucket sizes)."""
    assembler = TensorAssembler("cpu")
    out: dict[str, torch.Tensor] = {}
    sizes = []
    for bucket in _buckets(named, cap, direct_min):
        sizes.append(bucket.data.numel())
        spec = BucketSpec(bucket.direct, bucket.data.numel(), bucket.chunks)
        buf = assembler.buffer_for(spec)
        buf.copy_(bucket.data)
        assembler.commit(spec, buf)
        out.update(dict(assembler.pop_complete()))
    assembler.finish()
    return out, sizes


def test_hand_computed_layout() -> None:
    # cap 256 B, only tensors of >= 256 B go direct.
    named = [
        ("a", torch.ones(10)),  # 40 B at offset 0
        ("b", torch.ones(30, dtype=torch.int8)),  # 30 B at align(40) = 64 -> bucket holds 94 B
        ("c", torch.ones(40)),  # 160 B: align(94) = 128, 128 + 160 > 256 -> new bucket of 160 B
        ("d", torch.ones(100)),  # 400 B >= 256: direct, split into 256 + 144
        ("e", torch.ones(3, dtype=torch.bfloat16)),  # 6 B in a fresh packed bucket
    ]
    buckets = _buckets(named, 256, 256)
    assert [b.data.numel() for b in buckets] == [94, 160, 256, 144, 6]
    assert [b.direct for b in buckets] == [False, False, True, True, False]
    assert [(m.name, m.offset) for m in buckets[0].chunks] == [("a", 0), ("b", 64)]
    assert [(m.start, m.nbytes, m.total) for b in buckets[2:4] for m in b.chunks] == [(0, 256, 400), (256, 144, 400)]


def test_direct_bucket_is_a_view_of_the_source() -> None:
    big = torch.arange(1000, dtype=torch.float32)  # 4000 B >= direct_min: sent from its own memory
    (bucket,) = _buckets([("w", big)], 8192, 1024)
    assert bucket.direct and bucket.data.data_ptr() == big.data_ptr()


@settings(max_examples=60, deadline=None)
@given(
    specs=st.lists(
        st.tuples(st.sampled_from(DTYPES), st.lists(st.integers(0, 40), min_size=0, max_size=3)),
        min_size=1,
        max_size=12,
    ),
    cap=st.sampled_from([64, 100, 256, 1000, 4096]),
    direct_frac=st.floats(0.05, 1.0),
    seed=st.integers(0, 1000),
)
def test_round_trip_respects_cap(specs, cap: int, direct_frac: float, seed: int) -> None:
    named = [(f"t{i}", _make(dtype, tuple(shape), seed + i)) for i, (dtype, shape) in enumerate(specs)]
    direct_min = max(1, int(cap * direct_frac))
    out, sizes = _loopback(named, cap, direct_min)
    assert set(out) == {name for name, _ in named}
    for name, tensor in named:
        got = out[name]
        assert got.dtype == tensor.dtype and got.shape == tensor.shape
        assert torch.equal(got.reshape(-1).view(torch.uint8), tensor.reshape(-1).view(torch.uint8))
    assert max(sizes) <= cap
    total = sum(t.numel() * t.element_size() for _, t in named)
    assert len(sizes) >= math.ceil(total / cap)  # the cap is never exceeded, so at least this many buckets


def test_invalid_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="cap_bytes"):
        _buckets([("a", torch.ones(1))], ALIGN - 1)
    with pytest.raises(ValueError, match="direct_min_bytes"):
        _buckets([("a", torch.ones(1))], 128, 129)
    with pytest.raises(ValueError, match="appears twice"):
        _buckets([("a", torch.ones(1)), ("a", torch.ones(1))], 128)
    with pytest.raises(ValueError, match="cannot be sent"):
        _buckets([("a", torch.ones(1, dtype=torch.complex64))], 128)
    with pytest.raises(ValueError, match="torch.Tensor"):
        _buckets([("a", [1.0])], 128)  # type: ignore[list-item]


def test_fill_checks_the_tensors_against_the_plan() -> None:
    plan = plan_buckets([tensor_spec("a", torch.ones(4)), tensor_spec("b", torch.ones(2))], 128)
    with pytest.raises(ValueError, match=r"tensor 'a' \(float16\[4\]\) does not match"):
        list(fill_buckets(plan, [("a", torch.ones(4, dtype=torch.float16)), ("b", torch.ones(2))], device="cpu"))
    with pytest.raises(ValueError, match="does not match"):
        list(fill_buckets(plan, [("b", torch.ones(2)), ("a", torch.ones(4))], device="cpu"))  # out of order
    with pytest.raises(ValueError, match="ended before 'b'"):
        list(fill_buckets(plan, [("a", torch.ones(4))], device="cpu"))
    with pytest.raises(ValueError, match="'c' is not in the plan"):
        list(fill_buckets(plan, [("a", torch.ones(4)), ("b", torch.ones(2)), ("c", torch.ones(1))], device="cpu"))


def test_packed_tensors_are_received_in_place() -> None:
    named = [("a", torch.arange(4.0)), ("b", torch.arange(3, dtype=torch.int64))]
    (bucket,) = _buckets(named, 1024, 1024)
    spec = BucketSpec(False, bucket.data.numel(), bucket.chunks)
    asm = TensorAssembler("cpu")
    buf = asm.buffer_for(spec)
    buf.copy_(bucket.data)
    asm.commit(spec, buf)
    got = dict(asm.pop_complete())
    assert torch.equal(got["a"], torch.arange(4.0)) and torch.equal(got["b"], torch.arange(3))
    # No copy: each tensor is a view of the bucket's receive buffer, at its 64-byte aligned offset.
    assert got["a"].data_ptr() == buf.data_ptr() and got["b"].data_ptr() == buf.data_ptr() + 64


def _packed(meta: ChunkMeta, size: int) -> BucketSpec:
    return BucketSpec(False, size, [meta])


def _meta(name: str = "w", *, start: int = 0, nbytes: int = 8, total: int = 8, shape=(2,)) -> ChunkMeta:
    return ChunkMeta(name, "float32", tuple(shape), 0, nbytes, start, total)


def test_assembler_rejects_malformed_streams() -> None:
    asm = TensorAssembler("cpu")
    with pytest.raises(WeightSyncError, match="expected 0") as info:
        asm.commit(_packed(_meta(start=4, nbytes=4), 4), torch.zeros(4, dtype=torch.uint8))
    assert info.value.tensor == "w"
    asm = TensorAssembler("cpu")
    with pytest.raises(WeightSyncError, match="shape"):  # 3 floats are 12 bytes, not 8
        asm.commit(_packed(_meta(shape=(3,)), 8), torch.zeros(8, dtype=torch.uint8))
    asm = TensorAssembler("cpu")
    asm.commit(_packed(_meta(), 8), torch.zeros(8, dtype=torch.uint8))
    assert [name for name, _ in asm.pop_complete()] == ["w"]
    with pytest.raises(WeightSyncError, match="twice"):
        asm.commit(_packed(_meta(), 8), torch.zeros(8, dtype=torch.uint8))
    asm = TensorAssembler("cpu")
    asm.commit(_packed(_meta(nbytes=4), 4), torch.zeros(4, dtype=torch.uint8))
    assert asm.pop_complete() == []
    with pytest.raises(WeightSyncError, match="incomplete"):
        asm.finish()
    with pytest.raises(WeightSyncError, match="outside"):
        TensorAssembler("cpu").commit(_packed(_meta(), 4), torch.zeros(4, dtype=torch.uint8))
    with pytest.raises(WeightSyncError, match="unknown dtype"):
        TensorAssembler("cpu").commit(
            _packed(ChunkMeta("w", "complex64", (1,), 0, 8, 0, 8), 8), torch.zeros(8, dtype=torch.uint8)
        )


def test_buffer_pool_lends_each_buffer_once_per_update_and_reuses_it_after() -> None:
    pool = BufferPool("cpu", block_bytes=0, keep=True)
    a, b = pool.take(100), pool.take(100)
    assert a.data_ptr() != b.data_ptr() and pool.held_bytes == 0  # both lent: never the same buffer twice at once
    pool.restore()
    assert pool.held_bytes == 200
    again = {pool.take(100).data_ptr(), pool.take(100).data_ptr()}
    assert again == {a.data_ptr(), b.data_ptr()}
    assert pool.take(100).data_ptr() not in again  # a third one of that size is new memory
    pool.drop()  # a failed update: what it had lent is not reused
    assert pool.held_bytes == 0 and pool.take(100).data_ptr() not in again


def test_a_block_pool_lends_views_of_equal_blocks_and_takes_each_back_at_once() -> None:
    pool = BufferPool("cpu", block_bytes=256, keep=True)
    a = pool.take(100)
    assert a.numel() == 100 and a.untyped_storage().nbytes() == 256
    pool.give_back(a)  # off the wire: a request of another size reuses the same block
    b = pool.take(200)
    assert b.numel() == 200 and b.data_ptr() == a.data_ptr() and pool.held_bytes == 0
    c = pool.take(256)
    assert c.data_ptr() != b.data_ptr()  # b is still lent
    pool.give_back(b)
    pool.give_back(torch.zeros(4, dtype=torch.uint8))  # not lent by this pool: ignored
    assert pool.held_bytes == 256
    pool.restore()
    assert pool.held_bytes == 512


def test_a_pool_that_does_not_keep_lends_fresh_buffers_and_holds_nothing() -> None:
    pool = BufferPool("cpu", block_bytes=256, keep=False)
    a = pool.take(100)
    assert a.numel() == 100 and a.untyped_storage().nbytes() == 256
    pool.give_back(a)
    pool.restore()
    assert pool.held_bytes == 0
    a[:] = 7
    assert pool.take(100).data_ptr() != a.data_ptr()  # `a` is still alive here: new memory, never a lent buffer


_DETECT = (
    "from async_rl.weight_sync.buckets import keep_buffers, malloc_is_tcmalloc;"
    " print(malloc_is_tcmalloc(), keep_buffers('cpu'))"
)


def test_buffers_are_kept_on_cpu_only_where_malloc_is_not_tcmalloc() -> None:
    from async_rl.runtime.allocator import find_tcmalloc, search_dirs

    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    run = [sys.executable, "-c", _DETECT]
    plain = subprocess.run(run, env=env, capture_output=True, text=True, check=True, timeout=120)
    assert plain.stdout.split() == ["False", "True"]  # glibc malloc: the pool keeps its buffers
    assert keep_buffers("cuda") is False and keep_buffers("cpu") is (not malloc_is_tcmalloc())
    library = find_tcmalloc(search_dirs(os.environ))
    if library is None:
        pytest.skip("no tcmalloc library on this host")
    preloaded = subprocess.run(
        run, env={**env, "LD_PRELOAD": library}, capture_output=True, text=True, check=True, timeout=120
    )
    assert preloaded.stdout.split() == ["True", "False"]
