"""LoRA on the learner (single process): the adapter module against PEFT, targets, export, and training steps."""

from __future__ import annotations

from pathlib import Path

import peft
import pytest
import torch
from _learner_testlib import START, VOCAB, scripted_groups, settings, tiny_policy

from async_rl.learner import Learner, local_context
from async_rl.learner.export import export_adapter, export_hf
from async_rl.learner.lora import LoRALinear, adapters_disabled, apply_lora, lora_modules, merge_adapters
from async_rl.peft_format import LoRASpec, peft_name

SPEC = LoRASpec(rank=4, alpha=8.0, target_modules="all-linear")
IDS = torch.randint(1, VOCAB, (3, 11), generator=torch.Generator().manual_seed(7))


def _randomise_b(model: torch.nn.Module, seed: int = 1) -> None:
    """A trained-looking adapter: B is zero at initialisation, which would hide every mistake in B's path."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, m in lora_modules(model):
            m.lora_B.copy_(torch.randn(m.lora_B.shape, generator=g) * 0.05)


def _peft_twin(ours: torch.nn.Module, targets: list[str], rank: int, alpha: float) -> torch.nn.Module:
    """The same base model under PEFT, with our adapter's values copied in."""
    cfg = peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0, bias="none")
    twin = peft.get_peft_model(tiny_policy(), cfg)
    state = {k: v for k, v in ours.state_dict().items() if k.endswith((".lora_A", ".lora_B"))}
    with torch.no_grad():
        for name, p in twin.named_parameters():
            if "lora_" in name:
                module = name.removeprefix("base_model.model.").split(".lora_")[0]
                which = "lora_A" if ".lora_A." in name else "lora_B"
                p.copy_(state[f"{module}.{which}"])
    return twin


def test_fresh_adapter_changes_nothing_and_only_adapters_train() -> None:
    base, model = tiny_policy(), tiny_policy()
    adapted = apply_lora(model, SPEC, seed=0)
    # all-linear: the 7 projections of each of the 2 layers, never the output layer
    assert len(adapted) == 14 and "lm_head" not in adapted
    assert all(isinstance(model.get_submodule(n), LoRALinear) for n in adapted)
    torch.testing.assert_close(model(input_ids=IDS).logits, base(input_ids=IDS).logits, rtol=0, atol=0)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained == {f"{m}.{w}" for m in adapted for w in ("lora_A", "lora_B")}
    # base names are unchanged: the base model's state dict is a subset of the adapted one's
    assert set(base.state_dict()) <= set(model.state_dict())
    # the same seed gives the same adapter (every FSDP rank builds it before sharding)
    again = tiny_policy()
    apply_lora(again, SPEC, seed=0)
    assert all(torch.equal(again.state_dict()[k], v) for k, v in model.state_dict().items())


def test_targets_and_excludes_follow_peft_rules() -> None:
    model = tiny_policy()
    spec = LoRASpec(
        rank=2, alpha=2.0, target_modules=("q_proj", "v_proj"), exclude_modules=("layers.1.self_attn.v_proj",)
    )
    adapted = apply_lora(model, spec, seed=0)
    assert adapted == [
        "model.layers.0.self_attn.q_proj",
        "model.layers.0.self_attn.v_proj",
        "model.layers.1.self_attn.q_proj",
    ]
    with pytest.raises(ValueError, match="target_modules=.*matches no linear layer"):
        apply_lora(tiny_policy(), LoRASpec(rank=2, alpha=2.0, target_modules=("wq",)), seed=0)
    with pytest.raises(ValueError, match="all-linear"):
        LoRASpec(rank=2, alpha=2.0, target_modules="all")


def test_forward_and_gradients_match_peft() -> None:
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    ours = tiny_policy()
    apply_lora(ours, LoRASpec(rank=4, alpha=8.0, target_modules=tuple(targets)), seed=3)
    _randomise_b(ours)
    twin = _peft_twin(ours, targets, 4, 8.0)
    out_ours, out_twin = ours(input_ids=IDS).logits, twin(input_ids=IDS).logits
    torch.testing.assert_close(out_ours, out_twin, rtol=1e-5, atol=1e-5)
    assert float((out_ours - tiny_policy()(input_ids=IDS).logits).detach().abs().max()) > 1e-3  # the adapter acts
    out_ours.logsumexp(-1).mean().backward()
    out_twin.logsumexp(-1).mean().backward()
    grads_twin = {n: p.grad for n, p in twin.named_parameters() if p.grad is not None}
    checked = 0
    for name, module in lora_modules(ours):
        for which in ("lora_A", "lora_B"):
            theirs = grads_twin[f"base_model.model.{name}.{which}.default.weight"]
            grad = getattr(module, which).grad
            assert grad is not None and float(grad.abs().max()) > 0
            torch.testing.assert_close(grad, theirs, rtol=1e-4, atol=1e-7)
            checked += 1
    assert checked == 28
    # switched off, the adapter adds nothing: the frozen base model
    with adapters_disabled(ours):
        torch.testing.assert_close(ours(input_ids=IDS).logits, tiny_policy()(input_ids=IDS).logits, rtol=0, atol=0)


