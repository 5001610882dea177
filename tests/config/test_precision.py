"""The ``auto`` precision rule (bf16 where the hardware computes it faster), on stand-in /proc/cpuinfo files of the
host kinds measured: AVX2 only, AMX, AMD with avx512_bf16, Intel with avx512_bf16 but AMX hidden."""

from __future__ import annotations

from pathlib import Path

import pytest

from async_rl.config.precision import (
    AUTO_CHECKPOINT_INTERVAL,
    auto_bf16,
    checkpoint_interval,
    cpu_bf16_flags,
    cpu_vendor,
    learner_precision,
    precision_line,
    rollout_precision,
)


def _cpuinfo(vendor: str, flags: str, cores: int = 2) -> str:
    return "".join(f"processor\t: {i}\nvendor_id\t: {vendor}\nflags\t\t: {flags}\n\n" for i in range(cores))


HOSTS = {
    "avx2": _cpuinfo("AuthenticAMD", "fpu sse2 avx avx2 fma"),
    "spr": _cpuinfo("GenuineIntel", "fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile", cores=1),
    # an EPYC (Zen 4): avx512_bf16, no AMX; bf16 measured 1.47x faster end to end
    "zen4": _cpuinfo("AuthenticAMD", "fpu avx2 avx512f avx512_bf16 avx512_vnni"),
    # a Xeon whose hypervisor hides AMX (model 207): avx512_bf16 only; bf16 measured slower than fp32
    "xeon_no_amx": _cpuinfo("GenuineIntel", "fpu avx2 avx512f avx_vnni avx512_bf16 avx512_vnni avx512_fp16"),
    "no_vendor": "processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16\n",
}


@pytest.fixture
def hosts(tmp_path: Path) -> dict[str, Path]:
    files = {name: tmp_path / name for name in HOSTS}
    for name, text in HOSTS.items():
        files[name].write_text(text)
    return {**files, "unknown": tmp_path / "missing"}


def test_flags_and_vendor(hosts: dict[str, Path]) -> None:
    assert cpu_bf16_flags(hosts["avx2"]) == frozenset()
    assert cpu_bf16_flags(hosts["spr"]) == {"avx512_bf16", "amx_bf16"}
    assert cpu_bf16_flags(hosts["xeon_no_amx"]) == {"avx512_bf16"}
    assert cpu_bf16_flags(hosts["unknown"]) is None
    assert cpu_vendor(hosts["zen4"]) == "AuthenticAMD"
    assert cpu_vendor(hosts["xeon_no_amx"]) == "GenuineIntel"
    assert cpu_vendor(hosts["no_vendor"]) is None
    assert cpu_vendor(hosts["unknown"]) is None


def test_the_reasons(hosts: dict[str, Path]) -> None:
    assert auto_bf16("cuda", hosts["avx2"]) == (True, "CUDA")  # the CPU does not matter on a GPU
    assert auto_bf16("cpu", hosts["spr"]) == (True, "CPU has amx_bf16/avx512_bf16")
    assert auto_bf16("cpu", hosts["zen4"]) == (True, "AuthenticAMD CPU with avx512_bf16")
    assert auto_bf16("cpu", hosts["xeon_no_amx"]) == (
        False,
        "GenuineIntel CPU with avx512_bf16 but no amx_bf16 (bf16 matmuls slower than fp32 there)",
    )
    assert auto_bf16("cpu", hosts["no_vendor"]) == (
        False,
        "a CPU with avx512_bf16 but no amx_bf16 (bf16 matmuls slower than fp32 there)",
    )
    assert auto_bf16("cpu", hosts["avx2"]) == (False, "CPU without avx512_bf16/amx_bf16 (bf16 would be emulated)")
    assert auto_bf16("cpu", hosts["unknown"]) == (False, f"CPU flags unknown ({hosts['unknown']} unreadable)")


@pytest.mark.parametrize(
    ("host", "device", "learner", "rollout"),
    [
        ("avx2", "cpu", "fp32", "float32"),
        ("spr", "cpu", "bf16", "bfloat16"),
        ("zen4", "cpu", "bf16", "bfloat16"),
        ("xeon_no_amx", "cpu", "fp32", "float32"),
        ("no_vendor", "cpu", "fp32", "float32"),
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
    assert (
        line
        == "precision: learner fp32, actors float32 (auto: CPU without avx512_bf16/amx_bf16 (bf16 would be emulated))"
    )
    line = precision_line("auto", "auto", learner_device="cpu", actor_device="cpu", cpuinfo=hosts["xeon_no_amx"])
    assert line == (  # one reason for both: said once
        "precision: learner fp32, actors float32 (auto: GenuineIntel CPU with avx512_bf16 but no amx_bf16 (bf16"
        " matmuls slower than fp32 there))"
    )
    line = precision_line("fp32", "float32", learner_device="cpu", actor_device="cpu", cpuinfo=hosts["zen4"])
    assert line == "precision: learner fp32, actors float32 (set in the config)"


def test_the_checkpoint_interval_auto_follows_the_learner_precision() -> None:
    assert checkpoint_interval("auto", "bf16") == (3, "auto: the learner computes in bf16")
    assert checkpoint_interval("auto", "fp32") == (1, "auto: the learner computes in fp32")
    assert AUTO_CHECKPOINT_INTERVAL == {"bf16": 3, "fp32": 1}
    assert checkpoint_interval(2, "fp32") == (2, "set in the config")  # a number is kept in either precision
    assert checkpoint_interval(1, "bf16") == (1, "set in the config")
    with pytest.raises(ValueError, match="'fp16'"):
        checkpoint_interval("auto", "fp16")
