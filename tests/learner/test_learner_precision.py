"""The learner's compute precision: ``param_dtype`` resolved per device, the CPU bf16 warning, the single-process bf16
path (autocast, fp32 master weights) against fp32. The FSDP2 path (MixedPrecisionPolicy on gloo) is checked with two
ranks in ``test_learner_distributed.py``."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from _learner_testlib import START, scripted_groups, settings, tiny_policy
from torch import nn

from async_rl.config import default_config, load_config
from async_rl.config.precision import auto_bf16
from async_rl.learner import Learner, local_context
from async_rl.learner import precision as precision_mod
from async_rl.learner.model import build_model
from async_rl.learner.precision import cpu_native_bf16, resolve_compute_dtype

KEY = "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype"
CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)  # a device object needs no GPU; only its type is read
BF16, FP32 = torch.bfloat16, torch.float32
FLAGS = "flags\t\t: fpu vme sse sse2 avx avx2 fma"


@pytest.fixture
def cpuinfo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A /proc/cpuinfo stand-in without bf16 flags; the once-per-process warning is re-armed."""
    monkeypatch.setattr(precision_mod, "_warned_slow_bf16", False)
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\n{FLAGS}\n\nprocessor\t: 1\n{FLAGS}\n")
    return path


@pytest.mark.parametrize(
    ("param_dtype", "device", "expected"),
    [
        ("auto", CUDA, BF16),
        ("auto", CPU, FP32),  # a CPU without native bf16 (the fixture's AVX2 flags): emulated bf16 is slow
        ("bf16", CUDA, BF16),
        ("bf16", CPU, BF16),  # asked for: bf16 wherever the learner runs
        ("fp32", CUDA, FP32),
        ("fp32", CPU, FP32),
    ],
)
def test_param_dtype_resolves_per_device(
    param_dtype: str, device: torch.device, expected: torch.dtype, cpuinfo: Path
) -> None:
    assert resolve_compute_dtype(param_dtype, device, cpuinfo=cpuinfo) == expected
    cfg = load_config(None, [f"{KEY}={param_dtype}"])
    assert cfg.actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype == param_dtype
    if device == CPU and param_dtype != "auto":  # auto depends on this host's CPU, see below
        assert (
            Learner(settings(param_dtype=param_dtype), START, local_context(CPU), tiny_policy).compute_dtype == expected
        )


@pytest.mark.parametrize(
    ("vendor", "flags", "expected"),
    [
        ("AuthenticAMD", "avx512_bf16", BF16),  # Zen 4: bf16 measured faster
        ("GenuineIntel", "avx512_bf16 amx_bf16", BF16),  # AMX
        ("GenuineIntel", "avx512_bf16", FP32),  # AMX hidden: bf16 measured slower than fp32
    ],
)
def test_auto_follows_the_cpus_bf16_instructions(vendor: str, flags: str, expected: torch.dtype, cpuinfo: Path) -> None:
    cpuinfo.write_text(f"processor\t: 0\nvendor_id\t: {vendor}\n{FLAGS} {flags}\n")
    assert resolve_compute_dtype("auto", CPU, cpuinfo=cpuinfo) == expected
    # this host: whatever its flags say, the learner follows the same rule
    assert Learner(settings(param_dtype="auto"), START, local_context(CPU), tiny_policy).compute_dtype == (
        BF16 if auto_bf16("cpu")[0] else FP32
    )


def test_default_is_auto_and_unknown_names_are_refused() -> None:
    assert default_config().actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype == "auto"
    with pytest.raises(ValueError, match="param_dtype must be one of"):
        resolve_compute_dtype("bfloat16", CPU)
    with pytest.raises(ValueError, match="param_dtype"):
        load_config(None, [f"{KEY}=fp16"])
    with pytest.raises(ValueError, match="compute_dtype must be one of"):
        build_model(
            tiny_policy,
            local_context(CPU),
            role="actor",
            compute_dtype=torch.float16,
            seed=0,
            gradient_checkpointing=0,
            shared_prompt=False,
            fused_output_layer=False,
            reshard_after_forward=True,
            min_num_params=0,
        )


