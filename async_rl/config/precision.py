"""The precision rule for ``auto``: bf16 where the hardware multiplies it faster than fp32, fp32 elsewhere (no torch
import).

``actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype: auto`` (the learner) and
``actor_rollout_ref.rollout.dtype: auto`` (vLLM) resolve by the same rule, on the host that runs them:

* CUDA: bf16;
* a CPU with ``amx_bf16`` in its ``/proc/cpuinfo`` flags (Intel Sapphire Rapids and later, where the hypervisor
  passes AMX through): bf16, where the SmolLM2 learner step measured 2.36x faster than fp32;
* an AMD CPU with ``avx512_bf16`` (Zen 4 and later): bf16, where the SmolLM2 recipe measured 1.47x faster end to end;
* an Intel CPU with ``avx512_bf16`` but no ``amx_bf16`` (Cooper Lake, or a Xeon whose hypervisor hides AMX): fp32.
  There ``vdpbf16ps`` is the only bf16 path and does not beat fp32 FMAs: on a Xeon (model 207, AMX hidden) a
  one-thread [256 x 576] x [576 x 1536] matmul ran 188-196 times a second in bf16 against 351-355 in fp32, and the
  SmolLM2 recipe took 486 s to step 16 in bf16 against 353 s in fp32 (docs/recipes.md);
* any other CPU (AVX2 only, or flags unknown): fp32, since torch emulates bf16 matmuls there and they are far slower.

Each process resolves for itself (actors and learners may run on different kinds of host); :func:`precision_line`
words the choice for the start-up log.

``actor_rollout_ref.model.gradient_checkpointing_interval: auto`` follows the learner's precision as resolved
(:func:`checkpoint_interval`): activations stored for the backward take half the bytes in bf16, so bf16 affords
keeping more of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

__all__ = [
    "AUTO_CHECKPOINT_INTERVAL",
    "CPUINFO",
    "auto_bf16",
    "checkpoint_interval",
    "cpu_bf16_flags",
    "cpu_vendor",
    "learner_precision",
    "precision_line",
    "rollout_precision",
]

CPUINFO = "/proc/cpuinfo"
AMX, AVX512 = "amx_bf16", "avx512_bf16"
_CPU_BF16_FLAGS = frozenset({AVX512, AMX})
_AVX512_BF16_VENDORS = frozenset({"AuthenticAMD"})
"""Vendors whose ``avx512_bf16`` alone (without AMX) makes bf16 matmuls faster than fp32, as measured."""


def _read(cpuinfo: str | Path) -> str | None:
    try:
        return Path(cpuinfo).read_text()
    except OSError:
        return None


def cpu_bf16_flags(cpuinfo: str | Path = CPUINFO) -> frozenset[str] | None:
    """The bf16 flags (``avx512_bf16``, ``amx_bf16``) in ``cpuinfo``; None when it cannot be read."""
    text = _read(cpuinfo)
    if text is None:
        return None
    flags = {flag for line in text.splitlines() if line.startswith("flags") for flag in line.split(":", 1)[-1].split()}
    return frozenset(flags & _CPU_BF16_FLAGS)


def cpu_vendor(cpuinfo: str | Path = CPUINFO) -> str | None:
    """The first ``vendor_id`` in ``cpuinfo`` (``GenuineIntel``, ``AuthenticAMD``, ...); None when absent."""
    for line in (_read(cpuinfo) or "").splitlines():
        if line.startswith("vendor_id"):
            return line.split(":", 1)[-1].strip() or None
    return None


def auto_bf16(device_type: str, cpuinfo: str | Path = CPUINFO) -> tuple[bool, str]:
    """Whether ``auto`` computes in bf16 on ``device_type`` ("cuda" or "cpu"), and why (for the start-up line)."""
    if device_type == "cuda":
        return True, "CUDA"
    flags = cpu_bf16_flags(cpuinfo)
    if flags is None:
        return False, f"CPU flags unknown ({cpuinfo} unreadable)"
    if AMX in flags:
        return True, f"CPU has {'/'.join(sorted(flags))}"
    vendor = cpu_vendor(cpuinfo)
    if AVX512 in flags and vendor in _AVX512_BF16_VENDORS:
        return True, f"{vendor} CPU with {AVX512}"
    if AVX512 in flags:
        return False, f"{vendor or 'a'} CPU with {AVX512} but no {AMX} (bf16 matmuls slower than fp32 there)"
    return False, f"CPU without {AVX512}/{AMX} (bf16 would be emulated)"


def _resolve(value: str, names: tuple[str, str], device_type: str, cpuinfo: str | Path) -> tuple[str, str]:
    """``value`` with ``auto`` replaced by ``names[0]`` (bf16) or ``names[1]`` (fp32) per :func:`auto_bf16`."""
    if value != "auto":
        return value, "set in the config"
    bf16, why = auto_bf16(device_type, cpuinfo)
    return names[0] if bf16 else names[1], f"auto: {why}"


def learner_precision(param_dtype: str, device_type: str, cpuinfo: str | Path = CPUINFO) -> tuple[str, str]:
    """``("bf16" | "fp32", reason)`` for the learner's ``param_dtype`` on ``device_type``."""
    return _resolve(param_dtype, ("bf16", "fp32"), device_type, cpuinfo)


def rollout_precision(dtype: str, device_type: str, cpuinfo: str | Path = CPUINFO) -> tuple[str, str]:
    """``(vLLM dtype, reason)`` for ``rollout.dtype`` on ``device_type``: ``auto`` -> bfloat16 or float32."""
    return _resolve(dtype, ("bfloat16", "float32"), device_type, cpuinfo)


def precision_line(
    param_dtype: str, rollout_dtype: str, *, learner_device: str, actor_device: str, cpuinfo: str | Path = CPUINFO
) -> str:
    """One line naming the learner's and the actors' precision and why (the actors' as this host would resolve it);
    a reason both share is given once."""
    learner, why_l = learner_precision(param_dtype, learner_device, cpuinfo)
    rollout, why_r = rollout_precision(rollout_dtype, actor_device, cpuinfo)
    if why_l == why_r:
        return f"precision: learner {learner}, actors {rollout} ({why_l})"
    return f"precision: learner {learner} ({why_l}), actors {rollout} ({why_r})"


AUTO_CHECKPOINT_INTERVAL = {"bf16": 3, "fp32": 1}
"""``gradient_checkpointing_interval: auto`` by the learner's precision. On the SmolLM2 GRPO recipe (2 ranks, Zen 4,
peak resident memory per rank at step 16): every third layer in bf16 reached step 16 in 225.4-233.3 s at 2,243-2,389
MiB against 240.1-244.8 s at 2,126-2,228 MiB with every layer; in fp32 every third layer peaked at 3,049 MiB
against 2,321-2,378 with every layer, over the 2.5 GB goal (docs/recipes.md)."""


def checkpoint_interval(interval: int | Literal["auto"], learner: str) -> tuple[int, str]:
    """``(k, reason)``: the decoder-layer interval of activation checkpointing for ``interval`` (the config's value)
    with the learner computing in ``learner`` (``"bf16"`` or ``"fp32"``, as :func:`learner_precision` resolved it)."""
    if interval != "auto":
        return interval, "set in the config"
    if learner not in AUTO_CHECKPOINT_INTERVAL:
        raise ValueError(f"learner precision must be one of {sorted(AUTO_CHECKPOINT_INTERVAL)}, got {learner!r}")
    return AUTO_CHECKPOINT_INTERVAL[learner], f"auto: the learner computes in {learner}"
