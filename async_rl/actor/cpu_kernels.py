"""vLLM's own C++ RMSNorm kernels for its CPU build, which otherwise normalises in plain torch ops.

vLLM 0.32 routes RMSNorm through its IR ops (``vllm.ir.ops.rms_norm`` and ``fused_add_rms_norm``). Its C++ kernels
(``torch.ops._C.rms_norm`` / ``fused_add_rms_norm``, compiled into the CPU build too) are registered for GPUs only,
so an eager CPU engine runs the ``native`` torch version: an fp32 copy of the hidden states, ``pow``, ``mean``,
``rsqrt``, two multiplies and two casts, twice per layer. On SmolLM2-135M's 128 x 576 decode rows that is 57 us a
call against 14 us for the kernel (bf16; 37 against 9 us in fp32). Raw vLLM (bf16, one core, Intel Xeon with AMX)
generated 16 prompts x 8 samples x 16 tokens in 4.3-4.8 s with the kernels against 5.1-5.4 s without.

:func:`register` adds the kernels under :data:`PROVIDER` (CPU only; idempotent), and :data:`IR_OP_PRIORITY` is the
engine argument that puts them first, ``native`` second: the kernel declines what it does not handle (a variance
over part of the row, a weight of another dtype, strided rows) and native takes it. Results match native within two
bf16 rounding steps (the kernel rounds once, from fp32; native also rounds before the weight multiply) and to 1e-6
in fp32 (tests/actor/test_cpu_kernels.py).

Where the CPU has no ``avx512_bf16`` the build converts fp32 to bf16 by dropping the low 16 bits instead of rounding
to nearest: on an Intel Xeon with AVX-512 but no bf16, 31% of the residual sums were one bf16 step off, all toward
zero, in every layer's residual stream. :func:`rounds_to_nearest` asks the kernel once per process (a 4 x 128 sum
against torch's rounding), and where it truncates the kernels decline bf16 (native takes it; fp32 is unaffected).

The priority is checked in vLLM's worker processes, so the kernels must be registered there: the weight-sync worker
extension (``actor/vllm_ext.py``) imports this module, and :func:`async_rl.actor.engine.engine_args` sets the
priority only for engines that load that extension.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["IR_OP_PRIORITY", "PROVIDER", "register", "rounds_to_nearest"]

PROVIDER = "async_rl_cpu"
IR_OP_PRIORITY: dict[str, list[str]] = {
    "rms_norm": [PROVIDER, "native"],
    "fused_add_rms_norm": [PROVIDER, "native"],
}
"""vLLM's ``ir_op_priority`` engine argument for a CPU engine: these kernels first, the torch version after."""


_ROUNDS_TO_NEAREST: bool | None = None


def rounds_to_nearest() -> bool:
    """Whether the C++ kernel's fp32 -> bf16 conversion rounds to nearest even, as torch does (asked once, cached):
    a residual sum of 4 x 128 random bf16 pairs must equal torch's rounded fp32 sum in every element. Truncation
    matches it in about half of them."""
    global _ROUNDS_TO_NEAREST
    if _ROUNDS_TO_NEAREST is None:
        g = torch.Generator().manual_seed(0)
        x, residual = (torch.randn(2, 4, 128, generator=g) * 3).to(torch.bfloat16)
        want = (x.float() + residual.float()).to(torch.bfloat16)
        torch.ops._C.fused_add_rms_norm(x, residual, torch.ones(128, dtype=torch.bfloat16), 1e-5)
        _ROUNDS_TO_NEAREST = torch.equal(residual, want)
    return _ROUNDS_TO_NEAREST


def _fits(x: Tensor, weight: Tensor | None, variance_size: int | None) -> bool:
    return (
        variance_size is None
        and weight is not None
        and weight.dtype == x.dtype
        and x.is_contiguous()
        and (x.dtype != torch.bfloat16 or rounds_to_nearest())
    )


def _rms_norm_fits(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> bool:
    return _fits(x, weight, variance_size)


def _fused_add_fits(
    x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> bool:
    return _fits(x, weight, variance_size) and x_residual.is_contiguous() and x_residual.dtype == x.dtype


def _rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> Tensor:
    out = torch.empty_like(x)
    torch.ops._C.rms_norm(out, x, weight, epsilon)
    return out


def _fused_add_rms_norm(
    x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> tuple[Tensor, Tensor]:
    torch.ops._C.fused_add_rms_norm(x, x_residual, weight, epsilon)  # in place: x normalised, x_residual = x + res
    return x, x_residual


def register() -> None:
    """Register the kernels with vLLM's IR ops under :data:`PROVIDER` (supported on a CPU platform only)."""
    from vllm import ir
    from vllm.platforms import current_platform

    on_cpu = current_platform.is_cpu()
    if on_cpu:
        current_platform.import_kernels()  # loads torch.ops._C
    ops: list[tuple[Any, Any, Any, dict[str, Any]]] = [
        (ir.ops.rms_norm, _rms_norm, _rms_norm_fits, {}),
        (ir.ops.fused_add_rms_norm, _fused_add_rms_norm, _fused_add_fits, {"inplace": True}),
    ]
    for op, impl, fits, extra in ops:
        if PROVIDER not in op.impls:
            op.register_impl(PROVIDER, supports_args=fits, supported=on_cpu, **extra)(impl)
