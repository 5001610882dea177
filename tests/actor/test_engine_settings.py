"""The engine reads its config sections and its start-up values (``EngineStart``); its sampling (``GroupSampling``, the
wire's struct) comes from the typed config (no vLLM here)."""

from __future__ import annotations

import pytest

from async_rl.actor.engine import GenerationEngine
from async_rl.config import default_config, load_config
from async_rl.config.resolve import engine_start, max_loras, served_check_tolerance
from async_rl.transport.protocol import GroupSampling, checked

RO = "actor_rollout_ref.rollout"


def test_the_engine_keeps_the_config_sections_it_reads() -> None:
    cfg = load_config(None, [f"{RO}.max_num_seqs=8", "async_training.actor.logprobs_mode=raw", "trainer.seed=9"])
    start = engine_start(cfg, model_path="m", device_type="cpu")
    engine = GenerationEngine(cfg, start, extra_engine_kwargs={"x": 1})
    assert engine.rollout_cfg is cfg.actor_rollout_ref.rollout and engine.rollout_cfg.max_num_seqs == 8
    assert engine.actor_cfg.logprobs_mode == "raw" and engine.seed == 9
    assert engine.startup is start and engine.extra_engine_kwargs == {"x": 1}
    assert not engine.lora
    assert GenerationEngine(
        load_config(None, ["actor_rollout_ref.model.lora_rank=16"]), start, extra_engine_kwargs={}
    ).lora


def test_engine_start_resolves_what_the_config_leaves_to_the_host() -> None:
    cfg = load_config(None, ["async_training.max_staleness=3"])
    start = engine_start(cfg, model_path="/models/p", device_type="cuda")
    assert (start.model_path, start.dtype) == ("/models/p", "bfloat16")  # auto: bf16 on CUDA
    # vLLM holds the current adapter, the K older ones a running request may still use, and the one being added
    assert start.max_loras == max_loras(3) == 3 + 2
    fp32 = engine_start(load_config(None, [f"{RO}.dtype=float32"]), model_path="m", device_type="cuda")
    assert fp32.dtype == "float32"


def test_the_served_check_tolerance_follows_both_sides_precision_when_null() -> None:
    def tol(configured: float | None, rollout: str, learner: str) -> float:
        return served_check_tolerance(
            configured, rollout_dtype=rollout, device_type="cuda", param_dtype=learner, learner_device_type="cuda"
        )

    assert tol(0.5, "auto", "auto") == 0.5
    assert tol(None, "float32", "fp32") == 1e-3
    assert tol(None, "auto", "fp32") == 3e-2  # auto is bf16 on CUDA
    # bf16 on both sides: 0.065 apart at version 0 of the SmolLM2 LoRA recipe (Zen 4), where 3e-2 stopped the actor
    assert tol(None, "auto", "auto") == tol(None, "bfloat16", "bf16") == 0.15
    # a float32 engine next to a bf16 learner (what `auto` picks on a CPU with AMX): the probe differs by bf16
    # rounding, 1.04e-3 in a LoRA run on such a host, where 1e-3 stopped the actor for good
    assert tol(None, "float32", "bf16") == 3e-2
    assert tol(None, "float32", "auto") == 3e-2
    assert default_config().async_training.weight_sync.served_check_tolerance is None


def test_the_configs_engine_defaults() -> None:
    r = default_config().actor_rollout_ref.rollout
    assert (r.max_num_seqs, r.enforce_eager) == (1024, True)  # the config's (they had drifted: 256, CUDA graphs on)
    derived = load_config(None, ["data.max_prompt_length=20"]).actor_rollout_ref.rollout
    assert derived.max_model_len == 20 + default_config().data.max_response_length  # null = prompt + response


def test_group_sampling_comes_from_the_rollout_section() -> None:
    cfg = load_config(None, [f"{RO}.n=3", f"{RO}.temperature=0.5", f"{RO}.top_p=0.9", f"{RO}.top_k=5"])
    sampling = GroupSampling.from_config(cfg, seed=4)
    assert sampling == GroupSampling(
        n=3, temperature=0.5, top_p=0.9, top_k=5, max_tokens=cfg.data.max_response_length, seed=4
    )
    default = GroupSampling.defaults(n=2)
    assert (default.n, default.max_tokens, default.seed) == (2, default_config().data.max_response_length, None)
    with pytest.raises(TypeError, match="Missing required argument"):
        GroupSampling(n=1)  # type: ignore[call-arg]  # no defaults of its own: they live in the config
    with pytest.raises(ValueError, match=r"top_p"):
        checked(GroupSampling.defaults(top_p=1.5))  # the wire's constraints still hold
