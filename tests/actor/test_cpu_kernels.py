"""vLLM's C++ RMSNorm kernels registered for its CPU build: native's results, and dispatched to when put first."""

from __future__ import annotations

import pytest
import torch

vllm = pytest.importorskip("vllm")
from vllm import ir  # noqa: E402
from vllm.platforms import current_platform  # noqa: E402

from async_rl.actor import cpu_kernels  # noqa: E402

pytestmark = pytest.mark.skipif(not current_platform.is_cpu(), reason="vLLM's CPU build only")

EPS = 1e-5


@pytest.fixture(scope="module", autouse=True)
def _registered() -> None:
    cpu_kernels.register()
    cpu_kernels.register()  # idempotent


def _inputs(dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(37, 576, generator=g) * 3).to(dtype)
    residual = torch.randn(37, 576, generator=g).to(dtype)
    weight = (torch.rand(576, generator=g) + 0.5).to(dtype)
    return x, residual, weight


def _ulp(t: torch.Tensor) -> torch.Tensor:
    """One bf16 rounding step at each element's magnitude (8 significant bits)."""
    return torch.exp2(torch.floor(torch.log2(t.float().abs().clamp_min(1e-30))) - 7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_kernels_compute_what_native_does(dtype: torch.dtype) -> None:
    x, residual, weight = _inputs(dtype)
    native_rms = ir.ops.rms_norm.impls["native"].impl_fn
    native_add = ir.ops.fused_add_rms_norm.impls["native"].impl_fn
    ours_rms = ir.ops.rms_norm.impls[cpu_kernels.PROVIDER].impl_fn
    ours_add = ir.ops.fused_add_rms_norm.impls[cpu_kernels.PROVIDER].impl_fn

    if dtype == torch.bfloat16 and not cpu_kernels.rounds_to_nearest():  # this CPU's build truncates to bf16
        with ir.ops.fused_add_rms_norm.set_priority(cpu_kernels.IR_OP_PRIORITY["fused_add_rms_norm"]):
            assert ir.ops.fused_add_rms_norm.dispatch(x, residual, weight, EPS).provider == "native"
        with ir.ops.rms_norm.set_priority(cpu_kernels.IR_OP_PRIORITY["rms_norm"]):
            assert ir.ops.rms_norm.dispatch(x, weight, EPS).provider == "native"
            assert ir.ops.rms_norm.dispatch(x.float(), weight.float(), EPS).provider == cpu_kernels.PROVIDER
        return
    want = native_rms(x, weight, EPS)
    got = ours_rms(x, weight, EPS)
    want_out, want_res = native_add(x.clone(), residual.clone(), weight, EPS)
    got_out, got_res = ours_add(x.clone(), residual.clone(), weight, EPS)
    assert got.dtype == got_out.dtype == got_res.dtype == dtype
    assert torch.equal(got_res, want_res)  # the residual sum: rounded once, from fp32, in both
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(got_out, want_out, rtol=1e-6, atol=1e-6)
    else:  # native rounds before the weight multiply too (twice in all): at most two bf16 steps apart
        assert bool(((got.float() - want.float()).abs() <= 2 * _ulp(want)).all())
        assert bool(((got_out.float() - want_out.float()).abs() <= 2 * _ulp(want_out)).all())
    assert float((got.float() - x.float()).abs().max()) > 0.1  # it did normalise


def test_put_first_the_kernel_takes_what_it_fits_and_native_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = torch.ops._C.rms_norm

    class _Spy:
        def rms_norm(self, *args: object) -> None:
            calls.append("kernel")
            real(*args)

    x, _, weight = _inputs(torch.float32)
    with ir.ops.rms_norm.set_priority(cpu_kernels.IR_OP_PRIORITY["rms_norm"]):
        assert ir.ops.rms_norm.dispatch(x, weight, EPS).provider == cpu_kernels.PROVIDER
        assert ir.ops.rms_norm.dispatch(x, weight, EPS, 288).provider == "native"  # variance over part of the row
        assert ir.ops.rms_norm.dispatch(x.t(), weight[:37], EPS).provider == "native"  # strided rows
        assert ir.ops.rms_norm.dispatch(x, weight.double(), EPS).provider == "native"  # weight of another dtype
        monkeypatch.setattr(torch.ops, "_C", _Spy())
        out = ir.ops.rms_norm(x, weight, EPS)
    assert calls == ["kernel"]
    torch.testing.assert_close(out, ir.ops.rms_norm.impls["native"].impl_fn(x, weight, EPS), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("rounding", "expected"), [("nearest", True), ("truncate", False)])
def test_the_rounding_probe_tells_truncation_from_rounding_to_nearest(
    monkeypatch: pytest.MonkeyPatch, rounding: str, expected: bool
) -> None:
    class _Kernel:
        def fused_add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
            exact = x.float() + residual.float()
            if rounding == "truncate":  # what a build without avx512_bf16 does: the low 16 bits dropped
                exact = (exact.view(torch.int32) & -65536).view(torch.float32)
            residual.copy_(exact.to(torch.bfloat16))

    monkeypatch.setattr(torch.ops, "_C", _Kernel())
    monkeypatch.setattr(cpu_kernels, "_ROUNDS_TO_NEAREST", None)
    assert cpu_kernels.rounds_to_nearest() is expected