def _lora_learner(**overrides: object) -> Learner:
    return Learner(settings(lora=SPEC, **overrides), START, local_context(), tiny_policy)


def test_learner_trains_the_adapter_only_and_syncs_it_under_peft_names() -> None:
    learner = _lora_learner()
    base = {k: v.clone() for k, v in tiny_policy().state_dict().items()}
    opt_params = sum(p.numel() for g in learner.actor.optimizer.param_groups for p in g["params"])
    assert opt_params == sum(p.numel() for n, p in learner.model.named_parameters() if "lora_" in n)
    before = {k: v.clone() for k, v in learner.model.state_dict().items() if k.endswith(".lora_B")}
    for step in range(2):
        learner.train_step(*scripted_groups(4, 4, seed=50 + step, version=step))
    state = learner.model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in base.items())  # the base stays bit-identical
    assert all(float((state[k] - v).abs().max()) > 0 for k, v in before.items())  # every adapter moved
    synced = dict(learner.iter_weights(dtype=None))
    manifest = learner.weight_manifest(dtype=None)
    assert [s.name for s in manifest] == list(synced)
    assert len(synced) == 28 and all(n.startswith("base_model.model.") and n.endswith(".weight") for n in synced)
    assert torch.equal(
        synced[str(peft_name("model.layers.0.mlp.up_proj.lora_B"))], state["model.layers.0.mlp.up_proj.lora_B"]
    )


def test_reference_is_the_frozen_base_without_a_second_model() -> None:
    # one mini-batch per step, so step 1's KL is measured before any update
    learner = _lora_learner(use_kl_loss=True, kl_loss_coef=0.5, kl_loss_type="low_var_kl", ppo_mini_batch_size=4)
    assert learner.ref is None
    first = learner.train_step(*scripted_groups(4, 4, seed=60, version=0))
    assert first["learner/actor/kl_loss"] == pytest.approx(0.0, abs=1e-9)  # a fresh adapter: policy == base
    for step in range(1, 4):
        last = learner.train_step(*scripted_groups(4, 4, seed=60 + step, version=step))
    assert last["learner/actor/kl_loss"] > 1e-7


def test_exported_adapter_loads_in_peft_and_merged_export_matches(tmp_path: Path) -> None:
    learner = _lora_learner()
    for step in range(2):
        learner.train_step(*scripted_groups(4, 4, seed=70 + step, version=step))
    _randomise_b(learner.model, seed=9)  # a large adapter, so a wrong scaling or transpose shows
    config = learner.adapter_config("tiny")
    assert config is not None and config["r"] == 4 and config["lora_alpha"] == 8.0
    assert config["target_modules"] == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
    adapter_dir = export_adapter(learner.model, learner.ctx, tmp_path / "adapter", config)
    loaded = peft.PeftModel.from_pretrained(tiny_policy(), str(adapter_dir))
    learner.model.eval()
    with torch.no_grad():
        expect = learner.model(input_ids=IDS).logits
        torch.testing.assert_close(loaded(input_ids=IDS).logits, expect, rtol=1e-5, atol=1e-5)
        hf_dir = export_hf(learner.model, learner.ctx, tmp_path / "hf", dtype=None)
        from transformers import AutoModelForCausalLM

        merged = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
        assert not any("lora" in k for k in merged.state_dict())
        torch.testing.assert_close(merged(input_ids=IDS).logits, expect, rtol=1e-4, atol=1e-5)
        folded = merge_adapters(learner.model.state_dict(), SPEC.scaling)
        assert all(torch.equal(folded[k], v) for k, v in merged.state_dict().items() if k in folded)


def test_adapters_train_the_same_with_every_second_layer_checkpointed() -> None:
    """``gradient_checkpointing_interval`` (``auto`` gives 3 in bf16; the LoRA recipe inherits it) on a model whose
    linear layers are adapters: the layer flags follow the interval and the update is the one of full checkpointing."""
    trained = {}
    for interval in (1, 2):
        cfg = settings(lora=SPEC, enable_gradient_checkpointing=True, gradient_checkpointing_interval=interval)
        learner = Learner(cfg, START, local_context(torch.device("cpu")), tiny_policy)
        layers = learner.actor.model.model.layers
        assert [layer.gradient_checkpointing for layer in layers] == [True, interval == 1]
        learner.train_step(*scripted_groups(4, 4))
        trained[interval] = {
            n: p.detach().clone() for n, p in learner.actor.model.named_parameters() if p.requires_grad
        }
    assert trained[1] and trained[1].keys() == trained[2].keys()
    assert all(torch.equal(trained[1][n], trained[2][n]) for n in trained[1])
    assert any(not torch.equal(trained[1][n], torch.zeros_like(trained[1][n])) for n in trained[1] if "lora_B" in n)