def test_bf16_on_a_cpu_without_native_bf16_warns_once(cpuinfo: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert cpu_native_bf16(cpuinfo) is False
    with caplog.at_level(logging.WARNING, logger=precision_mod.__name__):
        for device, param_dtype in ((CPU, "auto"), (CPU, "fp32"), (CUDA, "bf16")):
            resolve_compute_dtype(param_dtype, device, cpuinfo=cpuinfo)
        assert resolve_compute_dtype("bf16", CPU, warn=False, cpuinfo=cpuinfo) == BF16  # ranks other than 0
        assert not caplog.records  # fp32 on CPU, or bf16 on CUDA: nothing to warn about
        resolve_compute_dtype("bf16", CPU, cpuinfo=cpuinfo)
        resolve_compute_dtype("bf16", CPU, cpuinfo=cpuinfo)
    assert len(caplog.records) == 1
    assert "CPU without avx512_bf16/amx_bf16 (bf16 would be emulated)" in caplog.records[0].getMessage()


def test_bf16_on_an_intel_cpu_without_amx_warns(cpuinfo: Path, caplog: pytest.LogCaptureFixture) -> None:
    cpuinfo.write_text(f"processor\t: 0\nvendor_id\t: GenuineIntel\n{FLAGS} avx512f avx512_bf16\n")
    assert cpu_native_bf16(cpuinfo) is True  # it has bf16 instructions, but they lose to fp32 here
    with caplog.at_level(logging.WARNING, logger=precision_mod.__name__):
        assert resolve_compute_dtype("bf16", CPU, cpuinfo=cpuinfo) == BF16  # asked for: kept
    assert len(caplog.records) == 1
    assert "avx512_bf16 but no amx_bf16 (bf16 matmuls slower than fp32 there)" in caplog.records[0].getMessage()


@pytest.mark.parametrize(("vendor", "flag"), [("AuthenticAMD", "avx512_bf16"), ("GenuineIntel", "amx_bf16")])
def test_bf16_where_it_is_faster_and_on_an_unknown_cpu_does_not_warn(
    vendor: str, flag: str, cpuinfo: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cpuinfo.write_text(f"processor\t: 0\nvendor_id\t: {vendor}\n{FLAGS} {flag} avx512f\n")
    assert cpu_native_bf16(cpuinfo) is True
    missing = tmp_path / "no-such-file"
    assert cpu_native_bf16(missing) is None
    with caplog.at_level(logging.WARNING, logger=precision_mod.__name__):
        assert resolve_compute_dtype("bf16", CPU, cpuinfo=cpuinfo) == BF16
        assert resolve_compute_dtype("bf16", CPU, cpuinfo=missing) == BF16
    assert not caplog.records


@dataclass
class _Step:
    compute: torch.dtype
    seen: set[tuple[str, str, str]]  # (model/Linear, weight dtype, output dtype) of each hooked call
    kept: set[torch.dtype]  # parameters of both models, the actor's gradients and optimizer state
    log_probs: torch.Tensor  # before the step, response tokens only
    metrics: dict[str, float]


def _one_step(param_dtype: str) -> _Step:
    """One single-process KL-loss step (2 mini-batches) from the same weights and batch."""
    s = settings(param_dtype=param_dtype, use_kl_loss=True, entropy_coeff=0.01)
    learner = Learner(s, START, local_context(CPU), tiny_policy)
    assert learner.ref is not None
    seen: set[tuple[str, str, str]] = set()

    def record(tag: str, m: nn.Module, out: torch.Tensor) -> None:
        seen.add((tag, str(m.weight.dtype), str(out.dtype)))

    for role, model in (("actor", learner.model), ("ref", learner.ref)):
        for name in ("model.layers.0.self_attn.o_proj", "lm_head"):
            tag = f"{role}/{name}"
            model.get_submodule(name).register_forward_hook(lambda m, i, o, tag=tag: record(tag, m, o))
    kept: set[torch.dtype] = {p.dtype for m in (learner.model, learner.ref) for p in m.parameters()}
    learner.actor.grad_hook = lambda m: kept.update(p.grad.dtype for p in m.parameters() if p.grad is not None)
    groups, prompts = scripted_groups(4, 4, seed=31)
    batch = learner.collate(groups, prompts)
    log_probs = learner._log_probs(learner.model, batch)[batch.response_mask.bool()]
    metrics = learner.train_step(groups, prompts)
    kept |= {v.dtype for st in learner.actor.optimizer.state.values() for v in st.values() if torch.is_tensor(v)}
    return _Step(learner.compute_dtype, seen, kept, log_probs, metrics)


def test_single_process_bf16_step_autocasts_keeps_fp32_masters_and_tracks_fp32() -> None:
    fp32, bf16 = _one_step("fp32"), _one_step("bf16")
    assert (fp32.compute, bf16.compute) == (FP32, BF16)
    tags = {f"{role}/{name}" for role in ("actor", "ref") for name in ("model.layers.0.self_attn.o_proj", "lm_head")}
    # fp32: the Linears of the actor and the reference compute in fp32; bf16: autocast runs them in bf16 (their
    # output) while their weights stay fp32 (the reference follows the actor)
    assert fp32.seen == {(tag, "torch.float32", "torch.float32") for tag in tags}
    assert bf16.seen == {(tag, "torch.float32", "torch.bfloat16") for tag in tags}
    for r in (fp32, bf16):
        assert r.kept == {FP32} and r.log_probs.dtype == FP32
        assert all(math.isfinite(v) for v in r.metrics.values())
    # bf16 log-probs differ from fp32 ones (so it really ran in bf16) by about bf16's rounding (|log p| ~ 4.2 here;
    # seen: mean 5e-4, max 1.7e-3)
    diff = (fp32.log_probs - bf16.log_probs).abs()
    assert 1e-5 < float(diff.mean()) < 5e-3 and float(diff.max()) < 2e-2
    for key in ("learner/actor/pg_loss", "learner/actor/kl_loss", "learner/actor/entropy", "learner/actor/loss"):
        assert bf16.metrics[key] == pytest.approx(fp32.metrics[key], rel=0.02, abs=1e-4), key


@pytest.mark.parametrize(("param_dtype", "flags"), [("bf16", [True, False]), ("fp32", [True, True])])
def test_checkpoint_interval_auto_checkpoints_every_third_layer_in_bf16_and_every_layer_in_fp32(
    param_dtype: str, flags: list[bool], caplog: pytest.LogCaptureFixture
) -> None:
    """``model.gradient_checkpointing_interval: auto`` by the compute dtype: on the tiny policy's 2 decoder layers,
    every third is layer 0 only."""
    cfg = settings(param_dtype=param_dtype, enable_gradient_checkpointing=True, gradient_checkpointing_interval="auto")
    with caplog.at_level(logging.INFO, logger="async_rl.learner.step"):
        learner = Learner(cfg, START, local_context(CPU), tiny_policy)
    assert [layer.gradient_checkpointing for layer in learner.actor.model.model.layers] == flags
    every = 3 if param_dtype == "bf16" else 1
    assert f"every {every} decoder layer(s) (auto: the learner computes in {param_dtype})" in caplog.text
