"""LoRA through the launcher: a 2-rank FSDP2 learner trains an adapter on the frozen tiny model (KL loss against the
adapter-off base), only adapter tensors travel over the weight sync, the vLLM actor serves each version as its own
adapter, and the run exports the adapter (PEFT) and the merged model.

On-policy (K = 0), every group is sampled under the adapter of the version the learner trains, so the learner's
proximal log-probs equal the actor's behaviour log-probs up to fp32 noise: an actor that kept serving an old adapter
(or the base) would show as a large |log ratio| (the silent failure of verl #7495). Checks wiring, not learning.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from _e2e_helpers import ROOT, launcher_command, read_jsonl

STEPS = 6
RANK = 8


@pytest.mark.slow
def test_lora_run_syncs_adapters_only_serves_them_and_exports(tmp_path: Path, assert_nothing_lost) -> None:
    run_dir = tmp_path / "run"
    overrides = [
        f"actor_rollout_ref.model.lora_rank={RANK}",
        "actor_rollout_ref.model.lora_alpha=16",
        "actor_rollout_ref.actor.optim.lr=2e-3",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "async_training.max_staleness=0",
        f"custom_reward_function.path={Path(__file__).with_name('_digit_reward.py')}",  # gradients from step 1
        "async_training.weight_sync.timeout_s=120",
        # fp32 learner whatever the CPU (auto is bf16 where the CPU has it; the smoke config's rollout is float32):
        # behaviour and proximal log-probs then agree to fp32 noise, as asserted below, on every kind of host
        "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
    ]
    cmd = launcher_command("smoke_grpo.yaml", run_dir, steps=STEPS, overrides=overrides)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"launcher failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"

    metrics = [m for m in read_jsonl(run_dir / "metrics.jsonl") if "val/version" not in m]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    assert_nothing_lost(metrics)
    adapter_dir, merged_dir = run_dir / "final_adapter", run_dir / "final_hf"
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert config["r"] == RANK and config["lora_alpha"] == 16.0 and len(config["target_modules"]) == 7
    adapter_bytes = (adapter_dir / "adapter_model.safetensors").stat().st_size
    model_bytes = (merged_dir / "model.safetensors").stat().st_size
    for m in metrics:
        # only the adapter travels: its bytes (the file adds a small header), a small share of the model's
        assert 0.9 * adapter_bytes < m["sync/bytes"] <= adapter_bytes < 0.25 * model_bytes
        assert m["sync/actors"] == 1.0 and m["sync/failures"] == 0.0
        assert m["rollout/staleness_max"] == 0 and m["rollout/version_span_max"] == 0  # one adapter per request
        # the actor served the adapter of the version trained: behaviour == proximal up to fp32 noise
        assert m["learner/offpolicy/abs_log_ratio_mean"] < 1e-4, m["learner/offpolicy/abs_log_ratio_mean"]
    # the adapter starts as the base (step 1's second mini-batch has moved it a little) and moves away from it,
    # far more than the actor's and the learner's log-probs ever differ (seen: KL 4e-6 -> 0.015, |log ratio| 1e-7)
    kl = [m["learner/actor/kl_loss"] for m in metrics]
    assert kl[0] < 1e-4 and kl[-1] > 1e-3, kl
    assert all(m["learner/actor/grad_norm"] > 0 for m in metrics)
    actor_log = "\n".join(p.read_text() for p in run_dir.glob("**/actor*.log"))
    assert f"now on policy version {STEPS - 1}" in actor_log
    # after every update the actor checked its served adapter against the learner's probe log-probs, and it held
    summary = json.loads([line for line in actor_log.splitlines() if '"actor/served_checks"' in line][-1])
    assert summary["actor/served_checks"] >= STEPS and summary["actor/served_check_failures"] == 0
    assert summary["actor/served_check_diff"] < 1e-4
    # ... and the step lines show it while the run goes (from the actor's heartbeats), with the adapter version served
    checks = [m["transport/actors/served_checks_total"] for m in metrics]
    assert checks == sorted(checks) and checks[-1] >= STEPS // 2, checks  # reports lag by up to a second
    assert all(m["transport/actors/served_check_failures_total"] == 0 for m in metrics)
    assert metrics[-1]["transport/actors/loaded_version_max"] >= STEPS // 2

    # the exported adapter on the base model computes what the merged export does
    import peft
    from transformers import AutoModelForCausalLM

    base_dir = run_dir / "tiny-arith"  # where the launcher built the builtin model
    ids = torch.tensor([[3, 7, 12, 5, 9, 20]])
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(str(merged_dir), dtype=torch.float32)
        base = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
        base_logits = base(input_ids=ids).logits
        adapted = peft.PeftModel.from_pretrained(base, str(adapter_dir))
        want = merged(input_ids=ids).logits
        torch.testing.assert_close(adapted(input_ids=ids).logits, want, rtol=1e-4, atol=1e-5)
        assert float((want - base_logits).abs().max()) > 1e-4  # training moved the adapter
