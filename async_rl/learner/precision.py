"""The dtype the learner computes in: ``actor.fsdp_config.mixed_precision.param_dtype`` resolved on its device.

The rule for ``auto`` lives in :mod:`async_rl.config.precision` (torch-free, shared with the actors' rollout dtype);
this module turns it into a torch dtype and warns about an explicit bf16 on a CPU where ``auto`` would compute in fp32
because bf16 is slower there.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import get_args

import torch

from async_rl.config.names import ParamDtype
from async_rl.config.precision import CPUINFO, auto_bf16, cpu_bf16_flags, learner_precision

__all__ = ["cpu_native_bf16", "resolve_compute_dtype"]

logger = logging.getLogger(__name__)

_PARAM_DTYPES = get_args(ParamDtype)


def cpu_native_bf16(cpuinfo: str | Path = CPUINFO) -> bool | None:
    """Whether this CPU has bf16 instructions (the ``avx512_bf16`` or ``amx_bf16`` flag in ``cpuinfo``); None when
    unknown (no such file, e.g. not Linux). Without either flag torch emulates bf16 matmuls, which is far slower than
    fp32 (measured on an AVX2-only EPYC: 0.9 vs 72.6 GFLOP/s for a 1024^3 matmul on 2 threads). Having them does not
    make bf16 the faster choice everywhere: :func:`async_rl.config.precision.auto_bf16` decides that."""
    flags = cpu_bf16_flags(cpuinfo)
    return None if flags is None else bool(flags)


_warned_slow_bf16 = False


def resolve_compute_dtype(
    param_dtype: str, device: torch.device, *, warn: bool = True, cpuinfo: str | Path = CPUINFO
) -> torch.dtype:
    """The dtype the learner computes in for ``actor.fsdp_config.mixed_precision.param_dtype`` on ``device``.

    ``auto``: bf16 on CUDA and on CPUs where bf16 is the faster choice (:mod:`async_rl.config.precision`), fp32
    elsewhere; ``bf16``: bf16 on any device (mixed precision: the master weights stay fp32); ``fp32``: fp32. An
    explicit bf16 on a CPU whose flags are known and where ``auto`` would pick fp32 logs a warning with the reason when
    ``warn`` (the learner passes rank 0's flag), once per process."""
    global _warned_slow_bf16
    if param_dtype not in _PARAM_DTYPES:
        raise ValueError(f"param_dtype must be one of {_PARAM_DTYPES}, got {param_dtype!r}")
    chosen, _ = learner_precision(param_dtype, device.type, cpuinfo)
    if chosen == "fp32":
        return torch.float32
    if warn and device.type == "cpu" and not _warned_slow_bf16 and cpu_native_bf16(cpuinfo) is not None:
        faster, why = auto_bf16("cpu", cpuinfo)
        if not faster:
            _warned_slow_bf16 = True
            logger.warning(
                "param_dtype=bf16 on this CPU (%s; read from %s): the learner will be slower than in fp32;"
                " param_dtype=auto (or fp32) computes in fp32 here",
                why,
                cpuinfo,
            )
    return torch.bfloat16
