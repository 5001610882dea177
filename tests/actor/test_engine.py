"""GenerationEngine on the real vLLM CPU build with a tiny model built in the test."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from async_rl.actor.engine import GenerationEngine
from async_rl.config import default_config
from async_rl.config.resolve import engine_start
from async_rl.models.tiny import build_tiny_model
from async_rl.transport.protocol import GroupSampling

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def engine(tmp_path_factory, loop):
    """One engine for the module (each start-up costs tens of seconds). Its step budget of 128 tokens makes every
    other 100-token prefill of the last test one that would be chunked; the other tests run at most 24 sequences."""
    path = build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=3)
    cfg = default_config()
    r = cfg.actor_rollout_ref.rollout
    r.dtype, r.max_model_len, r.max_num_batched_tokens, r.max_num_seqs = "float32", 128, 128, 32
    r.enable_chunked_prefill = True  # what the config asks for; the engine turns it off on CPU
    r.enforce_eager = True
    cfg.trainer.seed = 0
    eng = GenerationEngine(cfg, engine_start(cfg, model_path=str(path), device_type="cpu"), extra_engine_kwargs={})
    loop.run_until_complete(eng.start())
    yield eng, path
    loop.run_until_complete(eng.shutdown())


def test_n_completions_with_one_logprob_per_token(engine, loop):
    eng, _ = engine
    sampling = GroupSampling.defaults(n=4, temperature=1.0, max_tokens=12, seed=7)

    async def run():
        return await asyncio.gather(*[eng.generate([5, 6, 7, 8 + i], sampling) for i in range(6)])

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
    comp = loop.run_until_complete(
        eng.generate(prompt, GroupSampling.defaults(n=1, temperature=0.7, max_tokens=10, seed=1))
    )[0]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor([prompt + comp.token_ids.tolist()])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1]
    expected = torch.log_softmax(logits / 0.7, dim=-1).gather(-1, torch.from_numpy(comp.token_ids).long()[:, None])
    np.testing.assert_allclose(comp.logprobs, expected[:, 0].numpy(), atol=1e-4)


def test_inflight_update_keeps_running_requests_and_records_span(engine, loop):
    eng, _ = engine
    sampling = GroupSampling.defaults(n=2, temperature=1.0, max_tokens=48, seed=3)
    loaded = []

    async def fake_load():
        loaded.append(eng.version)
        await asyncio.sleep(0.05)

    async def run():
        tasks = [asyncio.ensure_future(eng.generate([20, 21, 22 + i], sampling)) for i in range(4)]
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


def test_a_failed_load_aborts_running_requests_and_keeps_vllm_paused_until_an_update_succeeds(engine, loop):
    """The one pause/resume path of a weight update, on vLLM itself: a load that raises (a transfer broken half-way
    leaves the model half loaded) aborts the running requests and leaves generation paused; a request submitted then
    waits, and runs once a later update succeeds."""
    eng, _ = engine
    sampling = GroupSampling.defaults(n=2, temperature=1.0, max_tokens=120, seed=11)
    old = eng.version

    async def broken_load():
        raise RuntimeError("the transfer broke half-way")

    async def good_load():
        await asyncio.sleep(0.01)

    async def run():
        tasks = [asyncio.ensure_future(eng.generate([40, 41, 42 + i], sampling)) for i in range(2)]
        while eng.inflight < 2:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        with pytest.raises(RuntimeError, match="half-way"):
            await eng.update_weights(old + 1, broken_load, mode="inflight")
        aborted = await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)
        assert eng.version == old
        late = asyncio.ensure_future(eng.generate([43, 44], GroupSampling.defaults(n=1, max_tokens=4, seed=1)))
        await asyncio.sleep(0.5)
        assert not late.done()  # paused: nothing is sampled from the half-loaded weights
        await eng.update_weights(old + 1, good_load, mode="drain")  # nothing left to drain: swaps at once, resumes
        return aborted, await asyncio.wait_for(late, timeout=30)

    aborted, late = loop.run_until_complete(run())
    reasons = [c.finish_reason for group in aborted for c in group]
    assert "abort" in reasons and set(reasons) <= {"abort", "stop"}  # what had not stopped on its own was aborted
    assert [(c.min_version, c.max_version) for c in late] == [(old, old + 1)] and len(late[0].token_ids) > 0
    assert eng.version == old + 1


class _FakeClient:
    """Stands in for the rollout client (unit test of the loop): grants a fixed list once, records what is sent."""

    def __init__(self, grants):
        self.grants = list(grants)
        self.sent = []
        self.shutdown_requested = False
        self.weight_sync = None
        self.eval_version = -1  # no validation round open
        self.report = {}

    def hello(self, loaded_version=0):
        return None

    def poll(self, timeout_s=0.0):
        return None

    def request_work(self, max_groups, loaded_version, timeout_s=0.0):
        out, self.grants = self.grants[:max_groups], self.grants[max_groups:]
        return out

    def send_group(self, group):
        self.sent.append(group)

    def wait_acked(self, timeout_s):
        return True


class _LengthScorer:
    def score(self, prompt, completion, ground_truth, extra=None):
        from async_rl.rewards import RewardResult

        return RewardResult(score=float(len(completion) > 0), components={"chars": float(len(completion))})


def test_loop_streams_each_group_as_soon_as_it_finishes(engine, loop):
    """Short groups reach the learner while a long group is still generating (not at the end of a batch)."""
    from async_rl.actor.loop import ActorLoop
    from async_rl.transport.protocol import PromptGrant, pack_array

    eng, _ = engine

    def grant(pid, max_tokens):
        return PromptGrant(
            prompt_id=pid,
            lease_id=pid + 1,
            min_version=0,
            prompt_token_ids=pack_array(np.asarray([30, 31, 32 + pid]), "<i4"),
            sampling=GroupSampling.defaults(n=3, temperature=1.0, max_tokens=max_tokens, seed=pid),
            extras={"prompt": "p", "ground_truth": "g"},
        )

    # Seeded sampling from the untrained tiny model (eos is one token of 64) makes the first group's longest
    # completion far longer than 2 tokens; the other groups stop at 2.
    client = _FakeClient([grant(0, 120), grant(1, 2), grant(2, 2), grant(3, 2)])
    actor = ActorLoop(
        actor_id="a0", client=client, engine=eng, scorer=_LengthScorer(), weight_sync=None,
        max_concurrent_groups=8, max_concurrent_eval=8, max_groups=4, update_mode="inflight",
    )  # fmt: skip
    stats = loop.run_until_complete(actor.run())
    assert stats.groups_sent == 4 and len(client.sent) == 4
    order = [g.prompt_id for g in client.sent]
    long_len = max(c.token_ids.length for c in client.sent[order.index(0)].completions)
    assert long_len > 10
    assert order[-1] == 0, order  # the three short groups were streamed while the long one was still generating
    for group in client.sent:
        assert len(group.completions) == 3
        for c in group.completions:
            assert c.token_ids.length == c.logprobs.length > 0
            assert c.reward_components is not None and "chars" in c.reward_components


def test_seeded_requests_whose_prefill_would_be_chunked_do_not_kill_the_engine(engine, loop):
    """Regression: vLLM's CPU build died with 'CPU Generator does not use offset' on the first seeded request whose
    prefill was split across steps (46-token prompts x 64 sequences with the real model). Here: 100-token prompts with
    the module engine's 128-token step budget, so every other prefill would be chunked. Samples must also stay
    reproducible."""
    eng, _ = engine
    assert eng.rollout_cfg.max_num_batched_tokens == 128 and eng.rollout_cfg.enable_chunked_prefill
    prompts = [[5 + (i * 7 + j) % 50 for j in range(100)] for i in range(12)]

    async def run(seed0: int):
        samplings = [
            GroupSampling.defaults(n=4, temperature=1.0, max_tokens=8, seed=seed0 + 4 * i) for i in range(len(prompts))
        ]
        return await asyncio.gather(*[eng.generate(p, s) for p, s in zip(prompts, samplings, strict=True)])

    first = loop.run_until_complete(run(100))
    again = loop.run_until_complete(run(100))
    assert not eng.dead
    assert [len(g) for g in first] == [4] * len(prompts)
    assert [[c.token_ids.tolist() for c in g] for g in first] == [[c.token_ids.tolist() for c in g] for g in again]


def test_a_cpu_engine_runs_its_model_in_its_engine_core_process(engine, loop):
    """No worker process (``async_rl.actor.vllm_launch``): the engine core runs vLLM's ``uni`` executor, with the
    OpenMP binding vLLM gives a worker, and the module's generation and weight-update tests ran on it."""
    eng, _ = engine
    assert eng.vllm.vllm_config.parallel_config.distributed_executor_backend == "uni"
    (core,) = eng.vllm.engine_core.resources.engine_manager.processes
    children = [p.name for p in Path("/proc").iterdir() if p.name.isdigit() and _parent(p) == core.pid]
    assert children == []
    assert os.sched_getaffinity(core.pid) == _worker_cpus(eng.vllm.vllm_config)


def _parent(proc: Path) -> int | None:
    try:
        stat = (proc / "stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rfind(")") + 2 :].split()[1])


def _worker_cpus(config) -> set[int]:
    """The CPUs vLLM binds its worker to here (VLLM_CPU_OMP_THREADS_BIND; ``auto``: all but one)."""
    from vllm.utils.ompmultiprocessing import OMPProcessManager

    return {int(c) for c in OMPProcessManager(config).cpu_lists[0]}


def test_shutdown_lets_the_engine_processes_exit_by_themselves(engine, loop):
    """Last in this module: it stops the module's engine. vLLM SIGTERMs its EngineCore and SIGKILLs it after 5 s; the
    EngineCore used to outlast that in the interpreter's teardown on every stop (exit code -9). With the quick exit
    (``async_rl.actor.vllm_exit``, armed for the suite in tests/conftest.py) it leaves on its own with code 0."""
    eng, _ = engine
    processes = list(eng.vllm.engine_core.resources.engine_manager.processes)
    assert [p.name for p in processes] == ["EngineCore"]
    loop.run_until_complete(eng.shutdown())
    assert [p.exitcode for p in processes] == [0]
