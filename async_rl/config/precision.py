"""The precision rule for ``auto``: bf16 where the hardware multiplies it natively, fp32 elsewhere (no torch import).

``actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype: auto`` (the learner) and
``actor_rollout_ref.rollout.dtype: auto`` (vLLM) resolve by the same rule, on the host that runs them:

* CUDA: bf16;
* a CPU whose ``/proc/cpuinfo`` flags include ``avx512_bf16`` or ``amx_bf16`` (e.g. Sapphire Rapids): bf16, where
  the SmolLM2 learner step measured 2.36x faster than fp32;
* any other CPU (AVX2 only, or flags unknown): fp32, since torch emulates bf16 matmuls there and they are far slower.

Each process resolves for itself (actors and learners may run on different kinds of host); :func:`precision_line`
words the choice for the start-up log.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["CPUINFO", "cpu_bf16_flags", "learner_precision", "native_bf16", "precision_line", "rollout_precision"]

CPUINFO = "/proc/cpuinfo"
_CPU_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_bf16_flags(cpuinfo: str | Path = CPUINFO) -> frozenset[str] | None:
    """The native-bf16 flags (``avx512_bf16``, ``amx_bf16``) in ``cpuinfo``; None when it cannot be read."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return None
    flags = {flag for line in text.splitlines() if line.startswith("flags") for flag in line.split(":", 1)[-1].split()}
    return frozenset(flags & _CPU_BF16_FLAGS)


def native_bf16(device_type: str, cpuinfo: str | Path = CPUINFO) -> tuple[bool, str]:
    """Whether ``device_type`` ("cuda" or "cpu") computes bf16 natively, and why (for the start-up line)."""
    if device_type == "cuda":
        return True, "CUDA"
    flags = cpu_bf16_flags(cpuinfo)
    if flags is None:
        return False, f"CPU flags unknown ({cpuinfo} unreadable)"
    if flags:
        return True, f"CPU has {'/'.join(sorted(flags))}"
    return False, "CPU without avx512_bf16/amx_bf16 (bf16 would be emulated)"


def _resolve(value: str, names: tuple[str, str], device_type: str, cpuinfo: str | Path) -> tuple[str, str]:
    """``value`` with ``auto`` replaced by ``names[0]`` (bf16) or ``names[1]`` (fp32) per :func:`native_bf16`."""
    if value != "auto":
        return value, "set in the config"
    native, why = native_bf16(device_type, cpuinfo)
    return names[0] if native else names[1], f"auto: {why}"


def learner_precision(param_dtype: str, device_type: str, cpuinfo: str | Path = CPUINFO) -> tuple[str, str]:
    """``("bf16" | "fp32", reason)`` for the learner's ``param_dtype`` on ``device_type``."""
    return _resolve(param_dtype, ("bf16", "fp32"), device_type, cpuinfo)


def rollout_precision(dtype: str, device_type: str, cpuinfo: str | Path = CPUINFO) -> tuple[str, str]:
    """``(vLLM dtype, reason)`` for ``rollout.dtype`` on ``device_type``: ``auto`` -> bfloat16 or float32."""
    return _resolve(dtype, ("bfloat16", "float32"), device_type, cpuinfo)


def precision_line(
    param_dtype: str, rollout_dtype: str, *, learner_device: str, actor_device: str, cpuinfo: str | Path = CPUINFO
) -> str:
    """One line naming the learner's and the actors' precision and why (the actors' as this host would resolve it)."""
    learner, why_l = learner_precision(param_dtype, learner_device, cpuinfo)
    rollout, why_r = rollout_precision(rollout_dtype, actor_device, cpuinfo)
    return f"precision: learner {learner} ({why_l}), actors {rollout} ({why_r})"
