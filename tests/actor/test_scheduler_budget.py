"""vLLM scheduler settings: chunked prefill is off on CPU (seeded chunked prefills crash vLLM's CPU build)."""

from __future__ import annotations

from typing import Any

from async_rl.actor.engine import scheduler_budget
from async_rl.config import default_config
from async_rl.config.actor_rollout_ref import RolloutConfig


def rollout(**changes: Any) -> RolloutConfig:
    """The config's rollout section with ``changes``."""
    r = default_config().actor_rollout_ref.rollout
    for name, value in changes.items():
        assert name in RolloutConfig.__struct_fields__, name
        setattr(r, name, value)
    return r


def test_chunked_prefill_is_turned_off_on_cpu_and_the_budget_fits_a_whole_prompt() -> None:
    r = rollout(max_model_len=2048, enable_chunked_prefill=True, max_num_batched_tokens=1024)
    assert scheduler_budget(r, on_cpu=True) == (False, 2048)
    many = rollout(max_model_len=128, max_num_seqs=1024, max_num_batched_tokens=512)
    assert scheduler_budget(many, on_cpu=True) == (False, 1024)  # vLLM needs >= one token per sequence
    big = rollout(max_model_len=512, max_num_batched_tokens=8192)
    assert scheduler_budget(big, on_cpu=True) == (False, 8192)


def test_gpu_settings_pass_through() -> None:
    r = rollout(max_model_len=2048, enable_chunked_prefill=True, max_num_batched_tokens=1024)
    assert scheduler_budget(r, on_cpu=False) == (True, 1024)
    off = rollout(max_model_len=2048, enable_chunked_prefill=False, max_num_batched_tokens=512)
    assert scheduler_budget(off, on_cpu=False) == (False, 2048)
