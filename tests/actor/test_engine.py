"""GenerationEngine on the real vLLM CPU build with a tiny model built in the test."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest
import torch

from async_rl.actor.engine import EngineSettings, GenerationEngine, SamplingSpec
from async_rl.models.tiny import build_tiny_model

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def engine(tmp_path_factory, loop):
    path = build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=3)
    eng = GenerationEngine(
        EngineSettings(model_path=str(path), dtype="float32", max_model_len=128, enforce_eager=True, seed=0)
    )
    loop.run_until_complete(eng.start())
    yield eng, path
    loop.run_until_complete(eng.shutdown())


def test_n_completions_with_one_logprob_per_token(engine, loop):
    eng, _ = engine
    spec = SamplingSpec(n=4, temperature=1.0, max_tokens=12, seed=7)

    async def run():
        return await asyncio.gather(*[eng.generate([5, 6, 7, 8 + i], spec) for i in range(6)])

    groups = loop.run_until_complete(run())
    assert len(groups) == 6
    for group in groups:
        assert len(group) == 4
        for comp in group:
            assert comp.token_ids.dtype == np.int32 and comp.logprobs.dtype == np.float32
            assert 0 < len(comp.token_ids) == len(comp.logprobs) <= 12
            assert np.all(comp.logprobs <= 0.0) and np.all(np.isfinite(comp.logprobs))
            assert comp.finish_reason in ("length", "stop")
            assert (comp.min_version, comp.max_version) == (0, 0)
    assert eng.stats.completions >= 24 and eng.inflight == 0


def test_processed_logprobs_are_the_sampling_distribution(engine, loop):
    """At temperature 0.7 the behaviour log-prob of each token equals log_softmax(logits / 0.7) from transformers."""
    from transformers import AutoModelForCausalLM

    eng, path = engine
    prompt = [9, 10, 11, 12, 13]
    comp = loop.run_until_complete(eng.generate(prompt, SamplingSpec(n=1, temperature=0.7, max_tokens=10, seed=1)))[0]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor([prompt + comp.token_ids.tolist()])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1]
    expected = torch.log_softmax(logits / 0.7, dim=-1).gather(-1, torch.from_numpy(comp.token_ids).long()[:, None])
    np.testing.assert_allclose(comp.logprobs, expected[:, 0].numpy(), atol=1e-4)


def test_inflight_update_keeps_running_requests_and_records_span(engine, loop):
    eng, _ = engine
    spec = SamplingSpec(n=2, temperature=1.0, max_tokens=48, seed=3)
    loaded = []

    async def fake_load():
        loaded.append(eng.version)
        await asyncio.sleep(0.05)

    async def run():
        tasks = [asyncio.ensure_future(eng.generate([20, 21, 22 + i], spec)) for i in range(4)]
        while eng.stats.generated_tokens == 0 and eng.inflight < 4:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        await eng.update_weights(1, fake_load, mode="inflight")
        return await asyncio.gather(*tasks)

    start_completions = eng.stats.completions
    groups = loop.run_until_complete(run())
    assert loaded == [0] and eng.version == 1 and eng.stats.updates == 1
    comps = [c for g in groups for c in g]
    assert len(comps) == 8 and eng.stats.completions - start_completions == 8  # nothing dropped
    assert all(c.min_version == 0 for c in comps)
    assert any(c.max_version == 1 for c in comps)  # at least one completion spans the update
    for c in comps:
        assert len(c.token_ids) == len(c.logprobs) and np.all(np.isfinite(c.logprobs))

    with pytest.raises(ValueError, match="older than"):
        loop.run_until_complete(eng.update_weights(0, fake_load, mode="inflight"))
    with pytest.raises(ValueError, match="update mode"):
        loop.run_until_complete(eng.update_weights(2, fake_load, mode="later"))  # type: ignore[arg-type]
