"""LoRA on the real vLLM CPU engine: adapters arrive over the weight sync, each version is its own adapter, a request
keeps the adapter it started under, old adapters go, and vLLM's log-probs match the learner's LoRA model."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from async_rl.actor.engine import GenerationEngine, lora_engine_kwargs
from async_rl.config import default_config
from async_rl.config.resolve import engine_start
from async_rl.models.tiny import build_tiny_model
from async_rl.peft_format import LoRASpec, adapter_config
from async_rl.transport.protocol import GroupSampling, WeightSyncPlan
from async_rl.weight_sync import vllm_engine_kwargs
from async_rl.weight_sync.client import AsyncEngineWeightSync
from async_rl.weight_sync.group import resolve_backend
from async_rl.weight_sync.membership import JoinInfo

pytestmark = pytest.mark.slow
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

SENDER = Path(__file__).resolve().parents[1] / "weight_sync" / "sender_proc.py"
REPO = Path(__file__).resolve().parents[2]
RANK = 8
PROMPT = [5, 6, 14, 11, 18]
TARGETS = ("down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj")
CONFIG = adapter_config(LoRASpec(rank=RANK, alpha=2.0 * RANK, target_modules=TARGETS), TARGETS)


def _sender_module() -> Any:
    spec = importlib.util.spec_from_file_location("lora_sender_proc", SENDER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def engine(tmp_path_factory, loop):
    path = build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=3)
    cfg = default_config()
    r = cfg.actor_rollout_ref.rollout
    r.dtype, r.max_model_len, r.max_num_seqs, r.enforce_eager = "float32", 128, 32, True
    cfg.trainer.seed = 0
    cfg.actor_rollout_ref.model.lora_rank = RANK
    start = engine_start(cfg, model_path=str(path), device_type="cpu")
    assert start.max_loras == 3  # K = 1
    eng = GenerationEngine(cfg, start, extra_engine_kwargs=vllm_engine_kwargs())
    loop.run_until_complete(eng.start())
    yield eng, path
    loop.run_until_complete(eng.shutdown())


VERSIONS = (1, 2, 3)  # one learner stand-in sends the adapters of these versions, one update each, in order


@pytest.fixture(scope="module")
def sync(engine, loop):
    """The engine in a weight-sync group with one sender process that sends the adapter of each of VERSIONS."""
    eng, model_dir = engine
    cmd = [sys.executable, str(SENDER), "--model", str(model_dir), "--mode", "lora", "--lora-rank", str(RANK)]
    cmd += ["--versions", ",".join(map(str, VERSIONS)), "--timeout", "120"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("PORT "), f"sender did not start: {line!r}"
    plan = WeightSyncPlan(
        host="127.0.0.1", port=int(line.split()[1]), backend=resolve_backend(backend="auto"), timeout_s=120.0,
        join_timeout_s=10.0, version=-1, epoch=0, candidates=(),
    )  # fmt: skip
    client = AsyncEngineWeightSync(eng.vllm, verify_rotation=1)
    loop.run_until_complete(client.join(JoinInfo(plan=plan, world_size=2, rank_offset=1)))
    yield client
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0 and out.count("REPORT") == len(VERSIONS), out


async def _update(eng: GenerationEngine, sync: AsyncEngineWeightSync, version: int) -> None:
    async def load() -> None:
        report = await sync.update_adapter(version, eng.adapter_dir(version), CONFIG)
        assert report["tensors"] == 28  # A and B of 7 projections x 2 layers, nothing else travels

    await eng.update_weights(version, load, "inflight")


def _reference_logprobs(model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    ids = torch.tensor([PROMPT + tokens])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), dim=-1)
    positions = torch.arange(len(PROMPT) - 1, len(PROMPT) + len(tokens) - 1)
    return logp[positions, torch.tensor(tokens)]


def test_versions_are_served_as_adapters_that_match_the_learners_model(engine, sync, loop) -> None:
    eng, model_dir = engine
    sender = _sender_module()
    sampling = GroupSampling.defaults(n=4, temperature=1.0, max_tokens=16, seed=11)
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    base_out = loop.run_until_complete(eng.generate(PROMPT, sampling))
    assert eng.version == 0 and eng.adapters_loaded == []  # before any update the base model serves
    for comp in base_out:
        want = _reference_logprobs(base, comp.token_ids.tolist())
        assert torch.allclose(torch.tensor(comp.logprobs, dtype=torch.float64), want, atol=2e-4, rtol=0)
    for version in (1, 2):
        loop.run_until_complete(_update(eng, sync, version))
        outs = loop.run_until_complete(eng.generate(PROMPT, sampling))
        reference = sender.lora_model(str(model_dir), version, RANK)
        for comp in outs:
            assert comp.min_version == comp.max_version == version
            tokens = comp.token_ids.tolist()
            want = _reference_logprobs(reference, tokens)
            got = torch.tensor(comp.logprobs, dtype=torch.float64)
            assert torch.allclose(got, want, atol=2e-4, rtol=0), (got - want).abs().max()
            # the same tokens are far less likely under the base: the adapter is what served them
            assert float((_reference_logprobs(base, tokens) - want).abs().max()) > 1e-2
        # the served-weights probe computes what the learner's model does (what ServedCheck compares)
        probe_ids = PROMPT + outs[0].token_ids.tolist()
        served = torch.tensor(loop.run_until_complete(eng.probe(probe_ids)), dtype=torch.float64)
        with torch.no_grad():
            logits = reference(input_ids=torch.tensor([probe_ids])).logits[0, :-1].double()
        expect = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(probe_ids[1:])[:, None])[:, 0]
        assert torch.allclose(served, expect, atol=2e-4, rtol=0), (served - expect).abs().max()
        # the previous version's adapter and its directory are gone once nothing runs under it
        assert eng.adapters_loaded == [version]
        assert not Path(eng.adapter_dir(version - 1)).exists() and Path(eng.adapter_dir(version)).is_dir()


def test_a_running_request_keeps_its_adapter_across_an_update(engine, sync, loop) -> None:
    eng, _ = engine
    while eng.version < 2:  # run alone: serve an adapter first
        loop.run_until_complete(_update(eng, sync, eng.version + 1))
    old = eng.version
    long = GroupSampling.defaults(n=16, temperature=1.0, max_tokens=110, seed=5)

    async def run() -> tuple[list[Any], list[int], int, list[float]]:
        task = asyncio.ensure_future(eng.generate(PROMPT, long))
        while not eng.inflight:
            await asyncio.sleep(0)
        # hold the request (the tiny model is done in a blink) so that the update surely lands while it runs; the
        # LoRA update itself neither pauses nor resumes
        await eng.vllm.pause_generation(mode="keep", clear_cache=False)
        await _update(eng, sync, old + 1)
        during, inflight = eng.adapters_loaded, eng.inflight
        # a served-weights probe (prompt log-probs, new adapter) batched with the old adapter's request: vLLM's own
        # CPU LoRA ops crash the engine on this mix (seen in a real run), the grouped kernels do not
        probe = asyncio.ensure_future(eng.probe(PROMPT * 4))
        await eng.vllm.resume_generation()
        return await task, during, inflight, await probe

    outs, during, inflight, probe = loop.run_until_complete(run())
    assert len(probe) == 4 * len(PROMPT) - 1 and all(-30 < v <= 0 for v in probe)
    assert inflight == 1
    assert all(c.min_version == c.max_version == old for c in outs)
    assert during == [old, old + 1]  # the old adapter stayed while its request ran
    assert eng.adapters_loaded == [old + 1] and eng.version == old + 1


def test_engine_arguments_round_the_rank_up_to_vllms() -> None:
    assert lora_engine_kwargs(0, 3) == {}
    assert lora_engine_kwargs(4, 3) == {"enable_lora": True, "max_lora_rank": 8, "max_loras": 3, "max_cpu_loras": 3}
    assert lora_engine_kwargs(33, 2)["max_lora_rank"] == 64
    with pytest.raises(ValueError, match="largest max_lora_rank"):
        lora_engine_kwargs(600, 2)
