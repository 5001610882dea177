"""The engine's settings and its sampling (``GroupSampling``, the wire's struct) come from the typed config: each field
changes with its key (no vLLM here)."""

from __future__ import annotations

import dataclasses

import pytest

from async_rl.actor.engine import EngineSettings
from async_rl.config import default_config, load_config
from async_rl.transport.protocol import GroupSampling, checked

RO = "actor_rollout_ref.rollout"


def test_every_engine_setting_comes_from_its_config_key() -> None:
    keys = {
        "tensor_parallel_size": (f"{RO}.tensor_model_parallel_size", 2),
        "dtype": (f"{RO}.dtype", "float32"),
        "max_model_len": (f"{RO}.max_model_len", 64),
        "gpu_memory_utilization": (f"{RO}.gpu_memory_utilization", 0.3),
        "max_num_seqs": (f"{RO}.max_num_seqs", 8),
        "enforce_eager": (f"{RO}.enforce_eager", False),
        "enable_prefix_caching": (f"{RO}.enable_prefix_caching", False),
        "enable_chunked_prefill": (f"{RO}.enable_chunked_prefill", False),
        "max_num_batched_tokens": (f"{RO}.max_num_batched_tokens", 512),
        "logprobs_mode": ("async_training.actor.logprobs_mode", "raw"),
        "seed": ("trainer.seed", 9),
        "lora_rank": ("actor_rollout_ref.model.lora_rank", 16),
    }
    default = EngineSettings.defaults("m")
    for name, (key, value) in keys.items():
        assert getattr(default, name) != value, name
        got = EngineSettings.from_config(load_config(None, [f"{key}={value}"]), model_path="m", extra_engine_kwargs={})
        assert getattr(got, name) == value, key
    assert set(keys) | {"model_path", "extra_engine_kwargs", "max_loras"} == {
        f.name for f in dataclasses.fields(EngineSettings)
    }
    # vLLM holds the current adapter, the K older ones a running request may still use, and the one being added
    lora = EngineSettings.from_config(
        load_config(None, ["async_training.max_staleness=3"]), model_path="m", extra_engine_kwargs={}
    )
    assert lora.max_loras == 3 + 2
    # the config's defaults, not the engine's own (they had drifted: 256 sequences, CUDA graphs on)
    r = default_config().actor_rollout_ref.rollout
    assert (default.max_num_seqs, default.enforce_eager) == (r.max_num_seqs, r.enforce_eager) == (1024, True)
    derived = EngineSettings.from_config(
        load_config(None, ["data.max_prompt_length=20"]), model_path="m", extra_engine_kwargs={}
    )
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
