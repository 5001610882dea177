"""The ``auto`` precision rule (bf16 where the hardware has it), on stand-in /proc/cpuinfo files of both host kinds."""

from __future__ import annotations

from pathlib import Path

import pytest

from async_rl.config.precision import (
    cpu_bf16_flags,
    learner_precision,
    native_bf16,
    precision_line,
    rollout_precision,
)

AVX2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu sse2 avx avx2 fma\n"
SPR = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"


@pytest.fixture
def hosts(tmp_path: Path) -> dict[str, Path]:
    files = {"avx2": tmp_path / "avx2", "spr": tmp_path / "spr"}
    files["avx2"].write_text(AVX2)
    files["spr"].write_text(SPR)
    return {**files, "unknown": tmp_path / "missing"}


def test_flags(hosts: dict[str, Path]) -> None:
    assert cpu_bf16_flags(hosts["avx2"]) == frozenset()
    assert cpu_bf16_flags(hosts["spr"]) == {"avx512_bf16", "amx_bf16"}
    assert cpu_bf16_flags(hosts["unknown"]) is None
    assert native_bf16("cuda", hosts["avx2"]) == (True, "CUDA")  # the CPU does not matter on a GPU
    assert native_bf16("cpu", hosts["spr"]) == (True, "CPU has amx_bf16/avx512_bf16")
    assert native_bf16("cpu", hosts["avx2"])[0] is False
    assert native_bf16("cpu", hosts["unknown"])[0] is False


@pytest.mark.parametrize(
    ("host", "device", "learner", "rollout"),
    [
        ("avx2", "cpu", "fp32", "float32"),
        ("spr", "cpu", "bf16", "bfloat16"),
        ("unknown", "cpu", "fp32", "float32"),
        ("avx2", "cuda", "bf16", "bfloat16"),
    ],
)
def test_auto_follows_the_hardware(hosts: dict[str, Path], host: str, device: str, learner: str, rollout: str) -> None:
    assert learner_precision("auto", device, hosts[host])[0] == learner
    assert rollout_precision("auto", device, hosts[host])[0] == rollout
    # an explicit value is kept on any host
    assert learner_precision("fp32", device, hosts[host]) == ("fp32", "set in the config")
    assert rollout_precision("bfloat16", device, hosts[host]) == ("bfloat16", "set in the config")


def test_the_start_up_line_names_both_choices_and_why(hosts: dict[str, Path]) -> None:
    line = precision_line("auto", "float32", learner_device="cpu", actor_device="cpu", cpuinfo=hosts["spr"])
    assert line == ("precision: learner bf16 (auto: CPU has amx_bf16/avx512_bf16), actors float32 (set in the config)")
    line = precision_line("auto", "auto", learner_device="cpu", actor_device="cpu", cpuinfo=hosts["avx2"])
    assert line.startswith("precision: learner fp32 (auto: CPU without avx512_bf16/amx_bf16")
    assert "actors float32 (auto: CPU without" in line
